"""`promptopt report RUN_DIR`: one self-contained HTML file that answers the run's question first.

A compare or search directory opens with the recommendation (recommend.py): the card to ship, chosen by export's
own rule on dev numbers, against the default prompt and the next best, the export command and export's warnings.
Then a compare's verdict, one sentence per pair of strategies from compare_paired.csv,
then the paired table and its forest plot, the per-strategy table, robustness per family, the card `export`
would write, and the search itself. A search, `evaluate --out`, `stress` sweep or `diagnose proxy` folder
gets the same sections, each saying in one line when it has nothing measured. Numbers come from the files
the run wrote (`source.py`); only per-family intervals are computed here, from robustness_items.parquet.

Offline: plotly.js is inlined once, every figure is embedded without it, PNGs as data URLs; no CDN.
"""

from __future__ import annotations

import time
from pathlib import Path

from promptopt import progress
from promptopt.errors import UserError
from promptopt.report.card import card_section, chosen_card
from promptopt.report.numbers import cell_estimate, esc, note, sig, table, td, tr
from promptopt.report.recommend import recommendation
from promptopt.report.risk import risk_section
from promptopt.report.sections import (
    evaluate_sentence,
    incumbent_sentence,
    proxy_section,
    robustness_section,
    rounds_sentence,
    search_sentence,
    sweep_section,
    sweep_sentence,
)
from promptopt.report.source import Source, read_source
from promptopt.report.trials import search_section
from promptopt.report.verdict import paired_section, strategy_section, verdict_compare, winners_of
from promptopt.yamlio import atomic_write_text, check_output

