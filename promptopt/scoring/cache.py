"""Per-item result cache keyed by (model, rendered prompt, item), as a wrapper around the scorer.

A configuration seen before — the same prompt card on the same item with the same model — costs nothing:
its row comes from a SQLite file (WAL mode, safe for several worker processes on one machine).
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from promptopt.errors import CacheError
from promptopt.prompts import Prompt
from promptopt.scoring.scorer import Scorer, ScoreResult, summarize
from promptopt.tasks import Item
from promptopt.tasks.item import item_content

# Bump when the key's layout changes or a scored row's meaning does (2: every scored Item field in the key,
# and acc_norm divides by the choice's own length as lm-eval does; 3: log-likelihood rows carry every choice's
# log-probabilities and both argmax decisions): rows cached under an older version are then never read.
KEY_VERSION = 3


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot store {type(value).__name__} in the result cache")


class ResultCache:
    """The SQLite file is opened at once when it exists (so a corrupt one is reported before any work) and
    created only on the first write (so a run that fails validation leaves no file behind)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self.hits = 0
        self.misses = 0
        if self.path.exists():
            with self._errors():
                self._db.execute("SELECT COUNT(*) FROM (SELECT 1 FROM results LIMIT 1)").fetchone()

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            new = not self.path.exists()
            try:
                with self._errors():
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute("PRAGMA synchronous=NORMAL")  # no fsync per write: see study/storage.py
                    conn.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, row TEXT NOT NULL)")
                    # critical hidden states (float32 little-endian bytes, never pickled), kept only when asked for
                    conn.execute("CREATE TABLE IF NOT EXISTS hidden (key TEXT PRIMARY KEY, state BLOB NOT NULL)")
            except CacheError:  # e.g. a full disk: a cache that could not be set up leaves no file
                for suffix in ("", "-wal", "-shm", "-journal") if new else ():
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)
                raise
            self._conn = conn
        return self._conn

    @contextmanager
    def _errors(self):
        """SQLite failures name the file; a damaged one can simply be deleted (it only caches scores)."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise CacheError(f"result cache {self.path}: {exc} (another process holds it)") from None
            if "disk is full" in str(exc) or "readonly" in str(exc):  # the disk's problem, not the file's
                raise CacheError(f"cannot write the result cache {self.path}: {exc}") from None
            raise CacheError(
                f"result cache {self.path} is unreadable ({exc}): delete it (it only holds cached scores) and run again"
            ) from None
        except (sqlite3.DatabaseError, json.JSONDecodeError) as exc:
            raise CacheError(
                f"result cache {self.path} is corrupt ({exc}): delete it (it only holds cached scores) and run again"
            ) from None

    def get_many(self, keys: list[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        if not keys or (self._conn is None and not self.path.exists()):
            self.misses += len(set(keys))
            return found
        with self._errors():
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for key, row in self._db.execute(f"SELECT key, row FROM results WHERE key IN ({marks})", chunk):
                    found[key] = json.loads(row)
        self.hits += len(found)
        self.misses += len(set(keys)) - len(found)
        return found

    def put_many(self, rows: dict[str, dict]) -> None:
        data = [(key, json.dumps(row, default=_plain)) for key, row in rows.items()]
        with self._errors():
            self._db.executemany("INSERT OR REPLACE INTO results (key, row) VALUES (?, ?)", data)

    def get_hidden(self, keys: list[str]) -> dict[str, np.ndarray]:
        """The stored critical hidden states of `keys` that have one (float32 vectors)."""
        found: dict[str, np.ndarray] = {}
        if not keys or (self._conn is None and not self.path.exists()):
            return found
        with self._errors():
            if not self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'hidden'").fetchone():
                return found  # a cache written before hidden states were kept
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for key, state in self._db.execute(f"SELECT key, state FROM hidden WHERE key IN ({marks})", chunk):
                    found[key] = np.frombuffer(state, dtype="<f4")
        return found

    def put_hidden(self, states: dict[str, np.ndarray]) -> None:
        data = [(key, np.ascontiguousarray(state, dtype="<f4").tobytes()) for key, state in states.items()]
        with self._errors():
            self._db.execute("CREATE TABLE IF NOT EXISTS hidden (key TEXT PRIMARY KEY, state BLOB NOT NULL)")
            self._db.executemany("INSERT OR REPLACE INTO hidden (key, state) VALUES (?, ?)", data)

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else math.nan

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class CachedScorer:
    """A Scorer with per-item caching, usable wherever a Scorer is (`score`, `lm`, `data`, `runner`).

    The key holds the model, the task's scoring settings, the whole prompt card and every scored Item
    field (`item_content`, not only its id): a perturbed variant never reuses the clean item's row, and an
    edited reference (`target` feeds the PPL columns of generative tasks) or test program is scored again."""

    def __init__(self, scorer: Scorer, cache: ResultCache, *, keep_hidden: bool = False) -> None:
        """keep_hidden: also store each scored row's critical hidden state (d float32 values per row: 2.3 KB on
        SmolLM2, 32 KB at d = 8192), so calibrated decisions' δ_TCB never needs another forward."""
        self.scorer, self.cache, self.keep_hidden = scorer, cache, keep_hidden
        lm, spec = scorer.lm, scorer.data.spec
        self._static = [
            lm.name,
            str(lm.model.dtype),
            lm.device.type,
            spec.name,
            spec.answer_type,
            spec.metric,
            spec.max_new_tokens,
            list(spec.stop),
            spec.extract,
            scorer.eps,
            # lm-eval's generate_until judging (filters, exact_match options): only where set, so the keys of tasks
            # without it stay what they were
            *([spec.judge_options] if spec.judge_options else []),
        ]

    @property
    def lm(self):
        return self.scorer.lm

    @property
    def data(self):
        return self.scorer.data

    @property
    def runner(self):
        return self.scorer.runner

    def key(self, prompt: Prompt, item: Item) -> str:
        card = prompt.to_card()
        card.pop("decision", None)  # rows are the scorer's, before any decision rule: every rule reads them
        blob = json.dumps([KEY_VERSION, self._static, card, item_content(item)], sort_keys=True, default=_plain)
        return hashlib.sha256(blob.encode()).hexdigest()

    def score(self, prompt: Prompt, items: list[Item]) -> ScoreResult:
        start = time.perf_counter()
        table, hidden = self._lookup(prompt, items, hidden=self.keep_hidden)
        return ScoreResult(table, summarize(table, wall_seconds=time.perf_counter() - start), hidden)

    def generate_answers(self, *args, **kwargs):
        return self.scorer.generate_answers(*args, **kwargs)

    def content_free_logprobs(self, *args, **kwargs):
        """The scorer's (kept in memory per (context, continuation) ids; cheap next to the rows cached here)."""
        return self.scorer.content_free_logprobs(*args, **kwargs)

    def judge(self, *args, **kwargs):
        return self.scorer.judge(*args, **kwargs)

    def check_fits(self, prompt: Prompt, items: list[Item]) -> None:
        self.scorer.check_fits(prompt, items)

    def score_table(self, prompt: Prompt, items: list[Item]) -> pd.DataFrame:
        return self._lookup(prompt, items, hidden=False)[0]

    def score_with_hidden(self, prompt: Prompt, items: list[Item]) -> tuple[pd.DataFrame, torch.Tensor | None]:
        """The per-item table and the critical hidden states (None for generative tasks); rows cached without
        their state are scored again once."""
        return self._lookup(prompt, items, hidden=True)

    def _lookup(self, prompt: Prompt, items: list[Item], *, hidden: bool) -> tuple[pd.DataFrame, torch.Tensor | None]:
        hidden = hidden and not self.data.spec.answer.generative
        keys = [self.key(prompt, item) for item in items]
        found = self.cache.get_many(keys)
        states = self.cache.get_hidden(keys) if hidden else {}
        missing = [item for item, key in zip(items, keys) if key not in found or (hidden and key not in states)]
        if missing:
            result = self.scorer.score(prompt, missing)
            fresh_keys = [self.key(prompt, item) for item in missing]
            fresh = dict(zip(fresh_keys, result.table.to_dict("records")))
            self.cache.put_many(fresh)
            found.update(fresh)
            if result.hidden is not None and (hidden or self.keep_hidden):
                fresh_states = {key: state.numpy() for key, state in zip(fresh_keys, result.hidden)}
                self.cache.put_hidden(fresh_states)
                states.update(fresh_states)
        table = pd.DataFrame([found[key] for key in keys])
        return table, (torch.from_numpy(np.stack([states[key] for key in keys])) if hidden else None)
