"""`promptopt diagnose geometry`: is δ_TCB sensitive to the output-embedding geometry beyond o?
(δ_TCB paper §4.2, Table 2; App. C.4.1.)

For each position: the K = 10 most probable competitors j ≠ top-1 move halfway toward the top-1 embedding
(cluster, w_j + α(w_t − w_j), α = 0.5) and away from it (disperse, w_j − β(w_t − w_j), β = 0.5); every
other row of W stays. δ_TCB is recomputed with h **and o held fixed** — the paper's variant, only possible
through `tcb_from_probs(o, W')` — and the hypothesis δ_cluster > δ_orig > δ_disperse is checked.
Separately, and labelled as such, the variant that recomputes o = softmax(W' h): moving w_j also moves its
logit z_j toward (or away from) z_t, so this one mixes the geometric effect with a change of o.

With a logit scale or soft-cap, the moved rows' chain-rule gains are read at their new logits s'_j = w'_j·h
(the Jacobian of the modified head at h), in both variants.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from promptopt.analyses.diagnose.output import V_EFF_BANDS
from promptopt.errors import UserError
from promptopt.metrics.stats import wilson_interval
from promptopt.metrics.tcb_fixed_probs import logits_float64, move_toward, tcb_from_probs

PAPER_TABLE2 = {"<20": 0.95, "20–100": 0.92, ">100": 0.80, "overall": 0.90}
_CHUNK = 128
_F64_COPY_ELEMENTS = 1 << 25


@dataclass
class GeometryResult:
    positions: pd.DataFrame  # one row per position: δ orig / cluster / disperse, both variants, hypothesis held
    summary: pd.DataFrame  # one row per V_eff band and overall: share held (Wilson 95%), paper's share


def geometry_sensitivity(lm, positions, *, k: int = 10, alpha: float = 0.5, beta: float = 0.5) -> GeometryResult:
    head = lm.output_head
    if not 1 <= k < head.vocab_size:
        raise UserError(f"--k {k}: the competitors moved must be between 1 and V − 1 = {head.vocab_size - 1}")
    rows = []
    # One float64 copy of W for every pass (five per chunk) when it is small enough (SmolLM2: 226 MB).
    weight = head.weight.double() if head.weight.numel() <= _F64_COPY_ELEMENTS else head.weight
    with torch.inference_mode():
        for start in range(0, positions.hidden.shape[0], _CHUNK):
            rows.append(
                _chunk(head, weight, positions.hidden[start : start + _CHUNK].to(head.weight.device), k, alpha, beta)
            )
    table = positions.frame[
        ["source", "task", "item_id", "step", "token", "v_eff", "top_prob", "margin", "band", "tcb"]
    ].copy()
    for name in rows[0]:
        table[name] = np.concatenate([r[name] for r in rows])
    table["orig_vs_exact_form"] = (table["tcb_orig"] / table["tcb"]).where(np.isfinite(table["tcb"]))
    for variant in ("fixed_o", "recomputed_o"):
        table[f"held_{variant}"] = (table[f"tcb_cluster_{variant}"] > table["tcb_orig"]) & (
            table["tcb_orig"] > table[f"tcb_disperse_{variant}"]
        )
        table[f"cluster_ratio_{variant}"] = table[f"tcb_cluster_{variant}"] / table["tcb_orig"]
        table[f"disperse_ratio_{variant}"] = table[f"tcb_disperse_{variant}"] / table["tcb_orig"]
    return GeometryResult(table, summarize(table))


def _chunk(
    head, weight: torch.Tensor, hidden: torch.Tensor, k: int, alpha: float, beta: float
) -> dict[str, np.ndarray]:
    z, gain = logits_float64(head, hidden, weight=weight)
    o = torch.log_softmax(z, -1).exp()
    order = o.topk(k + 1, dim=-1).indices
    top, comps = order[:, 0], order[:, 1:]
    anchor = weight[top].double()
    h = hidden.double()
    out = {"tcb_orig": tcb_from_probs(o, weight, gain=gain).tcb}
    for name, shift in (("cluster", alpha), ("disperse", -beta)):
        moved = move_toward(weight[comps], anchor, alpha=shift)  # (n, K, d)
        s_new = torch.einsum("nkd,nd->nk", moved, h)
        if head.bias is not None:
            s_new = s_new + head.bias[comps].double()
        z_new, g_new = head._transform(s_new)
        gain_new = None if gain is None else gain.scatter(1, comps, g_new)
        out[f"tcb_{name}_fixed_o"] = tcb_from_probs(o, weight, gain=gain_new, rows=comps, replaced=moved).tcb
        o_new = torch.log_softmax(z.scatter(1, comps, z_new), -1).exp()
        out[f"tcb_{name}_recomputed_o"] = tcb_from_probs(o_new, weight, gain=gain_new, rows=comps, replaced=moved).tcb
    return {name: value.cpu().numpy() for name, value in out.items()}


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Share of positions where δ_cluster > δ_orig > δ_disperse, per V_eff band and overall, both variants."""
    rows = []
    for band in (*V_EFF_BANDS, "overall"):
        part = table if band == "overall" else table[table["band"] == band]
        row = {"band": band, "n": len(part)}
        for variant in ("fixed_o", "recomputed_o"):
            held = int(part[f"held_{variant}"].sum())
            low, high = wilson_interval(held, len(part))
            row[f"held_{variant}"] = held / len(part) if len(part) else float("nan")
            row[f"ci_low_{variant}"], row[f"ci_high_{variant}"] = low, high
            row[f"median_cluster_ratio_{variant}"] = (
                float(part[f"cluster_ratio_{variant}"].median()) if len(part) else float("nan")
            )
            row[f"median_disperse_ratio_{variant}"] = (
                float(part[f"disperse_ratio_{variant}"].median()) if len(part) else float("nan")
            )
        row["paper_held"] = PAPER_TABLE2[band]
        rows.append(row)
    return pd.DataFrame(rows)


