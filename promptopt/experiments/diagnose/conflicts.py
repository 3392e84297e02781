"""`promptopt diagnose conflicts`: accuracy–stability conflicts and δ_TCB-guided prompt enhancement
(δ_TCB paper §4.3, App. C.4.2, App. D.1, Table 3). The analysis on DataFrames; `workflows.run_conflicts`
scores, searches and stresses.

**Conflict classes** (§4.3, D.1), per scored item, with x = log10 δ_TCB and thresholds L < H on it:
- accurate but unstable:   correct      and x < L
- inaccurate but stable:   wrong        and x > H
- confident but unstable:  confident    and x < L
- uncertain but stable:    uncertain    and x > H
Confident / uncertain read one confidence signal c with thresholds C_L ≤ C_H: P(top1) (`top_prob`, the
default) or the logit margin z_k − z_j*: confident c > C_H, uncertain c < C_L; V_eff (higher = flatter):
confident V_eff < C_L, uncertain V_eff > C_H. By default L, H, C_L, C_H are the 25th and 75th percentiles
over the scored items (δ_TCB's scale differs by model, so no absolute value carries over); each can be
given instead. The classes are not exclusive (a correct, confident, low-δ item is in the first and third).
Shares carry 95% Wilson intervals over items, of all items and of their group (correct, wrong, confident,
uncertain). Items with δ_TCB = +inf (o a point mass) have x = +inf: stable; quantiles use finite values.

**VCQ / AQ** (App. C.4.2): each question scored with S baseline prompts (the same prompt, its exemplars
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

from promptopt.errors import UserError
from promptopt.metrics.stats import wilson_interval

CLASSES = ("accurate_but_unstable", "inaccurate_but_stable", "confident_but_unstable", "uncertain_but_stable")
CONFIDENCE_SIGNALS = ("top_prob", "margin", "v_eff")  # v_eff: higher means less confident
VCQ_ACC_MEAN, VCQ_ACC_VAR = 0.9, 0.05  # the paper's: mean acc ≥ 0.9, acc var ≤ 0.05
AQ_ACC_MEAN, AQ_ACC_VAR = 0.6, 0.15  # the paper's: mean acc < 0.6 or acc var > 0.15
SET_QUANTILES = {"t_low": 0.25, "t_high": 0.5, "v_low": 0.75, "v_high": 0.75}

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


def log10_tcb(tcb) -> np.ndarray:
    """log10 δ_TCB (+inf stays +inf)."""
    with np.errstate(divide="ignore"):
        return np.log10(np.asarray(tcb, dtype=float))


def _quantile(values, q: float) -> float:
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    return float(np.quantile(finite, q)) if len(finite) else float("nan")


# --- conflict classes (§4.3, D.1) ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClassThresholds:
    log_tcb_low: float  # L on log10 δ_TCB
    log_tcb_high: float  # H
    confidence: str  # top_prob, margin or v_eff
    conf_low: float  # C_L, in the signal's own units
    conf_high: float  # C_H
    how: dict  # threshold name -> how it was set, in words

    def table(self) -> pd.DataFrame:
        rows = [
            ("log_tcb_low", "log_tcb_low", self.log_tcb_low),
            ("log_tcb_high", "log_tcb_high", self.log_tcb_high),
            (f"{self.confidence}_low", "conf_low", self.conf_low),
            (f"{self.confidence}_high", "conf_high", self.conf_high),
        ]
        return pd.DataFrame(
            [
                {
                    "threshold": label,
                    "value": value,
                    "tcb": 10.0**value if key.startswith("log_tcb") else float("nan"),
                    "how": self.how[key],
                }
                for label, key, value in rows
            ]
        )


def class_thresholds(
    frame: pd.DataFrame,
    *,
    confidence: str = "top_prob",
    low_q: float = 0.25,
    high_q: float = 0.75,
    log_tcb_low: float | None = None,
    log_tcb_high: float | None = None,
    conf_low: float | None = None,
    conf_high: float | None = None,
) -> ClassThresholds:
    """L, H on log10 δ_TCB and C_L, C_H on the confidence signal: given, or the low_q / high_q quantiles of
    the items' values (finite values only)."""
    if confidence not in CONFIDENCE_SIGNALS:
        raise UserError(f"--confidence {confidence}: expected one of {', '.join(CONFIDENCE_SIGNALS)}")
    if confidence not in frame.columns:
        raise UserError(f"the scored items have no '{confidence}' column; use --confidence margin or v_eff")
    if not 0 <= low_q <= high_q <= 1:
        raise UserError(f"quantiles: expected 0 ≤ low ≤ high ≤ 1, got {low_q}, {high_q}")
    x, c = log10_tcb(frame["tcb"]), frame[confidence].to_numpy(dtype=float)
    how, values = {}, {}
    for name, given, data, q, what in (
        ("log_tcb_low", log_tcb_low, x, low_q, "log10 δ_TCB"),
        ("log_tcb_high", log_tcb_high, x, high_q, "log10 δ_TCB"),
        ("conf_low", conf_low, c, low_q, confidence),
        ("conf_high", conf_high, c, high_q, confidence),
    ):
        if given is None:
            values[name] = _quantile(data, q)
            how[name] = f"q{100 * q:g} of {what} over {int(np.isfinite(data).sum())} items"
        else:
            values[name] = float(given)
            how[name] = "given"
    if values["log_tcb_low"] > values["log_tcb_high"]:
        raise UserError(
            f"δ_TCB thresholds: low {values['log_tcb_low']:.4g} is above high {values['log_tcb_high']:.4g} (log10 δ_TCB)"
        )
    if values["conf_low"] > values["conf_high"]:
        raise UserError(
            f"{confidence} thresholds: low {values['conf_low']:.4g} is above high {values['conf_high']:.4g}"
        )
    return ClassThresholds(
        values["log_tcb_low"], values["log_tcb_high"], confidence, values["conf_low"], values["conf_high"], how
    )


