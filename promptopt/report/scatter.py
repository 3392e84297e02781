"""Every trial's dev accuracy against its mean δ_TCB (log), one column per strategy, pruned trials in a row of
their own; each search's winner starred (ringed: the card export writes), and in a tcb column the tcb rule's
bound as a dashed line."""

from __future__ import annotations

import math

import pandas as pd

from promptopt.report.figures import PALETTE
from promptopt.report.numbers import finite


def _nudge(x: list[float], y: list[float]) -> tuple[list[float], list[float]]:
    """Points drawn on top of each other are spread apart a little (the k-th copy by k steps)."""
    seen: dict[tuple, int] = {}
    out_x, out_y = [], []
    for a, b in zip(x, y):
        key = (round(math.log10(a), 3), round(b, 3))
        k = seen.get(key, 0)
        seen[key] = k + 1
        out_x.append(a * 1.02**k)
        out_y.append(b + (0.012 * ((k + 1) // 2) * (1 if k % 2 else -1) if k else 0))
    return out_x, out_y


def trials_scatter(trials: pd.DataFrame):
    """Dev accuracy vs mean δ_TCB of every trial, one column per strategy; pruned trials in a row of their
    own: their accuracy is on a partial set of dev items, not comparable with the finished ones."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    trials = trials[trials["accuracy"].map(finite) & trials["tcb_mean"].map(finite)]
    trials = trials[trials["tcb_mean"] > 0]
    strategies = list(dict.fromkeys(trials["strategy"]))
    states = [("COMPLETE", "finished")] + (
        [("PRUNED", "pruned: partial dev items")] if (trials["state"] == "PRUNED").any() else []
    )
    fig = make_subplots(
        rows=len(states),
        cols=max(1, len(strategies)),
        shared_yaxes=True,
        shared_xaxes=True,
        horizontal_spacing=0.03,
        vertical_spacing=0.14,
        subplot_titles=[f"{s} · {label}" for _, label in states for s in strategies],
    )
    seeds = sorted(set(trials["seed"]))
    for i, (state, _) in enumerate(states, 1):
        for j, strategy in enumerate(strategies, 1):
            for seed in seeds:
                part = trials[(trials["strategy"] == strategy) & (trials["state"] == state) & (trials["seed"] == seed)]
                if part.empty:
                    continue
                x, y = _nudge(part["tcb_mean"].astype(float).tolist(), part["accuracy"].astype(float).tolist())
                name = f"seed {seed}" if len(seeds) > 1 else "trial"
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=y,
                        mode="markers",
                        name=name,
                        legendgroup=name,
                        showlegend=(i == 1 and j == 1),
                        marker={
                            "size": 9,
                            "color": PALETTE[seeds.index(seed) % len(PALETTE)],
                            "symbol": "circle" if state == "COMPLETE" else "x-thin-open",
                            "line": {"width": 2},
                        },
                        customdata=list(
                            zip(
                                part["trial"],
                                part["tcb_mean"],
                                part["accuracy"],
                                part["n_dev"],
                                part["template"],
                                part["k"],
                            )
                        ),
                        hovertemplate=(
                            f"{strategy} · trial %{{customdata[0]}} ({state.lower()})<br>δ_TCB %{{customdata[1]:.4g}} · "
                            "accuracy %{customdata[2]:.3f} on %{customdata[3]} dev items<br>template %{customdata[4]}, "
                            "k=%{customdata[5]}<extra></extra>"
                        ),
                    ),
                    row=i,
                    col=j,
                )
    _mark_winners(fig, trials, strategies, seeds)
    fig.update_xaxes(type="log")
    fig.update_yaxes(title_text="dev accuracy", row=1, col=1)
    if len(states) > 1:
        fig.update_yaxes(title_text="partial accuracy", row=2, col=1)
    fig.update_layout(title="Accuracy vs mean δ_TCB (log), every trial; overlapping points nudged apart")
    return fig


def _mark_winners(fig, trials: pd.DataFrame, strategies: list, seeds: list) -> None:
    """★ on each search's winner (ringed: the card export writes) and, in a tcb facet, a dashed line per seed at
    the tcb rule's bound (trials on or above it are as accurate as the best; the most stable of them wins)."""
    import plotly.graph_objects as go

    if "winner" not in trials:
        return
    shown = False
    for j, strategy in enumerate(strategies, 1):
        mine = trials[(trials["strategy"] == strategy) & (trials["state"] == "COMPLETE")]
        won = mine[mine["winner"].astype(bool)]
        if len(won):
            exported = won["exported"].astype(bool).tolist()
            fig.add_trace(
                go.Scatter(
                    x=won["tcb_mean"].astype(float).tolist(),
                    y=won["accuracy"].astype(float).tolist(),
                    mode="markers",
                    name="winner (ringed: export's card)",
                    legendgroup="winner",
                    showlegend=not shown,
                    marker={
                        "size": [22 if e else 17 for e in exported],
                        "symbol": "star",
                        "color": "#f1c40f",
                        "line": {"width": [3 if e else 1 for e in exported], "color": "#1d2330"},
                    },
                    customdata=list(zip(won["trial"], won["seed"])),
                    hovertemplate=f"{strategy} · winner, trial %{{customdata[0]}} (seed %{{customdata[1]}})<extra></extra>",
                ),
                row=1,
                col=j,
            )
            shown = True
        for seed in seeds:
            bound = mine.loc[mine["seed"] == seed, "rule_low"]
            if len(bound) and finite(bound.iloc[0]):
                fig.add_hline(
                    y=float(bound.iloc[0]),
                    line_dash="dash",
                    line_color=PALETTE[seeds.index(seed) % len(PALETTE)],
                    annotation_text=f"tcb rule: ≥ {float(bound.iloc[0]):.3f}"
                    + (f" (seed {seed})" if len(seeds) > 1 else ""),
                    annotation_position="bottom right",
                    row=1,
                    col=j,
                )
