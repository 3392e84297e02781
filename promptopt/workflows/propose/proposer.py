"""Write new instructions with a model, filter them, remember them by content hash.

Every proposal is seeded: attempt j of a request draws its rows, tip and sampling seed from
(seed, mode, round, j), and each attempt is its own generation call, so the same command writes the same
proposals whatever the batch size. Attempts go on until `n` are accepted or 4·n + 8 were tried.

The result is cached under the hash of everything it depends on (mode, n, seed, round, proposer model and
its weights' fingerprint, the task's pool/dev/test items, the space's instructions, the history shown,
the suite `reflect` perturbs with, this module's version): a rerun or a `--resume` reads the same
proposals back instead of generating them again, so the space file, and the study identity that hashes
it, stay the same.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from promptopt import progress
from promptopt.card import sha256_json, sha256_text
from promptopt.errors import ConfigError, UserError
from promptopt.tasks.item import items_sha256
from promptopt.workflows.propose import requests
from promptopt.workflows.propose.filters import ProposalFilter, gold_strings, label_words, shingles
from promptopt.workflows.propose.requests import MODES, TIPS, Flip
from promptopt.workflows.propose.screen import SCREEN_ITEMS
from promptopt.yamlio import atomic_write_text

VERSION = 3  # bump when a meta-prompt, the cleaning or a filter changes what a request proposes
MAX_NEW_TOKENS = 96  # an instruction of up to ~80 words (the filter's limit) fits
SUMMARY_TOKENS = 64  # two sentences
TEMPERATURE, TOP_P = 0.7, 0.9
SUMMARY_ROWS, GROUNDING_ROWS, INDUCE_ROWS, HISTORY_SHOWN, FLIPS_SHOWN = 16, 3, 5, 8, 3
REFLECT_DEV_ITEMS = 48  # dev items the default prompt is perturbed on to find answers that change


@dataclass(frozen=True)
class ProposeRequest:
    """What to propose. `proposer`: a model spec (None: the task's model). `search_suite`: the families whose
    answer changes `reflect` shows (the search suite: a proposal never sees the judged, unseen families).
    `screen_items`: the dev minibatch screening scores the filtered proposals on (not part of the cache key of
    the proposals themselves: screening is cached on its own)."""

    n: int
    mode: str = "grounded"
    proposer: str | None = None
    seed: int = 0
    round: int = 0
    search_suite: str = "cheap"
    screen_items: int = SCREEN_ITEMS  # dev items screening scores each proposal on (0: no screening; propose/screen.py)

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ConfigError(f"--propose: expected a positive number of instructions, got {self.n!r}")
        if isinstance(self.screen_items, bool) or not isinstance(self.screen_items, int) or self.screen_items < 0:
            raise ConfigError(
                f"--screen-items: expected 0 (no screening) or a number of dev items, got {self.screen_items!r}"
            )
        if self.mode not in MODES:
            raise ConfigError(f"--propose-mode: expected one of {', '.join(MODES)}, got {self.mode!r}")


@dataclass
class Proposal:
    name: str
    text: str
    provenance: dict


@dataclass
class Proposals:
    accepted: list[Proposal]
    rejected: list[dict]  # {"text", "reason", "attempt", "provenance"} in the order they were written
    drops: dict[str, int]
    attempts: int
    key: str
    reused: bool = False  # read back from the cache
    task_summary: str | None = None  # grounded: what the proposer wrote about the task first
    seconds: float | None = None  # the proposer's wall time when it wrote them (kept in the cache)
    tokens: int | None = None  # tokens it generated
    screening: object = None  # screen.Screening: what the dev minibatch said of the texts the filters let through

    @property
    def screened(self) -> int:
        """How many proposals passed the filters and were screened (0 without screening)."""
        return len(self.screening.results) if self.screening is not None else 0

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "accepted": [asdict(p) for p in self.accepted],
            "rejected": self.rejected,
            "drops": self.drops,
            "attempts": self.attempts,
            "task_summary": self.task_summary,
            "seconds": self.seconds,
            "tokens": self.tokens,
        }

    @classmethod
    def from_json(cls, data: dict) -> Proposals:
        return cls(
            [Proposal(**p) for p in data["accepted"]],
            data["rejected"],
            data["drops"],
            data["attempts"],
            data["key"],
            reused=True,
            task_summary=data.get("task_summary"),
            seconds=data.get("seconds"),
            tokens=data.get("tokens"),
        )


@dataclass
class _Proposer:
    """The model that writes: its generation, tokenizer and identity."""

    lm: object
    runner: object
    spec: str
    sha256: str | None
    chat: bool = field(init=False)
    tokens: int = field(init=False, default=0)  # generated so far, and the seconds it took
    seconds: float = field(init=False, default=0.0)
    last_rate: float = field(init=False, default=0.0)  # tokens/s of the last reply

    def __post_init__(self) -> None:
        self.chat = self.lm.has_chat_template

    def write(
        self,
        request: requests.Request,
        *,
        seed: int | None,
        completion: bool = False,
        override=None,
        max_new_tokens: int = MAX_NEW_TOKENS,
    ) -> str:
        """One reply: sampled with `seed`, greedy with None. `completion` forces the plain-text form; `override`
        replaces the default stop (the end of the paragraph in chat, of the line in a completion)."""
        tok = self.lm.tokenizer
        if self.chat and not completion:
            text = tok.apply_chat_template(
                [{"role": "user", "content": request.chat}], tokenize=False, add_generation_prompt=True
            )
            ids, stop = tok(text, add_special_tokens=False)["input_ids"], ["\n\n"]
        else:
            ids, stop = tok(request.completion)["input_ids"], ["\n"]
        sampled = seed is not None
        started = time.perf_counter()
        gen = self.runner.generate(
            [ids],
            max_new_tokens=max_new_tokens,
            stop=stop if override is None else override,
            keep_hidden=False,
            temperature=TEMPERATURE if sampled else 0.0,
            top_p=TOP_P,
            seed=seed,
        )[0]
        spent = time.perf_counter() - started
        self.tokens, self.seconds = self.tokens + len(gen.tokens), self.seconds + spent
        self.last_rate = len(gen.tokens) / spent if spent > 0 else 0.0
        return gen.text


@dataclass(frozen=True)
class ProposerModel:
    """Which model writes and how it is loaded, known without loading it (the cache key needs no model)."""

    config: object  # models.ModelConfig
    sha256: str | None  # its weights' fingerprint (None: a hub id not in the local cache)
    own: bool  # the session's model: no second load

    @property
    def spec(self) -> str:
        return self.config.spec

    def key(self) -> dict:
        return {
            "proposer": self.spec,
            "proposer_sha256": self.sha256,
            "dtype": self.config.resolved_dtype(),
            "quantize": self.config.quantize,
            "device": self.config.resolved_device_type(),
        }


def proposer_model(session, spec: str | None) -> ProposerModel:
    """The session's model unless another spec is named (loaded like the task's model: device, dtype, quantize)."""
    from promptopt.workflows.fingerprint import model_fingerprint

    own = session.model_config
    config = own if spec is None or spec == own.spec else dataclasses.replace(own, spec=spec)
    config.check()
    try:
        sha = model_fingerprint(config.spec)["weights_sha256"]
    except Exception:  # a hub id not in the local cache has no fingerprint without a download
        sha = None
    return ProposerModel(config, sha, config is own)


def load_proposer(session, model: ProposerModel) -> _Proposer:
    if model.own:
        return _Proposer(session.lm, session.scorer.runner, model.spec, model.sha256)
    from promptopt.models.runner import Runner

    lm = model.config.load()
    return _Proposer(lm, Runner(lm, batch_size=session.factory.batch_size), model.spec, model.sha256)


def request_key(
    request: ProposeRequest, model: ProposerModel, session, instructions: dict, label_words, history: list | None
) -> str:
    """The hash of everything the proposals depend on (the cache key)."""
    data = session.data
    inputs = {
        "version": VERSION,
        "mode": request.mode,
        "n": request.n,
        "seed": request.seed,
        "round": request.round,
        **model.key(),
        "task": data.spec.name,
        "pool": items_sha256(data.pool),
        "dev": items_sha256(session.items("dev")),
        "test": items_sha256(session.items("test")),
        "instructions": sorted(instructions.values()),
        "label_words": sorted(label_words),
        "history": history,
    }
    if request.mode == "reflect":  # the flips come from the task's model on its default prompt
        from promptopt.robustness.suite import load_suite, suite_sha256

        task_model = session.model_config
        inputs["search_suite"] = suite_sha256(load_suite(request.search_suite))
        inputs["task_model"] = {
            "spec": task_model.spec,
            "dtype": task_model.resolved_dtype(),
            "quantize": task_model.quantize,
            "device": task_model.resolved_device_type(),
        }
        inputs["reflect_prompt"] = data.default_prompt().to_card()
    return sha256_json(inputs)


def propose(
    request: ProposeRequest,
    *,
    session,
    instructions: dict[str, str],
    template_label_words=(),
    history: list[tuple[str, str, float]] | None = None,
    cache_dir: Path | None = None,
) -> Proposals:
    """`n` new instructions for the session's task, beside `instructions` (the space's, name -> text).

    `history`: (name, text, dev accuracy) of scored instructions, for the `history` mode (required there).
    `cache_dir`: where proposals are remembered by content hash (None: not remembered)."""
    if request.mode == "history" and not history:
        raise UserError(
            "--propose-mode history: needs scored instructions (search --rounds, or propose scores the space's own)"
        )
    model = proposer_model(session, request.proposer)
    key = request_key(request, model, session, instructions, template_label_words, history)
    cached = Path(cache_dir) / f"{key[:24]}.json" if cache_dir is not None else None
    if cached is not None and cached.is_file():
        found = Proposals.from_json(json.loads(cached.read_text(encoding="utf-8")))
        if found.key == key:
            progress.step(f"{len(found.accepted)} proposals read back from {cached} (nothing generated)")
            return found  # the proposer is never loaded
    progress.step(f"loading the proposer {model.spec}" if not model.own else f"proposer: the task's model {model.spec}")
    result = _generate(
        request, load_proposer(session, model), session, instructions, template_label_words, history, key
    )
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cached, json.dumps(result.to_json(), indent=1, ensure_ascii=False))
    return result


def _generate(request, proposer: _Proposer, session, instructions, template_label_words, history, key) -> Proposals:
    from promptopt.robustness.suite import Similarity

    data = session.data
    pool = list(data.pool)
    if not pool:
        raise UserError(f"task {data.spec.name}: the exemplar pool is empty; proposals are grounded on pool rows")
    evaluated = [*session.items("dev"), *session.items("test")]
    screen = ProposalFilter(
        existing=list(instructions.values()),
        golds=gold_strings(evaluated),
        labels=label_words([*pool, *evaluated], template_label_words),
        similarity=Similarity(),
        quoted=shingles(i.question for i in evaluated),
    )
    mode_index = MODES.index(request.mode)
    task_summary, flips = None, []
    started = time.perf_counter()
    if request.mode == "grounded":
        progress.step(f"{proposer.spec} summarises the task from {SUMMARY_ROWS} pool rows (greedy)")
        rng = np.random.default_rng([request.seed, mode_index, request.round, 10**6])
        rows = _rows(rng, pool, SUMMARY_ROWS)
        task_summary = (
            requests.first_sentences(
                proposer.write(requests.summary(rows), seed=None, override=[], max_new_tokens=SUMMARY_TOKENS)
            )
            or "(no summary)"
        )
    if request.mode == "reflect":
        progress.step(f"finding dev answers that search suite '{request.search_suite}' changes (reflect)")
        flips = find_flips(session, request.search_suite)
        if not flips:
            raise UserError(
                f"--propose-mode reflect: no dev item of task {data.spec.name} changed its answer under search suite "
                f"'{request.search_suite}' with the default prompt; nothing to reflect on (try another mode)"
            )
    accepted, rejected, attempt = [], [], 0
    limit = 4 * request.n + 8
    while len(accepted) < request.n and attempt < limit:
        rng = np.random.default_rng([request.seed, mode_index, request.round, attempt])
        seed = int(rng.integers(2**31 - 1))
        provenance = {
            "mode": request.mode,
            "proposer": proposer.spec,
            "proposer_sha256": proposer.sha256,
            "seed": request.seed,
            "attempt": attempt,
            "round": request.round,
            "parents": [],
        }
        if request.mode == "induce":
            rows = _rows(rng, pool, INDUCE_ROWS)
            reply = proposer.write(requests.induce(rows), seed=seed, completion=True)
        elif request.mode == "grounded":
            rows, tip = _rows(rng, pool, GROUNDING_ROWS), list(TIPS)[int(rng.integers(len(TIPS)))]
            provenance["tip"] = tip
            reply = proposer.write(requests.grounded(task_summary, rows, tip), seed=seed)
        elif request.mode == "history":
            shown = sorted(history, key=lambda h: -h[2])[:HISTORY_SHOWN][::-1]  # the best ones, listed worst first
            rows = _rows(rng, pool, GROUNDING_ROWS)
            provenance["parents"] = [name for name, _, _ in shown]
            reply = proposer.write(requests.history([(text, value) for _, text, value in shown], rows), seed=seed)
        else:
            picked = [
                flips[i] for i in sorted(rng.choice(len(flips), size=min(FLIPS_SHOWN, len(flips)), replace=False))
            ]
            rows = [f.item for f in picked]
            provenance["perturbed_families"] = sorted({f.family for f in picked})
            reply = proposer.write(requests.reflect(picked), seed=seed)
        provenance["rows"] = [r.id for r in rows]
        text = requests.clean(reply, mode=request.mode)
        why = screen.admit(text)
        if why is None:
            accepted.append(Proposal(f"{request.mode}_{sha256_text(text)[:8]}", text, provenance))
        else:
            rejected.append({"text": text, "reason": why, "attempt": attempt, "provenance": provenance})
        attempt += 1
        progress.step(
            f"attempt {attempt} (at most {limit}): {len(accepted)} of {request.n} through the filters; "
            f"{proposer.last_rate:.1f} tokens/s; " + ("kept" if why is None else f"dropped: {why}")
        )
    return Proposals(
        accepted,
        rejected,
        dict(screen.drops),
        attempt,
        key,
        task_summary=task_summary,
        seconds=time.perf_counter() - started,
        tokens=proposer.tokens,
    )


def _rows(rng, pool: list, k: int) -> list:
    return [pool[i] for i in sorted(rng.choice(len(pool), size=min(k, len(pool)), replace=False))]


def _answer(table_row, item) -> str:
    pred = table_row["pred"]
    if item.choices is not None:
        try:
            return item.choices[int(pred)]
        except (TypeError, ValueError, IndexError):
            return str(pred)
    return str(pred)


def find_flips(session, suite_spec: str, limit: int = REFLECT_DEV_ITEMS) -> list[Flip]:
    """Dev items whose answer under the task's default prompt changes when the search suite perturbs them
    (found once per session: every reflect request of a session shows the same ones)."""
    memo = getattr(session, "flips", None)
    if memo is not None and (suite_spec, limit) in memo:
        return memo[(suite_spec, limit)]
    flips = _find_flips(session, suite_spec, limit)
    if memo is not None:
        memo[(suite_spec, limit)] = flips
    return flips


def _find_flips(session, suite_spec: str, limit: int) -> list[Flip]:
    from promptopt.robustness.perturb import OPERATORS
    from promptopt.robustness.suite import Similarity, load_suite, make_variants

    suite, scorer = load_suite(suite_spec), session.scorer
    prompt, dev = session.data.default_prompt(), session.items("dev")[:limit]
    by_id = {item.id: item for item in dev}
    clean = scorer.score(prompt, dev).table.set_index("item_id")
    context = {
        "pool": session.data.pool,
        "evaluated": set(by_id),
        "distractors": list(suite.distractors),
        "lm": scorer.lm,
        "runner": scorer.runner,
        "paraphrases": session.paraphrases,
    }
    similarity, flips = Similarity(), []
    for family in suite.families:
        if not OPERATORS[family.operator].changes_text:  # reflect shows text against text
            continue
        variants, _ = make_variants(suite, family, prompt, dev, context, similarity)
        if not variants:
            continue
        items = [v.item for v in variants]
        table = scorer.score(prompt, items).table
        for item, (_, after) in zip(items, table.iterrows()):
            before = clean.loc[item.id]
            if str(before["pred"]) != str(after["pred"]):
                original = by_id[item.id]
                flips.append(Flip(original, item, family.name, _answer(before, original), _answer(after, item)))
    return flips