def classify_items(frame: pd.DataFrame, th: ClassThresholds) -> pd.DataFrame:
    """The item table with log10_tcb, unstable / stable / confident / uncertain, one boolean column per
    class and `classes` (the names of the classes an item is in, joined by '+'; '' for none)."""
    out = frame.copy()
    out["log10_tcb"] = log10_tcb(out["tcb"])
    correct = out["correct"].astype(bool).to_numpy()
    x = out["log10_tcb"].to_numpy()
    c = out[th.confidence].to_numpy(dtype=float)
    out["unstable"] = x < th.log_tcb_low
    out["stable"] = x > th.log_tcb_high
    if th.confidence == "v_eff":  # a flatter distribution is the less confident one
        out["confident"], out["uncertain"] = c < th.conf_low, c > th.conf_high
    else:
        out["confident"], out["uncertain"] = c > th.conf_high, c < th.conf_low
    out["accurate_but_unstable"] = correct & out["unstable"]
    out["inaccurate_but_stable"] = ~correct & out["stable"]
    out["confident_but_unstable"] = out["confident"] & out["unstable"]
    out["uncertain_but_stable"] = out["uncertain"] & out["stable"]
    out["classes"] = ["+".join(name for name in CLASSES if row[name]) for _, row in out[list(CLASSES)].iterrows()]
    return out


_GROUPS = {
    "accurate_but_unstable": ("correct", "correct & log δ < L"),
    "inaccurate_but_stable": ("wrong", "wrong & log δ > H"),
    "confident_but_unstable": ("confident", "confident & log δ < L"),
    "uncertain_but_stable": ("uncertain", "uncertain & log δ > H"),
}


def class_summary(items: pd.DataFrame) -> pd.DataFrame:
    """Per class: count, share of all items and share of its group (correct, wrong, confident, uncertain),
    each with a 95% Wilson interval."""
    n = len(items)
    groups = {
        "correct": items["correct"].astype(bool),
        "wrong": ~items["correct"].astype(bool),
        "confident": items["confident"],
        "uncertain": items["uncertain"],
    }
    rows = []
    for name in CLASSES:
        group, rule = _GROUPS[name]
        count = int(items[name].sum())
        n_group = int(groups[group].sum())
        low, high = wilson_interval(count, n)
        g_low, g_high = wilson_interval(count, n_group)
        rows.append(
            {
                "class": name,
                "rule": rule,
                "n_items": n,
                "count": count,
                "share": count / n if n else float("nan"),
                "ci_low": low,
                "ci_high": high,
                "group": group,
                "n_group": n_group,
                "share_of_group": count / n_group if n_group else float("nan"),
                "group_ci_low": g_low,
                "group_ci_high": g_high,
            }
        )
    return pd.DataFrame(rows)


# --- VCQ / AQ characterisation (App. C.4.2) ------------------------------------------------------------------------
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
            values[name] = _quantile(data, q[name])
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


# --- Table 3 ---------------------------------------------------------------------------------------------------------
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
        "acc_ci_low": low,
        "acc_ci_high": high,
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


@dataclass
class ConflictsResult:
    items: pd.DataFrame  # the prompt's scored dev + test items with their classes
    classes: pd.DataFrame  # class_summary
    class_thresholds: ClassThresholds
    runs: pd.DataFrame  # one row per (seed, item): the baseline seeds' scores
    questions: pd.DataFrame  # one row per question: over-seed statistics, VCQ / AQ
    set_thresholds: SetThresholds
    sets: pd.DataFrame  # set_summary
    table3: pd.DataFrame  # ours (baseline, enhanced per set) and the paper's rows
    search: object = None  # the SearchResult of the targeted search
    notes: list = dataclasses.field(default_factory=list)