def plot(result: GeometryResult, path) -> None:
    """Left: share held per band (fixed o, recomputed o, the paper's Table 2). Right: δ ratios vs V_eff."""
    from promptopt.analyses.diagnose.output import new_figure, save_figure

    fig, axes = new_figure(2, size=(11.0, 4.2))
    ax = axes[0][0]
    s = result.summary
    x = np.arange(len(s))
    for offset, (column, label) in zip(
        (-0.27, 0.0, 0.27),
        (
            ("held_fixed_o", "ours, o fixed (paper's)"),
            ("held_recomputed_o", "ours, o recomputed"),
            ("paper_held", "paper Table 2"),
        ),
    ):
        values = s[column].to_numpy(dtype=float)
        ax.bar(x + offset, values, width=0.27, label=label)
        if column != "paper_held":
            low = s[column.replace("held", "ci_low")].to_numpy(dtype=float)
            high = s[column.replace("held", "ci_high")].to_numpy(dtype=float)
            yerr = np.clip([values - low, high - values], 0, None)  # Wilson bounds can round past the share
            ax.errorbar(x + offset, values, yerr=yerr, fmt="none", color="black", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{b}\n(n={n})" for b, n in zip(s["band"], s["n"])])
    ax.set_ylabel("share with δ_cluster > δ_orig > δ_disperse")
    ax.set_ylim(0, 1.3)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    ax = axes[0][1]
    t = result.positions
    ax.scatter(t["v_eff"], t["cluster_ratio_fixed_o"], s=8, label="cluster / orig (o fixed)")
    ax.scatter(t["v_eff"], t["disperse_ratio_fixed_o"], s=8, label="disperse / orig (o fixed)")
    ax.scatter(t["v_eff"], t["cluster_ratio_recomputed_o"], s=8, marker="x", label="cluster / orig (o recomputed)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("V_eff")
    ax.set_ylabel("δ_TCB ratio")
    ax.legend(fontsize=7)
    save_figure(fig, path)
