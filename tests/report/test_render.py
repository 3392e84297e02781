"""What the CLI prints of a result: names a wide table never cuts into the same text, and a spread that is zero
printed as zero (compare's tables, rendered to a 200-column pipe as a user's log gets them)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd

NAMES = ["baseline", "accuracy@batch-adaptive", "accuracy@batch-adaptive+ens5"]


def _compare_result() -> SimpleNamespace:
    """A compare result with every column print_compare shows, both splits, three seeds of identical winners."""
    row = {"avg_acc": 0.8, "avg_acc_sd": 0.0, "acc_ci_low": 0.7, "acc_ci_high": 0.9, "avg_tcb": 3.2,
           "avg_tcb_sd": 0.1, "avg_ppl": 1.5, "avg_ppl_sd": 0.02, "taboo_retention_i1": math.nan,
           "search_seconds": 61.0, "selected_by": "best accuracy value on dev"}  # fmt: skip
    for split in ("unseen", "seen"):
        row |= {f"acc_var_pert_{split}": 0.1, f"pdr_{split}": 0.05, f"pdr_{split}_sd": 0.01,
                f"acc_worst_{split}": 0.5, f"acc_worst_{split}_sd": 0.02, f"acc_worst_{split}_ci_low": 0.4,
                f"acc_worst_{split}_ci_high": 0.6}  # fmt: skip
    table = pd.DataFrame([{**row, "strategy": name} for name in NAMES])
    table.loc[2, "avg_acc_sd"] = pd.Series([0.8, 0.8, 0.8]).std()  # what a sum of equal values leaves: 1.36e-16
    pair = {"delta_acc": 0.0, "delta_acc_ci_low": -0.05, "delta_acc_ci_high": 0.05, "mcnemar_p": 1.0,
            "significant": False}  # fmt: skip
    for split in ("unseen", "seen"):
        for key in ("acc_worst", "pdr"):
            pair |= {
                f"delta_{key}_{split}": 0.0,
                f"delta_{key}_{split}_ci_low": -0.1,
                f"delta_{key}_{split}_ci_high": 0.1,
            }
    paired = pd.DataFrame([{**pair, "a": a, "b": b} for i, a in enumerate(NAMES) for b in NAMES[i + 1 :]])
    summary = {"families_seen": ["typo"], "families_unseen": ["distractor", "format"], "n_test": 150, "seeds": 3,
               "suite": "unseen", "search_suite": "cheap", "evaluations": 9, "evaluations_reused": 0,
               "evaluations_resumed": 0, "studies_resumed": [], "result_cache_hits": 1, "result_cache_misses": 2,
               "variant_embedding_hit_rate": None}  # fmt: skip
    return SimpleNamespace(table=table, paired=paired, summary=summary)


def _printed(result) -> list[str]:
    from promptopt.cli.render import console
    from promptopt.cli.render_robustness import print_compare

    with console.capture() as captured:
        print_compare(result, "sst2", "smollm2-135m-instruct")
    return captured.get().splitlines()


def test_compare_tables_never_cut_two_names_into_the_same_text():
    lines = _printed(_compare_result())
    assert max(map(len, lines)) <= 200 + 2  # the pipe's width: the table had to shrink to fit
    rows = [line for line in lines if line.startswith("│ ")]
    for name in NAMES:  # once in the strategy table, and in its two pairs of the paired table: whole each time
        whole = [line for line in rows if name in [cell.strip() for cell in line.split("│")[1:3]]]
        assert len(whole) == 3, (name, rows)
    assert not any("…" in line.split("│")[1] for line in rows if len(line.split("│")) > 2)


def test_a_zero_spread_prints_as_zero():
    from promptopt.cli.render import pm
    from promptopt.workflows.compare.tables import mean_sd

    assert pm(0.8, pd.Series([0.8, 0.8, 0.8]).std()) == "0.8 ± 0"
    assert pm(0.8, 0.05) == "0.8 ± 0.05" and pm(0.8, math.nan) == "0.8"
    assert mean_sd(pd.Series([0.8, 0.8, 0.8])) == (0.8, 0.0)  # compare.csv stores a true 0
    mean, sd = mean_sd(pd.Series([0.7, 0.8, 0.9]))
    assert mean == 0.8 or abs(mean - 0.8) < 1e-12 and abs(sd - 0.1) < 1e-12
    assert math.isnan(mean_sd(pd.Series([0.8]))[1])
    lines = _printed(_compare_result())
    assert not any("e-16" in line for line in lines), lines
    assert any("accuracy@batch-adaptive+ens5" in line and "0.8 ± 0 " in line for line in lines), lines


def test_compare_shows_the_median_delta_tcb_not_a_mean_one_item_makes():
    """pmi gave one item a δ_TCB of 2.78e8 and compare printed its mean, 2.78e6: the column is the median (with
    the geometric mean beside it); the mean is in compare.csv only."""
    result = _compare_result()
    result.table["avg_tcb"], result.table["tcb_median"], result.table["tcb_geomean"] = 2.78e6, 3.5, 4.1
    text = "\n".join(_printed(result))
    assert "median" in text and "geomean" in text and "│      3.5 │      4.1 │" in text
    assert "2.78e+06" not in text and "2780000" not in text and "2,780,000" not in text