# --- figure ----------------------------------------------------------------------------------------------------------
_COLOURS = {
    "accurate_but_unstable": "tab:orange",
    "inaccurate_but_stable": "tab:purple",
    "confident_but_unstable": "tab:red",
    "uncertain_but_stable": "tab:green",
}


def plot(
    items: pd.DataFrame, th: ClassThresholds, questions: pd.DataFrame, sets: SetThresholds, table3: pd.DataFrame, path
) -> None:
    """Left: log10 δ_TCB vs the confidence signal per item, coloured by class, thresholds drawn. Middle:
    VCQ / AQ — mean accuracy over seeds vs mean log10 δ_TCB per question. Right: Table 3's Acc and
    Acc_worst, baseline vs enhanced, per set (ours)."""
    from promptopt.experiments.diagnose.output import new_figure, save_figure

    fig, axes = new_figure(3, size=(15.0, 4.4))
    ax = axes[0][0]
    data = items[np.isfinite(items["log10_tcb"])]
    c = data[th.confidence]
    none = data["classes"] == ""
    ax.scatter(
        c[none & data["correct"].astype(bool)],
        data.loc[none & data["correct"].astype(bool), "log10_tcb"],
        s=14,
        facecolors="none",
        edgecolors="grey",
        label="no conflict (correct)",
    )
    ax.scatter(
        c[none & ~data["correct"].astype(bool)],
        data.loc[none & ~data["correct"].astype(bool), "log10_tcb"],
        s=14,
        marker="x",
        color="grey",
        label="no conflict (wrong)",
    )
    for name in CLASSES:  # later classes are drawn smaller on top, so an item in two shows both colours
        hit = data[name].astype(bool)
        size = 40 if name in CLASSES[:2] else 14
        ax.scatter(
            c[hit],
            data.loc[hit, "log10_tcb"],
            s=size,
            color=_COLOURS[name],
            label=f"{name.replace('_', ' ')} ({int(hit.sum())})",
        )
    ax.axhline(th.log_tcb_low, color="black", ls="--", lw=0.8)
    ax.axhline(th.log_tcb_high, color="black", ls="--", lw=0.8)
    ax.axvline(th.conf_low, color="black", ls=":", lw=0.8)
    ax.axvline(th.conf_high, color="black", ls=":", lw=0.8)
    if th.confidence == "v_eff":
        ax.set_xscale("log")
    ax.set_xlabel(th.confidence)
    ax.set_ylabel("log10 δ_TCB")
    ax.set_title(f"conflict classes ({len(items)} items)", fontsize=9)
    ax.legend(fontsize=6)
    ax = axes[0][1]
    q = questions[np.isfinite(questions["log_tcb_mean"])]
    for name, colour in (("neither", "grey"), ("AQ", "tab:red"), ("VCQ", "tab:blue")):
        for split, marker in (("dev", "o"), ("test", "^")):
            part = q[(q["set"] == name) & (q["split"] == split)] if "split" in q.columns else q[q["set"] == name]
            if len(part):
                ax.scatter(
                    part["log_tcb_mean"],
                    part["acc_mean"],
                    s=18,
                    marker=marker,
                    color=colour,
                    alpha=0.7,
                    label=f"{name} {split} ({len(part)})",
                )
    ax.axvline(sets.t_low, color="tab:red", ls="--", lw=0.8, label="T_L")
    ax.axvline(sets.t_high, color="tab:blue", ls="--", lw=0.8, label="T_H")
    ax.axhline(VCQ_ACC_MEAN, color="tab:blue", ls=":", lw=0.8)
    ax.axhline(AQ_ACC_MEAN, color="tab:red", ls=":", lw=0.8)
    ax.set_xlabel("mean log10 δ_TCB over seeds")
    ax.set_ylabel("mean accuracy over seeds")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("VCQ / AQ characterisation", fontsize=9)
    ax.legend(fontsize=6)
    ax = axes[0][2]
    ours = table3[table3["source"] == "ours"]
    labels = [f"{r.set}\n{r.prompt}\n(n={int(r.n)})" for r in ours.itertuples()]
    x = np.arange(len(ours))
    for offset, name in ((-0.2, "acc"), (0.2, "acc_worst")):
        values = ours[name].to_numpy(dtype=float)
        low = ours[f"{name}_ci_low"].to_numpy(dtype=float)
        high = ours[f"{name}_ci_high"].to_numpy(dtype=float)
        ax.bar(x + offset, values, width=0.4, label=name + " (95% CI)")
        yerr = np.nan_to_num(np.clip([values - low, high - values], 0, None))
        ax.errorbar(x + offset, values, yerr=yerr, fmt="none", color="black", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylim(0, 1.1)
    ax.set_title("held-out test items: baseline vs enhanced", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, path)
