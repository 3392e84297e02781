"""What a study is, and whether a resume may join it: the fields a trial's value depends on, recorded
with the study and compared field by field when it is resumed."""

from __future__ import annotations

import json
from pathlib import Path

from promptopt.card import sha256_file
from promptopt.errors import UserError
from promptopt.study.config import SearchConfig, redact
from promptopt.study.context import SearchContext
from promptopt.study.storage import stored_study
from promptopt.tasks.item import items_sha256


def _file_sha256(where: str) -> str | None:
    return sha256_file(where) if Path(where).is_file() else None


def identity(ctx: SearchContext) -> dict:
    """What a trial's value depends on. A resumed study must match it field by field; the other settings
    (seed, which only seeds the sampler; minibatch and pruning, which only decide pruning; workers, batch
    size, device, budget, storage URL, test items) may change."""
    config = ctx.config
    fingerprint = getattr(ctx.expand, "fingerprint", None)  # a hand-made expander (a function) has none to record
    return {
        "task": ctx.data.spec.name,
        "task_file_sha256": _file_sha256(ctx.data.spec.where),
        "subsets": list(config.data.subsets or []),
        "dev_limit": config.data.dev_limit,
        "dev_items_sha256": items_sha256(ctx.dev),
        "pool_candidates_sha256": items_sha256(ctx.candidates),
        "strategy": config.study.strategy,
        "strategy_version": ctx.strategy.version,  # what the strategy's trial values mean (robust 2: multi-fidelity)
        "space_file_sha256": _file_sha256(ctx.space.where),
        # the suite whose variants a robust trial scores (the expander's own hash: search does not read suites)
        **({"search_suite_sha256": fingerprint()} if ctx.strategy.needs_variants and callable(fingerprint) else {}),
        # the one rule every trial decides by (a searched `decision:` dimension is in the space file's hash)
        **({"decision": config.study.decision} if config.study.decision is not None else {}),
        "model": config.model.spec,
        "dtype": config.model.resolved_dtype(),
        "quantize": config.model.quantize,
    }


def _legacy_identity(stored_config: dict) -> dict:
    """The comparable part of a study created before identities were recorded."""
    data, study, model = stored_config.get("data", {}), stored_config.get("study", {}), stored_config.get("model", {})
    return {
        "subsets": list(data.get("subsets") or []),
        "dev_limit": data.get("dev_limit"),
        "strategy": study.get("strategy"),
        "model": model.get("spec"),
        "quantize": model.get("quantize"),
    }


# Fields added to the identity after studies were first recorded, and what a study without them meant.
_ADDED = {"strategy_version": 1}


def check_resumable(name: str, stored: dict, current: dict) -> None:
    """Refuse to resume a study whose trial values meant something else, naming the first differing field."""
    stored = {**stored, **{k: v for k, v in _ADDED.items() if k in current and k not in stored}}  # after the others
    for key, then in stored.items():
        if key in current and current[key] != then:
            now = current[key]
            if key == "strategy_version":
                raise UserError(
                    f"--resume: study '{name}' was created with strategy_version={then!r} of strategy "
                    f"'{current.get('strategy')}' but this promptopt computes version {now!r} (see promptopt/study/"
                    "strategies.py), so its trial values would mean something else; start a new study (--out / --study-name)"
                )
            if key.endswith("_sha256"):
                then, now = str(then)[:12], str(now)[:12]
            raise UserError(
                f"--resume: study '{name}' was created with {key}={then!r} but this run has {key}={now!r}, so its trial "
                "values would mean something else; resume with the same settings, or start a new study (--out / --study-name)"
            )


def check_study(config: SearchConfig, storage, current: dict, *, repair: bool = True) -> bool:
    """Whether there is a study to join; one UserError if a new run would overwrite one, or a resumed one means
    something else. `--resume` never refuses for a kill, whenever it came: a study that does not exist (killed
    before its storage or its row was made) is started, and so is one whose creation was cut short (a row without
    its identity or any trial: killed between Optuna creating the study and the run recording what it is), after
    its row is deleted (`repair`; else it only counts as missing)."""
    stored = stored_study(config, storage)
    if stored is not None and half_created(stored):
        if repair:
            import optuna

            optuna.delete_study(study_name=config.name, storage=storage)
        stored = None
    if stored is not None and not config.study.resume:
        where = redact(config.storage_url)
        raise UserError(
            f"study '{config.name}' already exists in {where}: pass --resume to continue it, or choose another --out / --study-name"
        )
    if stored is not None:
        check_same_study(config, stored, current)
    return stored is not None


def half_created(stored) -> bool:
    """A study row whose creation was cut short: `open_study` records the config and identity right after Optuna
    creates the row, and no trial starts before that."""
    return "identity" not in stored.user_attrs and "config" not in stored.user_attrs and stored.n_trials == 0


def check_same_study(config: SearchConfig, stored, current: dict) -> None:
    """A stored study (summary) means what `current` means, else one UserError naming the first field."""
    attrs = stored.user_attrs
    then = (
        json.loads(attrs["identity"])
        if "identity" in attrs
        else _legacy_identity(json.loads(attrs.get("config", "{}")))
    )
    check_resumable(config.name, then, current)


def scrub_stored_config(study) -> None:
    """Studies created before passwords were redacted hold the storage URL in clear in their "config"
    attribute (shown by optuna-dashboard): rewrite it redacted when such a study is resumed."""
    raw = study.user_attrs.get("config")
    try:
        stored = json.loads(raw) if raw else None
        url = stored["study"]["storage"] if stored else None
    except (ValueError, KeyError, TypeError):
        return
    if url and redact(url) != url:
        stored["study"]["storage"] = redact(url)
        study.set_user_attr("config", json.dumps(stored))
