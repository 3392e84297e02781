"""`promptopt report`: one self-contained HTML file for a search or compare run — it opens offline.

Optuna's own plots (`optuna.visualization`: optimization history, Pareto front) are the anchor; only
what Optuna does not draw is drawn here with plotly (accuracy vs δ_TCB of every trial, perturbation
families, taboo retention vs rank). A single-objective study has no Pareto front of its own, so its
finished trials are copied into an in-memory two-objective study (accuracy, mean δ_TCB) and Optuna draws
that one. Each figure is embedded without plotly.js, which is inlined once: no CDN, no network.

Robustness results are read where measured: compare.csv's columns, and `evaluate --out` / `stress --out`
tables, given with --robustness / --taboo or found as robustness.csv / taboo.csv in the run directories.
"""

from __future__ import annotations

import html
import math
import time
from pathlib import Path

from promptopt.errors import UserError
from promptopt.experiments.export import Run, load_study, open_run
from promptopt.yamlio import atomic_write_text, check_output

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1150px;color:#1d2330;padding:0 1rem}
h1{font-size:1.6rem}h2{margin-top:2.2rem;border-bottom:2px solid #d8dde6;padding-bottom:.3rem}h3{margin-bottom:.3rem}
table{border-collapse:collapse;font-size:.88rem;margin:.6rem 0}th,td{border:1px solid #d8dde6;padding:.25rem .55rem;text-align:right}
th{background:#f1f4f8}td.l,th.l{text-align:left}pre{background:#f6f8fa;padding:.8rem;overflow:auto;font-size:.8rem;max-height:36rem}
.note{color:#5b6475;font-size:.9rem}.plot{margin:.4rem 0 1rem}nav a{margin-right:1rem}
"""


# --- reading the runs ---------------------------------------------------------------------------------
def runs_of(root: Path) -> tuple[list[Run], "object | None"]:
    """The finished runs under `root` (one per strategy of a compare directory) and compare.csv if any."""
    import pandas as pd

    if (root / "compare.csv").is_file():
        table = pd.read_csv(root / "compare.csv")
        names = [s for s in table["strategy"] if s != "baseline"]
        return [open_run(root, strategy=s) for s in names], table
    return [open_run(root)], None


def _trials_frame(run: Run, study):
    import pandas as pd
    from optuna.trial import TrialState

    rows = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        m = t.user_attrs.get("metrics", {})
        rows.append({"strategy": run.config.study.strategy, "trial": t.number, "state": t.state.name,
                     "accuracy": m.get("accuracy"), "tcb_mean": m.get("tcb_mean"), "tcb_geomean": m.get("tcb_geomean"),
                     "ppl_mean": m.get("ppl_mean"), "n_dev": m.get("n"), "template": t.params.get("template"),
                     "instruction": t.params.get("instruction"), "k": t.params.get("k")})
    return pd.DataFrame(rows)


# --- figures -----------------------------------------------------------------------------------------
def _fig_html(fig, height: int = 420) -> str:
    fig.update_layout(height=height, margin={"l": 60, "r": 20, "t": 50, "b": 50}, template="plotly_white")
    return '<div class="plot">' + fig.to_html(full_html=False, include_plotlyjs=False,
                                                config={"displaylogo": False, "responsive": True}) + "</div>"


def _history(study, strategy: str):
    import optuna.visualization as vis

    if len(study.directions) > 1:
        return vis.plot_optimization_history(study, target=lambda t: t.values[0], target_name="accuracy")
    fig = vis.plot_optimization_history(study, target_name=f"objective ({strategy})")
    return fig


def _pareto(study, trials):
    """Optuna's Pareto-front plot: of the study itself when it has two objectives, else of its finished
    trials re-read as (dev accuracy, mean δ_TCB), both maximized."""
    import optuna
    import optuna.visualization as vis
    from optuna.trial import TrialState, create_trial

    if len(study.directions) > 1:
        return vis.plot_pareto_front(study, target_names=study.metric_names or ["accuracy", "signed stability"])
    twin = optuna.create_study(directions=["maximize", "maximize"])
    done = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
    for row in trials.itertuples():
        if row.trial in done and _finite(row.accuracy) and _finite(row.tcb_mean):
            source = done[row.trial]
            twin.add_trial(create_trial(values=[float(row.accuracy), float(row.tcb_mean)], params=source.params,
                                        distributions=source.distributions, user_attrs={"trial": row.trial}))
    if not twin.trials:
        return None
    return vis.plot_pareto_front(twin, target_names=["dev accuracy", "mean δ_TCB"])


def _finite(value) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def _scatter(trials):
    import plotly.graph_objects as go

    fig = go.Figure()
    for strategy, group in trials.groupby("strategy", sort=False):
        group = group[group["accuracy"].notna() & group["tcb_mean"].notna() & (group["tcb_mean"] > 0)]
        fig.add_trace(go.Scatter(
            x=group["tcb_mean"], y=group["accuracy"], mode="markers", name=str(strategy),
            marker={"size": 9, "symbol": ["circle" if s == "COMPLETE" else "circle-open" for s in group["state"]]},
            text=[f"trial {t} ({s.lower()})<br>template {tp}, k={k}" for t, s, tp, k in zip(group["trial"], group["state"], group["template"], group["k"])],
            hovertemplate="%{text}<br>δ_TCB %{x:.4g}<br>accuracy %{y:.3f}<extra>" + str(strategy) + "</extra>"))
    fig.update_layout(title="Accuracy vs mean δ_TCB, every trial (dev items; open markers: pruned, partial)",
                      xaxis={"title": "mean δ_TCB (log)", "type": "log"}, yaxis={"title": "dev accuracy"})
    return fig


def _robustness_fig(frame, title: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_trace(go.Bar(x=frame["family"], y=frame["acc_clean_same_items"], name="clean (same items)"))
    fig.add_trace(go.Bar(x=frame["family"], y=frame["acc_perturbed"], name="perturbed",
                         text=[f"PDR {p:.3f}" if _finite(p) else "" for p in frame.get("pdr", [None] * len(frame))]))
    fig.update_layout(barmode="group", title=title, yaxis={"title": "accuracy", "range": [0, 1]})
    return fig


def _taboo_fig(frame, title: str):
    import plotly.graph_objects as go

    frame = frame[frame["rank"] > 0] if "rank" in frame else frame
    upper = (frame["retention_ci_high"] - frame["retention"]).tolist()
    lower = (frame["retention"] - frame["retention_ci_low"]).tolist()
    fig = go.Figure(go.Scatter(x=frame["rank"], y=frame["retention"], mode="lines+markers", name="retention",
                               error_y={"type": "data", "array": upper, "arrayminus": lower, "visible": True}))
    fig.update_layout(title=title + " (95% Wilson intervals)", xaxis={"title": "taboo rank i (top-i masked)", "type": "log"},
                      yaxis={"title": "conditional retention", "range": [0, 1.05]})
    return fig


def _compare_robustness_fig(table):
    import plotly.graph_objects as go

    fig = go.Figure()
    for column, label in (("avg_acc", "clean Acc"), ("acc_worst", "Acc_worst"), ("pdr", "PDR"), ("taboo_retention_i1", "taboo retention i=1")):
        if column in table and table[column].notna().any():
            fig.add_trace(go.Bar(x=table["strategy"], y=table[column], name=label))
    fig.update_layout(barmode="group", title="Robustness per strategy (compare.csv, test items)")
    return fig


# --- HTML pieces ---------------------------------------------------------------------------------------
def _table_html(frame, float_digits: int = 4) -> str:
    def cell(value):
        if isinstance(value, float):
            return "—" if math.isnan(value) else f"{value:.{float_digits}g}"
        return html.escape(str(value))

    head = "".join(f'<th class="l">{html.escape(str(c))}</th>' for c in frame.columns)
    body = "".join("<tr>" + "".join(f'<td class="{"" if isinstance(v, (int, float)) else "l"}">{cell(v)}</td>' for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f'<div style="overflow-x:auto"><table><tr>{head}</tr>{body}</table></div>'


def _found(paths: list[Path], runs: list[Run], root: Path, name: str) -> list[Path]:
    found = list(paths)
    for folder in [root, *(r.path for r in runs)]:
        candidate = folder / name
        if candidate.is_file() and candidate not in found:
            found.append(candidate)
    return found


def _read_csv(path: Path, needed: set[str], flag: str):
    import pandas as pd

    if not path.is_file():
        raise UserError(f"{flag} {path}: file not found")
    frame = pd.read_csv(path)
    missing = needed - set(frame.columns)
    if missing:
        raise UserError(f"{flag} {path}: missing column {sorted(missing)[0]} (expected the table `promptopt {'evaluate' if flag == '--robustness' else 'stress'} --out` writes)")
    return frame


def _card_section(card: Path | None, runs: list[Run]) -> str:
    from promptopt.yamlio import load_yaml

    path = card or next((r.path / "best_card.yaml" for r in runs if (r.path / "best_card.yaml").is_file()), None)
    if path is None:
        return '<p class="note">No card.</p>'
    if not Path(path).is_file():
        raise UserError(f"--card {path}: file not found")
    data = load_yaml(path)
    facts = ""
    if data.get("promptopt_card") == 2:
        test = (data.get("metrics") or {}).get("test") or {}
        model = data.get("model") or {}
        low, high = (test.get("accuracy_ci95") or [None, None])[:2]
        facts = (f"<p>Card version 2 · model <code>{html.escape(str(model.get('spec')))}</code> "
                 f"({html.escape(str(model.get('weights_method')))} {html.escape(str(model.get('weights_sha256', ''))[:12])}) · "
                 f"test accuracy {test.get('accuracy', float('nan')):.4f} [{low or float('nan'):.4f}, {high or float('nan'):.4f}] "
                 f"on {test.get('n')} items · <code>promptopt verify {html.escape(str(path))}</code> re-checks it</p>")
    else:
        facts = (f'<p class="note">A version-1 card (the search\'s best card): '
                 f"<code>promptopt export {html.escape(str(runs[0].path.parent if len(runs) > 1 else runs[0].path))} --out card.yaml</code> "
                 "writes version 2 with fingerprints and intervals.</p>")
    return f"<p><code>{html.escape(str(path))}</code></p>{facts}<pre>{html.escape(Path(path).read_text(encoding='utf-8'))}</pre>"


def build_report(run_dir: str | Path, *, card: Path | None = None, robustness: list[Path] = (), taboo: list[Path] = ()) -> str:
    import pandas as pd
    from plotly.offline import get_plotlyjs

    root = Path(run_dir)
    runs, compare = runs_of(root)
    robustness_files = _found([Path(p) for p in robustness], runs, root, "robustness.csv")
    taboo_files = _found([Path(p) for p in taboo], runs, root, "taboo.csv")
    robustness_frames = [(p, _read_csv(p, {"family", "acc_clean_same_items", "acc_perturbed"}, "--robustness")) for p in robustness_files]
    taboo_frames = [(p, _read_csv(p, {"rank", "retention", "retention_ci_low", "retention_ci_high"}, "--taboo")) for p in taboo_files]
    card_html = _card_section(card, runs)
    studies = [(run, load_study(run)) for run in runs]

    task = runs[0].config.data.task
    sections = [f"<h1>promptopt report · {html.escape(Path(task).stem)} · {html.escape(runs[0].config.model.spec)}</h1>",
                f'<p class="note">{html.escape(str(root))} · written {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())} · '
                "dev = search items, test = held-out items</p>",
                '<nav><a href="#comparison">Comparison</a><a href="#trials">Trials</a><a href="#scatter">Accuracy vs δ_TCB</a>'
                '<a href="#robustness">Robustness</a><a href="#card">Card</a></nav>']

    sections.append('<h2 id="comparison">Comparison</h2>')
    if compare is not None:
        shown = [c for c in ("strategy", "n_test", "avg_acc", "avg_tcb", "tcb_geomean", "avg_ppl", "acc_var_pert", "pdr", "acc_worst",
                             "acc_worst_family", "taboo_retention_i1", "best_trial", "wall_seconds") if c in compare.columns]
        sections.append('<p class="note">Winners of each strategy and the task\'s default prompt (baseline) on the same test items.</p>')
        sections.append(_table_html(compare[shown]))
    else:
        run = runs[0]
        rows = [{"split": split, "n": s.get("n"), "accuracy": s.get("accuracy"),
                 "ci95": "[" + ", ".join(f"{v:.3f}" for v in s.get("accuracy_ci95", [])) + "]",
                 "tcb_mean": s.get("tcb_mean"), "tcb_geomean": s.get("tcb_geomean"), "ppl_mean": s.get("ppl_mean")}
                for split, s in (("dev", run.summary.get("dev", {})), ("test", run.summary.get("test", {})))]
        sections.append(f"<p>{html.escape(run.config.study.strategy)} search, best trial #{run.summary.get('best_trial')}</p>")
        sections.append(_table_html(pd.DataFrame(rows)))

    sections.append('<h2 id="trials">Trial history and Pareto front per strategy</h2>'
                    '<p class="note">Drawn by optuna.visualization. Single-objective strategies: the Pareto front of '
                    "their finished trials over (dev accuracy, mean δ_TCB).</p>")
    frames = []
    for run, study in studies:
        trials = _trials_frame(run, study)
        frames.append(trials)
        name = run.config.study.strategy
        sections.append(f"<h3>{html.escape(name)} · study {html.escape(study.study_name)} · {len(trials)} finished trials</h3>")
        history = _history(study, name)
        history.update_layout(title=f"{name}: optimization history")
        sections.append(_fig_html(history, 380))
        pareto = _pareto(study, trials)
        if pareto is not None:
            pareto.update_layout(title=f"{name}: Pareto front")
        sections.append(_fig_html(pareto, 380) if pareto is not None else '<p class="note">No complete trial with metrics.</p>')
    trials_all = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    sections.append('<h2 id="scatter">Accuracy vs δ_TCB</h2>')
    sections.append(_fig_html(_scatter(trials_all), 480) if len(trials_all) else '<p class="note">No trials.</p>')

    sections.append('<h2 id="robustness">Robustness</h2>')
    measured = False
    if compare is not None and any(c in compare.columns and compare[c].notna().any() for c in ("pdr", "acc_worst", "taboo_retention_i1")):
        sections.append(_fig_html(_compare_robustness_fig(compare), 380))
        measured = True
    for path, frame in robustness_frames:
        sections.append(_fig_html(_robustness_fig(frame, f"Perturbation families · {path}"), 400))
        sections.append(_table_html(frame[[c for c in ("family", "n_variants", "acc_clean_same_items", "acc_perturbed", "pdr",
                                                        "tcb_clean_mean", "tcb_perturbed_mean") if c in frame.columns]]))
        measured = True
    for path, frame in taboo_frames:
        if frame["retention"].notna().any():
            sections.append(_fig_html(_taboo_fig(frame, f"Taboo retention vs rank · {path}"), 400))
        else:
            sections.append(f'<p class="note">Taboo retention · {html.escape(str(path))}: undefined at every rank '
                            "(no item was answered correctly without taboo).</p>")
        measured = True
    if not robustness_frames:
        sections.append('<p class="note">Perturbation families: not measured here. '
                        "<code>promptopt evaluate --task T --prompt CARD --out RUN_DIR/robustness</code> writes robustness.csv, which the report picks up.</p>")
    if not taboo_frames:
        sections.append('<p class="note">Taboo retention vs rank: not measured here (generative tasks). '
                        "<code>promptopt stress --task T --prompt CARD --out RUN_DIR/taboo</code> writes taboo.csv.</p>")
    if not measured:
        sections.append('<p class="note">compare.csv has no robustness columns (run with --suite none, or a single search).</p>')

    sections.append('<h2 id="card">Card</h2>')
    sections.append(card_html)

    title = html.escape(f"promptopt report · {Path(task).stem}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style>'
            f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
            + "\n".join(sections) + "</body></html>\n")


def write_report(run_dir: str | Path, *, out: str | Path | None = None, card: Path | None = None,
                 robustness: list[Path] = (), taboo: list[Path] = ()) -> Path:
    """Build the whole page in memory, then write it atomically."""
    out = Path(out) if out is not None else Path(run_dir) / "report.html"
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; give a file name")
    check_output(out, folder=False, what="--out")
    page = build_report(run_dir, card=card, robustness=robustness, taboo=taboo)
    atomic_write_text(out, page)
    return out


__all__ = ["build_report", "runs_of", "write_report"]