MAX_BYTES = 6_000_000
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5rem auto;max-width:1180px;color:#1d2330;padding:0 1rem;line-height:1.45}
h1{font-size:1.55rem;margin-bottom:.2rem}h2{margin-top:2.2rem;border-bottom:2px solid #d8dde6;padding-bottom:.3rem}h3{margin:1.2rem 0 .3rem}
#verdict{background:#f6f8fb;border:1px solid #d8dde6;border-radius:8px;padding:.4rem 1.2rem 1rem}#verdict h2{border:0;margin-top:.6rem}
#recommendation{background:#eef6ee;border:2px solid #7fb77e;border-radius:8px;padding:.2rem 1.2rem .6rem}#recommendation h2{border:0;margin-top:.5rem}
.nothing-beats{color:#8a1f11}ul.warnings{color:#8a1f11;font-weight:600;padding-left:1.2rem}pre.command{max-height:none;font-size:.9rem;margin:.3rem 0}
.headline{font-size:1.15rem;font-weight:600}li.verdict{margin:.35rem 0;font-size:1.02rem}
.tablewrap{overflow-x:auto}table{border-collapse:collapse;font-size:.86rem;margin:.6rem 0}
th,td{border:1px solid #d8dde6;padding:.3rem .55rem;text-align:right;vertical-align:top}th{background:#f1f4f8;font-weight:600}
td{white-space:nowrap}td.l,th.l{text-align:left;white-space:normal}.ci{color:#5b6475;font-size:.8rem;white-space:nowrap}.sig{color:#b03a2e;font-weight:600}
pre{background:#f6f8fa;padding:.8rem;overflow:auto;font-size:.78rem;max-height:36rem}ul.small{font-size:.88rem}
.note{color:#5b6475;font-size:.9rem}.plot{margin:.4rem 0 1rem}nav a{margin-right:1rem}details{margin:.6rem 0}summary{cursor:pointer;color:#2b5797}
"""


def runs_of(root: Path):
    """The finished search runs under `root` (one per strategy and seed of a compare) and compare.csv if any."""
    source = read_source(root)
    return [s.run for s in source.studies], source.compare


def _title(source: Source) -> tuple[str, str]:
    config = source.config
    if config is not None:
        return Path(config.data.task).stem, config.model.spec
    if source.sweep is not None:
        return "stress sweep", ", ".join(dict.fromkeys(map(str, source.sweep["model"])))
    side = next((side for _, _, side in source.families if side), {})
    return str(side.get("suite") or source.kind), source.root.name


def _verdict(source: Source) -> str:
    if source.kind == "compare":
        kept = [
            f"<li>{esc(f'{st.strategy} (seed {st.seed})')}: {esc(incumbent_sentence(st.run.summary))}</li>"
            for st in source.studies
            if incumbent_sentence(st.run.summary)
        ]
        searches = f"<h3>Each search against the prompt it started from</h3><ul>{''.join(kept)}</ul>" if kept else ""
        return verdict_compare(source.paired, source.summary) + searches
    if source.kind == "search":
        return f'<p class="headline">{search_sentence(source)}</p>'
    if source.kind == "rounds":
        return f'<p class="headline">{rounds_sentence(source)}</p>'
    if source.kind == "sweep":
        return f'<p class="headline">{esc(sweep_sentence(source.sweep))}</p>'
    if source.kind == "evaluate":
        sentences = [evaluate_sentence(side) for _, _, side in source.families if side]
        return (
            f'<p class="headline">Robustness of one prompt (evaluate). {esc(" ".join(sentences))}</p>'
            if sentences
            else '<p class="headline">Robustness of one prompt (evaluate): per-family numbers below.</p>'
        )
    return '<p class="headline">diagnose proxy tables: is a cheap signal a proxy for robustness here? See below.</p>'


def _search_table(source: Source) -> str:
    """A single search (or the last round of `search --rounds`): its winner on dev and test items."""
    summary = source.studies[-1].run.summary
    rows = []
    for split in ("dev", "test"):
        s = summary.get(split) or {}
        low, high = (s.get("accuracy_ci95") or [None, None])[:2]
        rows.append(
            tr(
                [
                    td(split, left=True),
                    td(str(s.get("n"))),
                    cell_estimate(s.get("accuracy"), low, high, col="accuracy"),
                    td(sig(s.get("tcb_geomean"))),  # not the mean: a rule such as pmi can make one item all of it
                    td(sig(s.get("ppl_mean"))),
                ]
            )
        )
    how = summary.get("selection")
    return table(["Items", "n", "Accuracy", "geomean δ_TCB", "mean PPL"], rows, table_id="strategies-table") + (
        note(f"Winner chosen by: {esc(how)}") if how else ""
    )


def build_report(
    run_dir: str | Path, *, card: Path | None = None, robustness: list[Path] = (), taboo: list[Path] = ()
) -> str:
    from plotly.offline import get_plotlyjs

    source = read_source(run_dir, robustness=[Path(p) for p in robustness], taboo=[Path(p) for p in taboo])
    progress.step(f"read {run_dir}")  # after reading: a folder that is not a run is one error line, nothing before it
    chosen = chosen_card(source, card)
    winners = winners_of(source.candidates, source.compare) if source.compare is not None else None
    task, model = _title(source)
    progress.step("the recommendation, the verdict and the figures")
    first = recommendation(source, chosen)
    sections = [
        *([("recommendation", "Recommendation", first)] if first else []),
        ("verdict", "Verdict", _verdict(source)),
        (
            "paired",
            "Paired differences",
            paired_section(source.paired, source.summary)
            if source.kind == "compare"
            else note("Nothing paired: this is not a compare directory."),
        ),
        (
            "strategies",
            "Strategies",
            strategy_section(source.compare, source.candidates, source.summary)
            if source.kind == "compare"
            else _search_table(source)
            if source.kind in ("search", "rounds")
            else note("No search strategy here."),
        ),
        ("robustness", "Robustness per family and strategy", robustness_section(source, chosen, winners)),
        ("card", "The chosen card", card_section(chosen, source.root, source.strategies)),
        ("search", "Search", search_section(source, chosen)),
        ("proxy", "Is a cheap signal a proxy for robustness? (diagnose proxy)", proxy_section(source)),
        ("risk", "Flagging fragile answers: risk–coverage (diagnose risk-coverage)", risk_section(source)),
        ("sweep", "Stress sweep (taboo paper, Figures 1, 3, 8)", sweep_section(source)),
    ]
    nav = "".join(f'<a href="#{ident}">{esc(title.split(" (")[0])}</a>' for ident, title, _ in sections)
    body = "".join(
        f'<section id="{ident}"><h2>{esc(title)}</h2>{content}</section>' for ident, title, content in sections
    )
    head = (
        f"<h1>promptopt report · {esc(task)} · {esc(model)}</h1>"
        f'<p class="note">{esc(source.root)} · a {esc(source.kind)} directory · written '
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}</p><nav>{nav}</nav>"
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>promptopt report · {esc(task)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style>'
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>{head}{body}</body></html>\n'
    )


def write_report(
    run_dir: str | Path,
    *,
    out: str | Path | None = None,
    card: Path | None = None,
    robustness: list[Path] = (),
    taboo: list[Path] = (),
) -> Path:
    """Build the whole page in memory, then write it atomically."""
    out = Path(out) if out is not None else Path(run_dir) / "report.html"
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; give a file name")
    check_output(out, folder=False, what="--out")  # before the page is built
    page = build_report(run_dir, card=card, robustness=robustness, taboo=taboo)
    progress.step(f"writing {out} ({len(page) / 1e6:.1f} MB)")
    atomic_write_text(out, page)
    return out


__all__ = ["MAX_BYTES", "build_report", "runs_of", "write_report"]
