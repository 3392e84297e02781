"""One call per `promptopt diagnose` command: collect (or reuse) the inputs, run the analysis, write its
tables (Parquet + CSV) and figure (PNG) into the output folder, and say what was written and how long it
took. The CLI only parses and prints."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from promptopt import progress as steps
from promptopt.analyses.diagnose import approx, geometry, regimes
from promptopt.analyses.diagnose.positions import Positions, PositionSpec, collect_positions
from promptopt.yamlio import write_parquet_and_csv as save_table


@dataclass
class Report:
    result: object
    written: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    positions: Positions | None = None


def _positions(lm, spec: PositionSpec, out: Path, progress: bool) -> Positions:
    return collect_positions(lm, spec, cache_dir=out, progress=progress)


def run_geometry(
    lm, spec: PositionSpec, out: Path, *, k: int = 10, alpha: float = 0.5, beta: float = 0.5, progress: bool = False
) -> Report:
    start = time.perf_counter()
    positions = _positions(lm, spec, out, progress)
    steps.step(f"moving the {k} nearest competitors at {len(positions.frame)} positions (Table 2)")
    result = geometry.geometry_sensitivity(lm, positions, k=k, alpha=alpha, beta=beta)
    written = save_table(result.positions, out / "geometry_positions") + save_table(
        result.summary, out / "geometry_summary"
    )
    geometry.plot(result, out / "geometry.png")
    return Report(result, [*written, out / "geometry.png"], time.perf_counter() - start, positions)


def run_regimes(lm, spec: PositionSpec, out: Path, *, low_v_eff: float = 2.0, progress: bool = False) -> Report:
    start = time.perf_counter()
    positions = _positions(lm, spec, out, progress)
    steps.step("correlations and their intervals (Table 1)")
    result = regimes.regime_correlations(positions.frame, low_v_eff=low_v_eff)
    written = save_table(result.table, out / "regimes") + save_table(positions.frame, out / "regimes_positions")
    regimes.plot(positions.frame, result, out / "regimes.png")
    return Report(result, [*written, out / "regimes.png"], time.perf_counter() - start, positions)


def run_approx(lm, spec: PositionSpec, out: Path, *, progress: bool = False) -> Report:
    start = time.perf_counter()
    positions = _positions(lm, spec, out, progress)
    steps.step(f"the statistical approximation at {len(positions.frame)} positions")
    result = approx.approximation_gap(lm, positions.frame)
    written = save_table(result.positions, out / "approx_positions") + save_table(
        result.summary, out / "approx_summary"
    )
    approx.plot(result, out / "approx.png")
    return Report(result, [*written, out / "approx.png"], time.perf_counter() - start, positions)


def run_taboo(
    session,
    out: Path,
    *,
    split: str = "test",
    limit: int | None = 16,
    card=None,
    ranks=(1, 2, 4, 8),
    mid_word_ranks=(2,),
    temperature: float = 0.7,
    seeds=(0, 1, 2),
    sampled_ranks=(1,),
) -> Report:
    from promptopt.analyses.diagnose import taboo
    from promptopt.workflows.evaluate import check_generative

    check_generative(session, "diagnose taboo")
    start = time.perf_counter()
    prompt, items = session.prompt(card), session.items(split, limit)
    steps.step(
        f"taboo sweep on {len(items)} {split} items: ranks {list(ranks)}, mid-word {list(mid_word_ranks)}, {len(seeds)} sampled seeds"
    )
    sweep = taboo.taboo_sweep(
        session.scorer,
        prompt,
        items,
        ranks=ranks,
        mid_word_ranks=mid_word_ranks,
        temperature=temperature,
        seeds=seeds,
        sampled_ranks=sampled_ranks,
    )
    fit = {"fit_a": sweep.fit["a"], "fit_b": sweep.fit["b"], "fit_r2": sweep.fit["r2"], "fit_ranks": sweep.fit["n"]}
    written = save_table(sweep.dose.assign(**fit), out / "taboo_dose") + save_table(sweep.items, out / "taboo_items")
    if not sweep.ablation.empty:
        written += save_table(sweep.ablation, out / "taboo_ablation")
    if not sweep.sampled.empty:
        written += save_table(sweep.sampled, out / "taboo_sampled") + save_table(
            sweep.sampled_summary, out / "taboo_sampled_summary"
        )
    steps.step(f"writing tables and taboo.png in {out}")
    taboo.plot(sweep, out / "taboo.png")
    return Report(sweep, [*written, out / "taboo.png"], time.perf_counter() - start)


def _study_exists(config) -> bool:
    import optuna

    from promptopt.study.config import sqlite_path

    url = config.storage_url
    if sqlite_path(url) is not None and not sqlite_path(url).exists():
        return False
    return config.name in optuna.get_all_study_names(storage=url)


def run_conflicts(
    session,
    out: Path,
    *,
    limit: int | None = 12,
    seeds: int = 3,
    seed: int = 0,
    card=None,
    strategy: str = "tcb",
    trials: int = 5,
    suite: str = "quick",
    confidence: str = "top_prob",
    class_thresholds: dict | None = None,
    set_thresholds: dict | None = None,
    min_aq_dev: int = 4,
    progress: bool = False,
) -> Report:
    """Conflict classes of the prompt's items; VCQ / AQ from `seeds` baseline prompts (exemplars redrawn
    per seed from one generator seeded with `seed`, which also seeds the search's sampler) on dev and test items; a `strategy` search on the AQ dev items only; then the baseline and
    the enhanced prompt on the held-out AQ and VCQ test items, unperturbed and under `suite` (Table 3).

    The Table 3 baseline is the prompt itself (the task's own, or `card`): the same recipe as the seeds
    but not one of them, so the seed-to-seed noise that put a test item into AQ does not also lower the
    baseline's score on it. The seeds' own (in-selection) accuracy per set is in `sets`."""
    import dataclasses
    import hashlib
    import json
    import re

    from promptopt.analyses.diagnose import conflicts
    from promptopt.errors import UserError
    from promptopt.robustness.suite import Similarity, evaluate_robustness, load_suite
    from promptopt.study import SearchConfig, StudyConfig, get_strategy, run_search
    from promptopt.yamlio import check_output

    start = time.perf_counter()
    if seeds < 2:
        raise UserError(f"--seeds {seeds}: VCQ and AQ need accuracy and δ_TCB variances across seeds; use at least 2")
    if trials < 1:
        raise UserError(f"--trials {trials}: the targeted search needs at least 1 trial")
    if confidence not in conflicts.CONFIDENCE_SIGNALS:
        raise UserError(f"--confidence {confidence}: expected one of {', '.join(conflicts.CONFIDENCE_SIGNALS)}")
    get_strategy(strategy)
    the_suite = load_suite(suite)
    if session.out is None:
        raise UserError("diagnose conflicts needs a session with a run directory (its result cache serves the search)")
    check_output(out, folder=True, what="--out")
    check_output(Path(out) / "conflicts_items.parquet", folder=False, what="--out")
    out = Path(out)
    notes: list[str] = []

    (member,) = session.card_members(card, command="diagnose conflicts")
    if member.rule.calibrated:
        raise UserError(
            f"diagnose conflicts: {card} decides by {member.rule.name}; the conflicts protocol (the paper's) reads "
            "argmax answers, and a calibrated rule would decide its baseline and its searched prompt differently: "
            "give the card's prompt without its decision section"
        )
    prompt, pool = member.prompt, session.data.pool
    dev, test = session.items("dev", limit), session.items("test", limit)
    split_of = {**{i.id: "dev" for i in dev}, **{i.id: "test" for i in test}}
    scorer = session.scorer

    # 1. conflict classes of the prompt's own items
    steps.step(f"1/4 conflict classes of the prompt's own answers on {len(dev)} dev and {len(test)} test items")
    own = scorer.score(prompt, dev + test).table
    own.insert(1, "split", own["item_id"].map(split_of))
    cth = conflicts.class_thresholds(own, confidence=confidence, **(class_thresholds or {}))
    items = conflicts.classify_items(own, cth)
    classes = conflicts.class_summary(items)

    # 2. VCQ / AQ over the baseline seeds
    steps.step(f"2/4 VCQ / AQ over {seeds} baseline prompts (exemplars redrawn per seed)")
    if not prompt.exemplars:
        notes.append(
            "the prompt has no exemplars: every seed is the same prompt, so accuracy and δ_TCB variances are 0"
        )
    runs = []
    for s, seeded in enumerate(conflicts.baseline_prompts(prompt, pool, seeds, seed=seed)):
        table = scorer.score(seeded, dev + test).table
        runs.append(
            table.assign(
                seed=s, split=table["item_id"].map(split_of), exemplars=",".join(e.id for e in seeded.exemplars)
            )
        )
    runs = pd.concat(runs, ignore_index=True)
    per_question = conflicts.characterise(runs)
    sth = conflicts.set_thresholds(per_question, reference="dev", **(set_thresholds or {}))
    questions = conflicts.label_questions(per_question, sth)
    sets = conflicts.set_summary(questions)
    thresholds = pd.concat(
        [cth.table().assign(used_for="classes"), sth.table().assign(used_for="vcq_aq")], ignore_index=True
    )
    written = (
        save_table(items, out / "conflicts_items")
        + save_table(classes, out / "conflicts_classes")
        + save_table(thresholds, out / "conflicts_thresholds")
        + save_table(runs, out / "conflicts_runs")
        + save_table(questions, out / "conflicts_questions")
        + save_table(sets, out / "conflicts_sets")
    )

    def members(pool_items, split, name):
        chosen = set(questions.loc[(questions["split"] == split) & (questions["set"] == name), "item_id"])
        return [i for i in pool_items if i.id in chosen]

    aq_dev, aq_test, vcq_test = members(dev, "dev", "AQ"), members(test, "test", "AQ"), members(test, "test", "VCQ")
    if len(aq_dev) < min_aq_dev:
        raise UserError(
            f"only {len(aq_dev)} AQ dev item(s) of {len(dev)}: the targeted search needs at least {min_aq_dev}; "
            f"raise --limit (the characterisation tables are in {out})"
        )
    if not aq_test:
        raise UserError(
            f"no AQ test item among {len(test)}: nothing held out to evaluate the enhancement on; raise --limit "
            f"(the characterisation tables are in {out})"
        )

    # 3. targeted search on the AQ dev items only (test items: the held-out AQ ones, scored only after selection)
    steps.step(f"3/4 a {strategy} search of {trials} trials on the AQ dev items")
    spec = session.data.spec
    digest = hashlib.sha256(
        json.dumps(
            [
                [i.id for i in aq_dev],
                session.model_config.spec,
                session.model_config.resolved_dtype(),
                session.model_config.quantize,
                list(session.data_config.subsets or []),
            ]
        ).encode()
    ).hexdigest()[:10]
    config = SearchConfig(
        model=session.model_config,
        data=dataclasses.replace(session.data_config, dev_limit=None, test_limit=None),
        study=StudyConfig(
            strategy=strategy,
            trials=trials,
            seed=seed,
            study_name=re.sub(r"[^A-Za-z0-9_.:-]", "_", f"{spec.name}-conflicts-{strategy}-{digest}"),
        ),
        out=str(out / "conflicts_search"),
        batch_size=session.factory.batch_size,
    )
    resume = _study_exists(config)
    if resume:
        notes.append(
            f"study '{config.name}' (same AQ dev items and model) already in {config.out}: resumed to {trials} finished trials"
        )
    search = run_search(
        config.replace(resume=resume),
        scorer=scorer,
        data=dataclasses.replace(session.data, dev=aq_dev, test=aq_test),
        show_progress=progress,
    )

    # 4. Table 3 on the held-out test items
    steps.step("4/4 Table 3: baseline and enhanced prompt on the held-out VCQ and AQ test items, clean and perturbed")
    if not vcq_test:
        notes.append("no VCQ test item: Table 3 has no VCQ rows of ours")
    similarity, rows = Similarity(), []
    for set_name, set_items in (("VCQ", vcq_test), ("AQ", aq_test)):
        for name, p in (("baseline", prompt), ("enhanced", search.prompt)):
            if not set_items:
                continue
            clean = scorer.score(p, set_items).table
            robust = evaluate_robustness(
                scorer,
                p,
                set_items,
                the_suite,
                pool=pool,
                similarity=similarity,
                paraphrases=session.paraphrases,
                progress=progress,
                desc=f"{set_name} {name}",
            ).summary
            rows.append(conflicts.table3_row(set_name, name, clean, robust))
    table3 = pd.DataFrame(rows + conflicts.paper_table3_rows())
    written += save_table(table3, out / "conflicts_table3")
    conflicts.plot(items, cth, questions, sth, table3, out / "conflicts.png")
    result = conflicts.ConflictsResult(items, classes, cth, runs, questions, sth, sets, table3, search, notes)
    return Report(result, [*written, out / "conflicts.png", search.card_path], time.perf_counter() - start)
