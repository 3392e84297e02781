"""The δ_TCB paper's Table 3 on this model: per question set, the baseline and the enhanced prompt's unperturbed
accuracy, δ_TCB, V_eff and margin, and their AccVar_pert, PDR and Acc_worst under a suite; beside the paper's rows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from promptopt.analyses.diagnose.conflicts.classes import log10_tcb
from promptopt.metrics.stats import wilson_interval
from promptopt.workflows.compare.records import ACCURACY_CI

# δ_TCB paper, Table 3 ("illustrative of observed trends"). The paper prints PDR for the VCQ rows as
# fractions (0.10) and for the AQ rows as percentages (30) under one "PDR (%)" header; all are fractions here.
PAPER_TABLE3_COLUMNS = ("acc", "tcb_mean", "v_eff_mean", "margin_mean", "acc_var_pert", "pdr", "acc_worst")
PAPER_TABLE3 = {
    ("VCQ", "MMLU", "baseline"): (0.90, 771.5, 1.08, 4.5, 0.05, 0.10, 0.80),
    ("VCQ", "MMLU", "enhanced"): (0.95, 1025.2, 1.03, 6.0, 0.02, 0.03, 0.90),
    ("VCQ", "GSM8K", "baseline"): (0.85, 2407.0, 1.01, 4.2, 0.06, 0.12, 0.75),
    ("VCQ", "GSM8K", "enhanced"): (0.92, 4410.8, 1.05, 5.8, 0.03, 0.05, 0.85),
    ("AQ", "MMLU", "baseline"): (0.40, 1983.0, 1.01, 1.5, 0.15, 0.30, 0.15),
    ("AQ", "MMLU", "enhanced"): (0.70, 2734.0, 1.00, 4.0, 0.07, 0.10, 0.30),
    ("AQ", "GSM8K", "baseline"): (0.35, 3412.8, 1.04, 1.2, 0.18, 0.35, 0.10),
    ("AQ", "GSM8K", "enhanced"): (0.65, 6625.5, 1.02, 3.8, 0.08, 0.12, 0.45),
}


def table3_row(set_name: str, prompt_name: str, clean: pd.DataFrame, robust: dict | None) -> dict:
    """One row of Table 3 for a prompt on a question set: unperturbed Acc (Wilson 95%), mean δ_TCB (finite
    values; and the geometric mean), V_eff, margin; perturbed AccVar_pert, PDR, Acc_worst with the
    suite's bootstrap intervals (`robust`: evaluate_robustness's summary)."""
    n = len(clean)
    k = int(clean["correct"].astype(bool).sum())
    low, high = wilson_interval(k, n)
    tcb = clean["tcb"].to_numpy(dtype=float)
    finite = tcb[np.isfinite(tcb)]
    row = {
        "source": "ours",
        "set": set_name,
        "prompt": prompt_name,
        "n": n,
        "acc": k / n if n else float("nan"),
        ACCURACY_CI[0]: low,  # the accuracy interval's columns of compare's tables
        ACCURACY_CI[1]: high,
        "tcb_mean": float(finite.mean()) if len(finite) else float("nan"),
        "tcb_geomean": float(10 ** log10_tcb(finite).mean()) if len(finite) else float("nan"),
        "tcb_infinite": int(np.isposinf(tcb).sum()),
        "v_eff_mean": float(clean["v_eff"].mean()),
        "margin_mean": float(clean["margin"].mean()),
    }
    nan2 = [float("nan"), float("nan")]
    r = robust or {}
    for name in ("acc_var_pert", "pdr", "acc_worst"):
        row[name] = float(r.get(name, float("nan")))
        row[f"{name}_ci_low"], row[f"{name}_ci_high"] = (float(v) for v in r.get(f"{name}_ci95", nan2))
    row["suite"] = r.get("suite", "")
    return row


def paper_table3_rows() -> list[dict]:
    """The paper's Table 3 as rows of the same table (source 'paper MMLU' / 'paper GSM8K')."""
    return [
        {"source": f"paper {bench}", "set": set_name, "prompt": prompt, **dict(zip(PAPER_TABLE3_COLUMNS, values))}
        for (set_name, bench, prompt), values in PAPER_TABLE3.items()
    ]
