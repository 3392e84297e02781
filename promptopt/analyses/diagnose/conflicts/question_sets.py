"""VCQ / AQ (δ_TCB paper App. C.4.2): each question scored with S baseline prompts (the same prompt, its exemplars
redrawn from the pool per seed). Per question: mean and population variance (ddof = 0) over seeds of
correctness and of log10 δ_TCB (the log, because δ_TCB is heavy-tailed and its scale is the model's).
- VCQ: mean acc ≥ 0.9 and acc var ≤ 0.05 and mean log δ ≥ T_H and log δ var ≤ V_L
- AQ:  mean acc < 0.6 or acc var > 0.15 or mean log δ < T_L or log δ var > V_H
The accuracy thresholds are the paper's; T_L, T_H default to the 25th and 50th percentiles of mean log δ
and V_L = V_H to the 75th percentile of log δ variance, over the dev questions only (test questions never
set a threshold; the same rule then labels them). V_L is not lower by default because on SmolLM2 / sst2 the
questions every seed gets right are those whose δ moves most with the exemplars (their log δ variance sits
in the upper half), so a median V_L left no VCQ at all; a VCQ must not be flagged for spread, and beyond
that needs the accuracy and an upper-half mean log δ. The paper writes Mean δ > T_H and Var < V_L; the
boundary itself is VCQ here. A question whose seeds all give δ = +inf has mean +inf, variance 0; some but
not all: mean +inf, variance +inf (it is AQ).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from promptopt.analyses.diagnose.conflicts.classes import finite_quantile, log10_tcb
from promptopt.errors import UserError

VCQ_ACC_MEAN, VCQ_ACC_VAR = 0.9, 0.05  # the paper's: mean acc ≥ 0.9, acc var ≤ 0.05
AQ_ACC_MEAN, AQ_ACC_VAR = 0.6, 0.15  # the paper's: mean acc < 0.6 or acc var > 0.15
SET_QUANTILES = {"t_low": 0.25, "t_high": 0.5, "v_low": 0.75, "v_high": 0.75}


def baseline_prompts(prompt, pool: list, seeds: int, *, seed: int = 0) -> list:
    """`seeds` copies of `prompt`, each with its k exemplars redrawn from `pool` (k distinct items, in the
    drawn order), from one generator seeded with `seed`. With k = 0 every copy is `prompt` itself."""
    k = len(prompt.exemplars)
    if k > len(pool):
        raise UserError(f"the prompt has {k} exemplars but the pool has only {len(pool)} items to redraw them from")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(seeds):
        picks = rng.choice(len(pool), size=k, replace=False) if k else []
        out.append(dataclasses.replace(prompt, exemplars=tuple(pool[int(i)].as_exemplar() for i in picks)))
    return out


def _log_stats(x: np.ndarray) -> tuple[float, float]:
    """Mean and population variance of log10 δ over seeds, +inf handled (see the module docstring)."""
    inf = np.isposinf(x)
    if inf.all():
        return float("inf"), 0.0
    if inf.any():
        return float("inf"), float("inf")
    return float(x.mean()), float(x.var())


def characterise(runs: pd.DataFrame) -> pd.DataFrame:
    """Per question over seeds. `runs`: one row per (seed, item) with item_id, correct, tcb (and split,
    v_eff, margin, top_prob when present). Returns item_id, [split], n_seeds, acc_mean, acc_var,
    log_tcb_mean, log_tcb_var, tcb_mean (finite arithmetic mean of δ), and the means of v_eff, margin, top_prob."""
    rows = []
    extra = [c for c in ("v_eff", "margin", "top_prob") if c in runs.columns]
    for item_id, part in runs.groupby("item_id", sort=False):
        acc = part["correct"].astype(float).to_numpy()
        tcb = part["tcb"].to_numpy(dtype=float)
        log_mean, log_var = _log_stats(log10_tcb(tcb))
        finite = tcb[np.isfinite(tcb)]
        row = {"item_id": item_id}
        if "split" in part.columns:
            row["split"] = part["split"].iloc[0]
        row.update(
            {
                "n_seeds": len(part),
                "acc_mean": float(acc.mean()),
                "acc_var": float(acc.var()),
                "log_tcb_mean": log_mean,
                "log_tcb_var": log_var,
                "tcb_mean": float(finite.mean()) if len(finite) else float("inf"),
            }
        )
        for name in extra:
            row[f"{name}_mean"] = float(part[name].mean())
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class SetThresholds:
    t_low: float  # T_L on mean log10 δ_TCB
    t_high: float  # T_H
    v_low: float  # V_L on the variance of log10 δ_TCB over seeds
    v_high: float  # V_H
    how: dict

    def table(self) -> pd.DataFrame:
        rules = {
            "t_low": "AQ if mean log δ < T_L",
            "t_high": "VCQ needs mean log δ ≥ T_H",
            "v_low": "VCQ needs log δ var ≤ V_L",
            "v_high": "AQ if log δ var > V_H",
        }
        rows = [
            {
                "threshold": name,
                "value": getattr(self, name),
                "tcb": 10.0 ** getattr(self, name) if name.startswith("t_") else float("nan"),
                "rule": rules[name],
                "how": self.how[name],
            }
            for name in ("t_low", "t_high", "v_low", "v_high")
        ]
        rows += [
            {
                "threshold": "vcq_acc",
                "value": VCQ_ACC_MEAN,
                "tcb": float("nan"),
                "rule": "VCQ needs mean acc ≥ 0.9 and acc var ≤ 0.05",
                "how": "paper",
            },
            {
                "threshold": "aq_acc",
                "value": AQ_ACC_MEAN,
                "tcb": float("nan"),
                "rule": "AQ if mean acc < 0.6 or acc var > 0.15",
                "how": "paper",
            },
        ]
        return pd.DataFrame(rows)


def set_thresholds(
    questions: pd.DataFrame,
    *,
    reference: str | None = "dev",
    t_low: float | None = None,
    t_high: float | None = None,
    v_low: float | None = None,
    v_high: float | None = None,
    quantiles: dict | None = None,
) -> SetThresholds:
    """T_L, T_H, V_L, V_H: given, or quantiles (SET_QUANTILES by default) of the reference questions'
    mean log δ and log δ variance (finite values; `reference` = a split name, or None for all questions)."""
    q = {**SET_QUANTILES, **(quantiles or {})}
    ref = (
        questions
        if reference is None or "split" not in questions.columns
        else questions[questions["split"] == reference]
    )
    given = {"t_low": t_low, "t_high": t_high, "v_low": v_low, "v_high": v_high}
    values, how = {}, {}
    for name, value in given.items():
        column = "log_tcb_mean" if name.startswith("t_") else "log_tcb_var"
        if value is None:
            data = ref[column].to_numpy(dtype=float)
            values[name] = finite_quantile(data, q[name])
            how[name] = (
                f"q{100 * q[name]:g} of {column} over {int(np.isfinite(data).sum())} {reference or 'all'} questions"
            )
        else:
            values[name], how[name] = float(value), "given"
    if values["t_low"] > values["t_high"]:
        raise UserError(
            f"T_L {values['t_low']:.4g} is above T_H {values['t_high']:.4g} (mean log10 δ_TCB): a question could be VCQ and AQ"
        )
    if values["v_low"] > values["v_high"]:
        raise UserError(
            f"V_L {values['v_low']:.4g} is above V_H {values['v_high']:.4g} (log10 δ_TCB variance): a question could be VCQ and AQ"
        )
    return SetThresholds(values["t_low"], values["t_high"], values["v_low"], values["v_high"], how)


def label_questions(questions: pd.DataFrame, th: SetThresholds) -> pd.DataFrame:
    """Adds vcq, aq, `set` (VCQ, AQ or neither) and aq_reasons (which AQ conditions hold)."""
    out = questions.copy()
    acc, acc_var = out["acc_mean"].to_numpy(dtype=float), out["acc_var"].to_numpy(dtype=float)
    mean, var = out["log_tcb_mean"].to_numpy(dtype=float), out["log_tcb_var"].to_numpy(dtype=float)
    out["vcq"] = (acc >= VCQ_ACC_MEAN) & (acc_var <= VCQ_ACC_VAR) & (mean >= th.t_high) & (var <= th.v_low)
    reasons = {
        "acc<0.6": acc < AQ_ACC_MEAN,
        "acc_var>0.15": acc_var > AQ_ACC_VAR,
        "log_tcb<T_L": mean < th.t_low,
        "log_tcb_var>V_H": var > th.v_high,
    }
    out["aq"] = np.logical_or.reduce(list(reasons.values()))
    out["aq_reasons"] = [";".join(name for name, hit in reasons.items() if hit[i]) for i in range(len(out))]
    out["set"] = np.where(out["vcq"], "VCQ", np.where(out["aq"], "AQ", "neither"))
    return out


def set_summary(questions: pd.DataFrame) -> pd.DataFrame:
    """Per (split, set): question count and the baseline seeds' mean accuracy and mean log δ on them
    (in-selection numbers: these scores chose the sets)."""
    rows = []
    splits = questions["split"].unique() if "split" in questions.columns else [None]
    for split in splits:
        part = questions if split is None else questions[questions["split"] == split]
        for name in ("VCQ", "AQ", "neither"):
            sub = part[part["set"] == name]
            finite = sub["log_tcb_mean"][np.isfinite(sub["log_tcb_mean"])]
            rows.append(
                {
                    "split": split,
                    "set": name,
                    "n": len(sub),
                    "share": len(sub) / len(part) if len(part) else float("nan"),
                    "seeds_acc_mean": float(sub["acc_mean"].mean()) if len(sub) else float("nan"),
                    "seeds_log_tcb_mean": float(finite.mean()) if len(finite) else float("nan"),
                }
            )
    return pd.DataFrame(rows)
