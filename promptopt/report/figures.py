"""The report's plotly figures. Every figure is embedded without plotly.js (inlined once by the page) in a
`<div class="plot" data-plot=NAME>`, so a test can find each one; error bars are 95% intervals."""

from __future__ import annotations

import html

import pandas as pd

from promptopt.report.numbers import finite

SIGNIFICANT, PLAIN = "#c0392b", "#34495e"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#d62728")
FLIP_COLOURS = ("#cdebd6", "#e6e6e6", "#5dade2", "#e74c3c")  # still right, still wrong, fixed, broken


def embed(fig, name: str, height: int = 420) -> str:
    fig.update_layout(height=height, margin={"l": 70, "r": 30, "t": 70, "b": 50}, template="plotly_white")
    body = fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True})
    return f'<div class="plot" data-plot="{html.escape(name)}">{body}</div>'


def _bars(values, lows, highs) -> dict:
    """Asymmetric error bars from interval bounds (0 where a bound is missing)."""
    return {
        "type": "data",
        "symmetric": False,
        "visible": True,
        "array": [h - v if finite(h) and finite(v) else 0 for v, h in zip(values, highs)],
        "arrayminus": [v - lo if finite(lo) and finite(v) else 0 for v, lo in zip(values, lows)],
    }


def forest(rows: list[dict], metrics: list[tuple[str, str]]):
    """One panel per metric, one row per pair: Δ (first − second) with its interval, red where significant.
    `rows`: {"label": str, metric column: (value, low, high, significant) or None}."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=len(metrics),
        shared_yaxes=True,
        horizontal_spacing=0.04,
        subplot_titles=[f"Δ {label}" for _, label in metrics],
    )
    labels = [r["label"] for r in rows]
    shown = set()
    for j, (col, label) in enumerate(metrics, 1):
        for significant in (False, True):
            picked = [r for r in rows if r.get(col) and finite(r[col][0]) and bool(r[col][3]) == significant]
            if not picked:
                continue
            values = [r[col][0] for r in picked]
            name = "significant" if significant else "not significant"
            fig.add_trace(
                go.Scatter(
                    x=values,
                    y=[r["label"] for r in picked],
                    mode="markers",
                    name=name,
                    legendgroup=name,
                    showlegend=name not in shown,
                    marker={"size": 10, "color": SIGNIFICANT if significant else PLAIN},
                    error_x=_bars(values, [r[col][1] for r in picked], [r[col][2] for r in picked]),
                    hovertemplate="%{y}<br>Δ " + label + " %{x:.3f}<extra></extra>",
                ),
                row=1,
                col=j,
            )
            shown.add(name)
        fig.add_vline(x=0, line_dash="dot", line_color="#888", row=1, col=j)
    fig.update_yaxes(categoryorder="array", categoryarray=labels[::-1], type="category")
    fig.update_layout(
        title="Paired differences (first − second) on the same items, 95% intervals",
        legend={"orientation": "h", "y": -0.12},
    )
    return fig


def strategy_robustness(winners: pd.DataFrame, columns: list[tuple[str, str]]):
    """Each robustness number (Acc_worst, PDR, …) of every winner, one point per strategy and seed, with
    compare's intervals."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=len(columns),
        subplot_titles=[
            label + (" (lower = more robust)" if key.startswith(("pdr", "format")) else " (higher = more robust)")
            for key, label in columns
        ],
    )
    labels = winners["label"].tolist()
    for j, (key, label) in enumerate(columns, 1):
        values = winners[key].tolist()
        low, high = (
            winners[f"{key}_ci_{end}"] if f"{key}_ci_{end}" in winners else [None] * len(values)
            for end in ("low", "high")
        )
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=values,
                mode="markers",
                marker={"size": 11, "color": PLAIN},
                showlegend=False,
                error_y=_bars(values, low, high),
                hovertemplate="%{x}<br>" + label + " %{y:.3f}<extra></extra>",
            ),
            row=1,
            col=j,
        )
    fig.update_layout(title="Robustness of each winner on the robustness items (95% intervals)")
    return fig


