"""Planning a compare before anything is scored: one study config per (strategy, seed), whether each study may be
created or resumed, and the record of the search suite the robust studies train on."""

from __future__ import annotations

import json
from pathlib import Path

from promptopt.errors import UserError
from promptopt.study import SearchConfig, study_exists
from promptopt.study.config import redact
from promptopt.workflows.compare.evaluate import EvaluationStore

SEARCH_SUITE_FILE = "search_suite.json"


def seed_config(base: SearchConfig, entry, s: int, seeds: int, out: Path, storage: str) -> SearchConfig:
    """Seed 0 is the plain run (same study name, sampler seed and candidates as a one-seed compare);
    later seeds shift the sampler seed and draw other exemplar candidates from the pool. An entry with a
    decision rule (`accuracy@batch`) is a study of its own, named after the entry."""
    name, task = entry.name, Path(base.data.task).stem
    decision = {"strategy": entry.strategy, "decision": entry.decision}
    if seeds == 1:
        study_name = None if entry.decision is None else f"{task}-{entry.study_label}"
        return base.replace(**decision, out=str(out / name), storage=storage, study_name=study_name)
    return base.replace(
        **decision,
        out=str(out / name / f"seed{s}"),
        storage=storage,
        study_name=f"{task}-{entry.study_label}-seed{s}",
        seed=base.study.seed + 7919 * s,
        pool_draw=None if s == 0 else base.study.seed + s,
    )


def plan_studies(configs: dict, data, expand, out: Path, *, resume: bool) -> dict:
    """Each study's config with `resume` set to whether it exists, after checking every study (space,
    strategy, and for an existing one that it means the same thing). Without `resume`, a compare that has
    started in `out` (a study or an evaluation exists) is refused: nothing is scored before this."""
    exists = {key: study_exists(config, data, expand) for key, config in configs.items()}
    started = [configs[key].name for key, found in exists.items() if found]
    if not resume and (started or EvaluationStore.any_in(out / "evaluations")):
        what = (
            f"study '{started[0]}' exists in {redact(next(iter(configs.values())).storage_url)}"
            if started
            else f"{out / 'evaluations'} exists"
        )
        raise UserError(
            f"compare in {out} has already started ({what}): pass --resume to continue it, or choose another --out"
        )
    return {key: config.replace(resume=exists[key]) for key, config in configs.items()}


def search_suite_marker(out: Path, search_suite, *, resume: bool) -> dict:
    """A `robust` study does not record the suite it trained on, so the compare does (search_suite.json): a
    resumed compare must search with the suite it started with. Checked before anything is scored."""
    from promptopt.robustness.suite import suite_sha256

    mine = {"name": search_suite.name, "sha256": suite_sha256(search_suite)}
    path = out / SEARCH_SUITE_FILE
    if resume and path.is_file():
        theirs = json.loads(path.read_text(encoding="utf-8"))
        if theirs.get("sha256") != mine["sha256"]:
            raise UserError(
                f"compare in {out} searched the robust strategy under --search-suite {theirs.get('name')} with other "
                f"content (sha256 {str(theirs.get('sha256'))[:12]}, this one's {mine['sha256'][:12]}; before "
                f"promptopt hashed a suite's content alone it hashed its file's path too): resume it with the suite "
                f"it started with, or choose another --out"
            )
    return mine
