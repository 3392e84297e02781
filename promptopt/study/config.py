"""What a search run is, grouped as users think of it: the model, the data, the study.

Each group is a keyword-only frozen dataclass validated when it is built, so a bad value fails before
anything loads or any study row exists. `SearchConfig.build(**flat)` takes the flat names the CLI uses
(`task=`, `strategy=`, `device=` ...) and routes each to its group; `config.replace(**flat)` does the same
for a changed copy.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from promptopt.errors import ConfigError
from promptopt.models.load import ModelConfig
from promptopt.study.strategies import get_strategy
from promptopt.tasks.data import DataConfig

SCAN_MODES = ("advise", "stop", "off")
MAX_BUDGET_MINUTES = 60 * 24 * 30  # a month: a larger number is a typo (NaN and infinities are refused too)


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    """The Optuna study: what a trial is worth, how many, where they are stored, how they run."""

    strategy: str = "accuracy"  # the default the evidence supports (docs/search.md#strategies)
    trials: int = 20  # finished (complete or pruned) trials to reach
    seed: int = 1234
    pool_draw: int | None = None  # None: the first N pool items are the candidates; else a seeded draw
    space: str | None = None  # search space YAML; default: the task's built-in space
    storage: str | None = None  # Optuna storage URL; default: SQLite in the run directory
    study_name: str | None = None  # default: <task>-<strategy>
    resume: bool = False
    n_workers: int = 1
    minibatch: int = 16  # dev items per pruning step
    pruning: bool = True
    # one decision rule for every trial (promptopt/decision.py: argmax, contextual, batch, batch-adaptive, affine, pmi);
    # None: the space's `decision:` dimension if it has one, else argmax
    decision: str | None = None
    # how the winner is chosen among the trials dev cannot tell apart (metrics/stats/selection.py TIE_BREAKS);
    # None: the strategy's own (accuracy: `stability`). Not part of the study's identity: it reads finished trials.
    tie_break: str | None = None
    heartbeat_interval: int = 20
    grace_period: int = 60
    # the prompt the user has (study/incumbent.py): `default` (the task's), a card's path, or `none` (the strategies'
    # own winners, as the δ_TCB paper compared them). A searched prompt replaces it only if it beats it on dev, paired.
    incumbent: str = "default"
    # the sensitivity scan before the trials (study/scan.py): `advise` says whether searching can pay and goes on,
    # `stop` also ends the search there unless its verdict is `search`, `off` skips it
    scan: str = "advise"
    budget_minutes: float | None = None  # a time budget beside `trials`: no trial starts after it (None: trials only)

    def __post_init__(self) -> None:
        get_strategy(self.strategy)
        for name in ("trials", "n_workers", "minibatch", "heartbeat_interval", "grace_period"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}: expected a positive integer, got {value!r}")
        from promptopt.study.incumbent import check_incumbent

        check_incumbent(self.incumbent)
        if self.scan not in SCAN_MODES:
            raise ConfigError(f"scan: expected one of {', '.join(SCAN_MODES)}, got {self.scan!r}")
        budget = self.budget_minutes
        if budget is not None and (
            isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= MAX_BUDGET_MINUTES
        ):
            raise ConfigError(
                f"budget_minutes: expected a number of minutes in (0, {MAX_BUDGET_MINUTES}], got {budget!r}"
            )
        if self.decision is not None:
            from promptopt.decision import parse_rule

            parse_rule(self.decision)  # a typo fails here, naming the rule
        if self.tie_break is not None:
            from promptopt.metrics.stats.selection import check_tie_break

            check_tie_break(self.tie_break)
        if self.study_name is not None and not re.fullmatch(r"[A-Za-z0-9_.:-]+", self.study_name):
            raise ConfigError(f"study_name: expected letters, digits, '_', '-', '.' or ':', got {self.study_name!r}")


_GROUPS = {"model": ModelConfig, "data": DataConfig, "study": StudyConfig}
_MODEL_ALIASES = {"model": "spec"}  # the flat name `model` is ModelConfig.spec


@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig
    study: StudyConfig = field(default_factory=StudyConfig)
    out: str = "runs/search"  # run directory
    batch_size: int | str = 16  # or "auto": the largest that fits (models/batch_size.py)

    def __post_init__(self) -> None:
        if self.batch_size != "auto" and (
            isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1
        ):
            raise ConfigError(f"batch_size: expected a positive integer or auto, got {self.batch_size!r}")

    # --- flat names ---------------------------------------------------------------------------------
    @classmethod
    def build(cls, **flat: Any) -> SearchConfig:
        """From flat keyword names (task=, strategy=, model=, device=, dev_limit=, out= ...)."""
        groups: dict[str, dict] = {name: {} for name in _GROUPS}
        top: dict[str, Any] = {}
        for key, value in flat.items():
            group, name = _route(key)
            (groups[group] if group else top)[name] = value
        return cls(**{g: _GROUPS[g](**kw) for g, kw in groups.items() if kw or g != "data"}, **top)

    def replace(self, **flat: Any) -> SearchConfig:
        changes: dict[str, dict] = {}
        top: dict[str, Any] = {}
        for key, value in flat.items():
            group, name = _route(key)
            if group:
                changes.setdefault(group, {})[name] = value
            else:
                top[name] = value
        updated = {g: dataclasses.replace(getattr(self, g), **kw) for g, kw in changes.items()}
        return dataclasses.replace(self, **updated, **top)

    def to_dict(self) -> dict:
        """Everything, secrets included: for worker processes (passed in memory), never for writing."""
        return asdict(self)

    def public_dict(self) -> dict:
        """What may be written or shown (config.json, the study's attributes): the storage password redacted."""
        data = asdict(self)
        if data["study"]["storage"]:
            data["study"]["storage"] = redact(data["study"]["storage"])
        return data

    @classmethod
    def from_dict(cls, data: dict) -> SearchConfig:
        groups = {g: _GROUPS[g](**data[g]) for g in _GROUPS}
        return cls(**groups, **{k: v for k, v in data.items() if k not in _GROUPS})

    # --- derived ------------------------------------------------------------------------------------
    @property
    def storage_url(self) -> str:
        """The URL to connect with (it may hold a password: print or write `redact(url)` instead)."""
        return self.study.storage or default_storage_url(self.out)

    @property
    def default_storage(self) -> bool:
        """Whether the study lives in the run directory's SQLite file (created only with the study)."""
        return self.study.storage is None

    @property
    def name(self) -> str:
        return self.study.study_name or f"{Path(self.data.task).stem}-{self.study.strategy}"

    def moved_to(self, path: str | Path, root: str | Path) -> SearchConfig:
        """These settings with the SQLite study file looked up where the run directory `path` is now: a run (or
        compare) directory that was copied or moved reads the study.db that came with it, not the one it was
        written beside. A storage outside the opened directory `root` (PostgreSQL, a shared SQLite file) stays."""
        import os

        written, now = Path(self.out).resolve(), Path(path).resolve()
        db = sqlite_path(self.storage_url)
        if db is None or written == now:
            return self
        moved = Path(os.path.normpath(now / os.path.relpath(db, written)))
        if not moved.is_relative_to(Path(root).resolve()):
            return self
        study = self.study if self.default_storage else dataclasses.replace(self.study, storage=f"sqlite:///{moved}")
        return dataclasses.replace(self, out=str(now), study=study)


def default_storage_url(run_dir: str | Path) -> str:
    """The SQLite file of a run directory: where its studies live unless a storage URL is given."""
    return f"sqlite:///{Path(run_dir).resolve() / 'study.db'}"


def sqlite_path(url: str) -> Path | None:
    """The database file of an SQLite storage URL (sqlite:///PATH), else None."""
    prefix = "sqlite:///"
    return Path(url[len(prefix) :]) if url.startswith(prefix) else None


def redact(url: str) -> str:
    """`url` with its password replaced by ***, whatever its shape: every URL that is printed or written goes
    through here. A malformed URL (`postgresql//user:pw@host`, `scheme:user:pw@host`, `user:pw@host`) is masked as
    well as a good one: what lies between the user name's `:` and the last `@` is the password, and so is a
    `password=` query value."""
    return _mask_userinfo(_QUERY_SECRET.sub(r"\1***", url))


def redact_text(text: str, url: str | None = None) -> str:
    """A message that may quote a storage URL (an error from SQLAlchemy or the driver): `url` and its password
    replaced wherever they appear, then every `user:password@` left in it masked."""
    text = _QUERY_SECRET.sub(r"\1***", text)
    if url:
        text = text.replace(url, redact(url))
        secret = _password(url)
        if len(secret) >= 3:
            text = text.replace(secret, "***")
    return _AT_TOKEN.sub(lambda m: _mask_userinfo(m.group()), text)


_QUERY_SECRET = re.compile(r"((?:^|[?&;\s])(?:password|passwd|pwd)\s*=\s*)[^&;#\s'\"]*", re.IGNORECASE)
_SCHEME = re.compile(r"[A-Za-z][\w+.-]*:/*")
_AT_TOKEN = re.compile(r"[^\s'\"<>()]*@[^\s'\"<>()]*")


def _split_userinfo(url: str) -> tuple[str, str, str]:
    """(what comes before the password, the password, the rest from the last `@`); no `@` or no `:` before it:
    no password."""
    at = url.rfind("@")
    if at < 0:
        return url, "", ""
    head = url[:at]
    scheme = _SCHEME.match(head)
    # `scheme:` is a scheme when slashes follow it or another `:` does (scheme:user:pw); else it is `user:`
    start = scheme.end() if scheme and (scheme.group().endswith("/") or ":" in head[scheme.end() :]) else 0
    user, colon, secret = head[start:].partition(":")
    if not colon:
        return url, "", ""
    return head[:start] + user + ":", secret, url[at:]


def _mask_userinfo(url: str) -> str:
    before, secret, rest = _split_userinfo(url)
    return before + "***" + rest if rest else url


def _password(url: str) -> str:
    return _split_userinfo(url)[1]


def _route(key: str) -> tuple[str | None, str]:
    if key in ("out", "batch_size"):
        return None, key
    if key in _MODEL_ALIASES:
        return "model", _MODEL_ALIASES[key]
    for group, cls in _GROUPS.items():
        if key in {f.name for f in fields(cls)}:
            return group, key
    raise ConfigError(f"unknown search setting '{key}'")