def family_dots(table: pd.DataFrame, title: str):
    """Per family: clean (open) and perturbed (filled) accuracy on the same items, and PDR, per strategy."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.1,
        subplot_titles=[
            "accuracy on the items each family perturbed: clean ○, perturbed ●",
            "PDR (1 − perturbed / clean)",
        ],
    )
    x = [f"{f} ({g})" if g else f for f, g in zip(table["family"], table["group"])]
    table = table.assign(x=x)
    for k, (strategy, part) in enumerate(table.groupby("strategy", sort=False)):
        colour, name = PALETTE[k % len(PALETTE)], str(strategy) or "prompt"
        for key, symbol, filled in (("acc_clean", "circle-open", False), ("acc_perturbed", "circle", True)):
            values = part[key].tolist()
            lows, highs = zip(*part[f"{key}_ci"]) if len(part) else ((), ())
            fig.add_trace(
                go.Scatter(
                    x=part["x"],
                    y=values,
                    mode="markers",
                    name=name,
                    legendgroup=name,
                    showlegend=filled,
                    offsetgroup=name,
                    marker={"size": 10, "symbol": symbol, "color": colour, "line": {"width": 2, "color": colour}},
                    error_y=_bars(values, lows, highs),
                    customdata=part["n_variants"],
                    hovertemplate=f"{name} · %{{x}}<br>{'perturbed' if filled else 'clean'} accuracy %{{y:.3f}} on %{{customdata}} variants<extra></extra>",
                ),
                row=1,
                col=1,
            )
        values = part["pdr"].tolist()
        lows, highs = zip(*part["pdr_ci"]) if len(part) else ((), ())
        fig.add_trace(
            go.Scatter(
                x=part["x"],
                y=values,
                mode="markers",
                name=name,
                legendgroup=name,
                showlegend=False,
                offsetgroup=name,
                marker={"size": 10, "symbol": "diamond", "color": colour},
                error_y=_bars(values, lows, highs),
                hovertemplate=f"{name} · %{{x}}<br>PDR %{{y:.3f}}<extra></extra>",
            ),
            row=2,
            col=1,
        )
    fig.update_layout(title=title, scattermode="group", scattergap=0.5)
    fig.update_yaxes(range=[-0.05, 1.05], row=1, col=1)
    return fig


def flip_map(cells: pd.DataFrame, title: str):
    """Items × families of one prompt: did a perturbation change the answer? Hover: the variants."""
    import plotly.graph_objects as go

    from promptopt.report.families import FLIPS

    items = list(dict.fromkeys(cells["item"]))
    families = list(dict.fromkeys(cells["family"]))
    z = pd.DataFrame(index=items, columns=families, dtype=float)
    hover = pd.DataFrame("", index=items, columns=families, dtype=object)
    for r in cells.itertuples():
        z.loc[r.item, r.family] = r.code
        hover.loc[r.item, r.family] = r.hover
    scale = []
    for k, colour in enumerate(FLIP_COLOURS):
        scale += [[k / 4, colour], [(k + 1) / 4, colour]]
    fig = go.Figure(
        go.Heatmap(
            z=z.to_numpy().tolist(),
            x=families,
            y=items,
            customdata=hover.to_numpy().tolist(),
            zmin=-0.5,
            zmax=3.5,
            colorscale=scale,
            xgap=1,
            ygap=1,
            hovertemplate="%{customdata}<extra></extra>",
            colorbar={"tickvals": [0, 1, 2, 3], "ticktext": list(FLIPS), "title": "answer"},
        )
    )
    fig.update_layout(
        title=title, xaxis={"side": "top"}, yaxis={"title": "item", "autorange": "reversed", "type": "category"}
    )
    return fig


def history(studies: list, strategy: str):
    """Optuna's optimization history of one strategy (every seed's study in one plot)."""
    import optuna.visualization as vis

    multi = len(studies[0].directions) > 1
    target = (lambda t: t.values[0]) if multi else None
    fig = vis.plot_optimization_history(
        studies if len(studies) > 1 else studies[0],
        target=target,
        target_name="accuracy" if multi else f"objective ({strategy})",
    )
    fig.update_layout(
        title=f"{strategy}: optimization history" + (f" ({len(studies)} seeds)" if len(studies) > 1 else "")
    )
    return fig


def pareto(study):
    import optuna.visualization as vis

    fig = vis.plot_pareto_front(study, target_names=study.metric_names or ["accuracy", "signed stability"])
    fig.update_layout(title=f"{study.study_name}: Pareto front")
    return fig


def taboo(frame: pd.DataFrame, title: str):
    import plotly.graph_objects as go

    frame = frame[frame["rank"] > 0]
    values = frame["retention"].tolist()
    fig = go.Figure(
        go.Scatter(
            x=frame["rank"],
            y=values,
            mode="lines+markers",
            name="retention",
            error_y=_bars(values, frame["retention_ci_low"], frame["retention_ci_high"]),
        )
    )
    fig.update_layout(
        title=title + " (95% Wilson intervals)",
        xaxis={"title": "taboo rank i (top-i masked)", "type": "log"},
        yaxis={"title": "conditional retention", "range": [0, 1.05]},
    )
    return fig


def proxy(correlations: pd.DataFrame):
    """Spearman ρ of each cheap signal with each measured robustness number, with bootstrap intervals."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    targets = list(dict.fromkeys(correlations["target"]))
    fig = make_subplots(rows=1, cols=len(targets), shared_yaxes=True, subplot_titles=[f"ρ with {t}" for t in targets])
    for j, target in enumerate(targets, 1):
        part = correlations[correlations["target"] == target]
        values = part["spearman"].tolist()
        colours = [SIGNIFICANT if bool(e) else PLAIN for e in part["interval_excludes_0"]]
        fig.add_trace(
            go.Scatter(
                x=values,
                y=part["signal"],
                mode="markers",
                marker={"size": 10, "color": colours},
                showlegend=False,
                error_x={
                    **_bars(values, part["ci_low"], part["ci_high"]),
                    "color": PLAIN,
                },  # one colour: bars take no list
                hovertemplate="%{y}: ρ %{x:.2f}<extra></extra>",
            ),
            row=1,
            col=j,
        )
        fig.add_vline(x=0, line_dash="dot", line_color="#888", row=1, col=j)
    fig.update_xaxes(range=[-1.05, 1.05])
    fig.update_layout(
        title="Is the signal a proxy for robustness here? Spearman ρ over prompts (red: interval excludes 0)"
    )
    return fig
