"""One call per `promptopt diagnose` command: collect (or reuse) the inputs, run the analysis, write its
tables (Parquet + CSV) and figure (PNG) into the output folder, and say what was written and how long it
took. The CLI only parses and prints."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from promptopt.experiments.diagnose import approx, geometry, regimes
from promptopt.experiments.diagnose.output import save_table
from promptopt.experiments.diagnose.positions import Positions, PositionSpec, collect_positions


@dataclass
class Report:
    result: object
    written: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    positions: Positions | None = None


def _positions(lm, spec: PositionSpec, out: Path, progress: bool) -> Positions:
    return collect_positions(lm, spec, cache_dir=out, progress=progress)


def run_geometry(lm, spec: PositionSpec, out: Path, *, k: int = 10, alpha: float = 0.5, beta: float = 0.5,
                 progress: bool = False) -> Report:
    start = time.perf_counter()
    positions = _positions(lm, spec, out, progress)
    result = geometry.geometry_sensitivity(lm, positions, k=k, alpha=alpha, beta=beta)
    written = save_table(result.positions, out / "geometry_positions") + save_table(result.summary, out / "geometry_summary")
    geometry.plot(result, out / "geometry.png")
    return Report(result, [*written, out / "geometry.png"], time.perf_counter() - start, positions)


def run_regimes(lm, spec: PositionSpec, out: Path, *, low_v_eff: float = 2.0, progress: bool = False) -> Report:
    start = time.perf_counter()
    positions = _positions(lm, spec, out, progress)
    result = regimes.regime_correlations(positions.frame, low_v_eff=low_v_eff)
    written = save_table(result.table, out / "regimes") + save_table(positions.frame, out / "regimes_positions")
    regimes.plot(positions.frame, result, out / "regimes.png")
    return Report(result, [*written, out / "regimes.png"], time.perf_counter() - start, positions)


def run_approx(lm, spec: PositionSpec, out: Path, *, progress: bool = False) -> Report:
    start = time.perf_counter()
    positions = _positions(lm, spec, out, progress)
    result = approx.approximation_gap(lm, positions.frame)
    written = save_table(result.positions, out / "approx_positions") + save_table(result.summary, out / "approx_summary")
    approx.plot(result, out / "approx.png")
    return Report(result, [*written, out / "approx.png"], time.perf_counter() - start, positions)


def run_taboo(session, out: Path, *, split: str = "test", limit: int | None = 16, card=None, ranks=(1, 2, 4, 8),
              mid_word_ranks=(2,), temperature: float = 0.7, seeds=(0, 1, 2), sampled_ranks=(1,)) -> Report:
    from promptopt.experiments.diagnose import taboo

    start = time.perf_counter()
    prompt, items = session.prompt(card), session.items(split, limit)
    sweep = taboo.taboo_sweep(session.scorer, prompt, items, ranks=ranks, mid_word_ranks=mid_word_ranks,
                              temperature=temperature, seeds=seeds, sampled_ranks=sampled_ranks)
    fit = {"fit_a": sweep.fit["a"], "fit_b": sweep.fit["b"], "fit_r2": sweep.fit["r2"], "fit_ranks": sweep.fit["n"]}
    written = save_table(sweep.dose.assign(**fit), out / "taboo_dose") + save_table(sweep.items, out / "taboo_items")
    if not sweep.ablation.empty:
        written += save_table(sweep.ablation, out / "taboo_ablation")
    if not sweep.sampled.empty:
        written += save_table(sweep.sampled, out / "taboo_sampled") + save_table(sweep.sampled_summary, out / "taboo_sampled_summary")
    taboo.plot(sweep, out / "taboo.png")
    return Report(sweep, [*written, out / "taboo.png"], time.perf_counter() - start)
