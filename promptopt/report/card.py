"""The chosen card: the one `promptopt export RUN_DIR` writes (version 2), built by export itself into a
temporary folder, so the report can never show another card than export's. It loads the model (fingerprints
and the token-id check need the tokenizer; scores come from the run's result cache). Nothing is written into
the run directory except what export's scoring adds to the run's own result cache."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from promptopt import progress
from promptopt.errors import UserError
from promptopt.report.numbers import esc, estimate, finite, note, num, sig


@dataclass
class Chosen:
    card: dict | None
    text: str  # the YAML as export writes it ('' when none)
    strategy: str | None = None
    seed: int | None = None
    selected_by: str | None = None  # the search's own winner rule, from compare
    path: Path | None = None  # a card given with --card
    problem: str | None = None  # why there is no card
    exported: object = None  # export's own result (workflows.export.Exported): its warnings, the default prompt
    root: Path | None = None  # the directory `promptopt export` reads (rounds: the last round's)


def chosen_card(source, card: Path | None = None) -> Chosen:
    if card is not None:
        from promptopt.yamlio import load_yaml

        if not Path(card).is_file():
            raise UserError(f"--card {card}: file not found")
        return Chosen(load_yaml(card), Path(card).read_text(encoding="utf-8"), path=Path(card))
    if not source.studies:
        return Chosen(None, "", problem="no search in this directory, so no card to export")
    from promptopt.workflows.export import export_run

    root = source.studies[-1].run.path if source.kind == "rounds" else source.root  # rounds: the last round's winner
    progress.step(f"the card `promptopt export {source.root}` writes, built in a temporary folder (loads the model)")
    try:
        with tempfile.TemporaryDirectory(prefix="promptopt-report-") as tmp:
            exported = export_run(root, out=Path(tmp) / "card.yaml")
            text = (Path(tmp) / "card.yaml").read_text(encoding="utf-8")
    except Exception as exc:  # the report still renders; the line says why and what to run
        first = str(exc).splitlines()[0] if str(exc) else ""
        return Chosen(None, "", problem=f"{type(exc).__name__}: {first}", root=root)
    row = exported.run.compare_row or {}
    seed = row.get("seed")
    return Chosen(
        exported.card,
        text,
        strategy=exported.run.config.study.strategy,
        seed=int(seed) if finite(seed) else 0,
        selected_by=row.get("selected_by") or exported.run.summary.get("selection"),
        exported=exported,
        root=root,
    )


def _metric_rows(split: str, m: dict) -> str:
    cells = [f'<td class="l">{esc(split)}</td>', f"<td>{m.get('n', '—')}</td>"]
    low, high = (m.get("accuracy_ci95") or [None, None])[:2]
    cells.append(f"<td>{esc(estimate(m.get('accuracy'), low, high))}</td>")
    cells.append(f"<td>{esc(sig(m.get('tcb_geomean')))}</td>")  # not the mean: pmi can make one item all of it
    for key in ("ppl_mean",):
        low, high = (m.get(f"{key}_ci95") or [None, None])[:2]
        cells.append(
            f"<td>{esc(sig(m.get(key)))} {esc(f'[{sig(low)}, {sig(high)}]') if finite(low) and finite(high) else ''}</td>"
        )
    return "<tr>" + "".join(cells) + "</tr>"


def card_section(chosen: Chosen, root: Path, strategies: list[str] = ()) -> str:
    if chosen.card is None:
        return note(
            f"No card: {esc(chosen.problem)}. <code>promptopt export {esc(root)} --out card.yaml</code> writes it."
        )
    card = chosen.card
    if card.get("promptopt_card") != 2:
        return (
            note(
                f"{esc(chosen.path)} is a version-1 card (a search's best_card.yaml); "
                f"<code>promptopt export {esc(root)} --out card.yaml</code> writes version 2 with fingerprints and intervals."
            )
            + f"<pre>{esc(chosen.text)}</pre>"
        )
    search, model, metrics = card.get("search") or {}, card.get("model") or {}, card.get("metrics") or {}
    origin = (
        f"the card given with --card ({esc(chosen.path)})"
        if chosen.path
        else f"the card <code>promptopt export {esc(root)}</code> writes"
    )
    picked = (
        f"export picked strategy <b>{esc(search.get('strategy'))}</b> (of {esc(', '.join(strategies))})"
        if len(strategies) > 1
        else f"strategy <b>{esc(search.get('strategy'))}</b>"
    )
    how = [
        picked,
        f"study {esc(search.get('study'))}",
        f"trial #{esc(search.get('trial'))}",
        f"sampler seed {esc(search.get('seed'))}",
        "the search's winner" if search.get("winner") else "not the search's winner",
    ]
    rule = search.get("selected_by") or search.get("selection") or chosen.selected_by
    lines = [
        f"<p>This is {origin}: version 2 · model <code>{esc(model.get('spec'))}</code> "
        f"({esc(model.get('weights_method'))} {esc(str(model.get('weights_sha256', ''))[:12])}…, {esc(model.get('dtype'))}, "
        f"{esc(model.get('device'))}).</p>",
        "<p><b>How it was chosen:</b> "
        + ", ".join(how)
        + (f"; the search picked it by: {esc(rule)}" if rule else "")
        + ".</p>",
    ]
    rows = "".join(_metric_rows(split, metrics[split]) for split in ("dev", "test") if metrics.get(split))
    lines.append(
        '<div class="tablewrap"><table id="card-metrics"><thead><tr><th class="l">Measured on</th><th>n</th>'
        "<th>Accuracy [95% CI]</th><th>geomean δ_TCB</th><th>mean PPL [95% CI]</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
    )
    robustness = metrics.get("robustness")
    if robustness:
        parts = []
        for key, label in (("acc_worst", "Acc_worst"), ("pdr", "PDR")):
            low, high = (robustness.get(f"{key}_ci95") or [None, None])[:2]
            if finite(robustness.get(key)):
                parts.append(f"{label} {estimate(robustness[key], low, high)}")
        if robustness.get("acc_worst_family"):
            parts.append(f"worst family {robustness['acc_worst_family']}")
        if finite(robustness.get("taboo_retention_i1")):
            parts.append(f"taboo retention (i=1) {num(robustness['taboo_retention_i1'], 3)}")
        lines.append(f"<p><b>Robustness</b> (compare's measurement of this winner): {esc('; '.join(parts))}.</p>")
    else:
        lines.append(
            note("The card records no robustness numbers (compare ran without a suite, or this is not the winner).")
        )
    instruction = card.get("instruction") or ""
    said = f"<q>{esc(instruction[:300])}</q>" if instruction else "none"
    lines.append(
        f"<p><b>Prompt:</b> instruction {said} · {len(card.get('exemplars') or [])} exemplar(s) · "
        f"{esc((card.get('rendering') or {}).get('mode'))} rendering · <code>promptopt verify card.yaml</code> re-checks it.</p>"
    )
    lines.append(f"<details><summary>The whole card (YAML)</summary><pre>{esc(chosen.text)}</pre></details>")
    return "".join(lines)
