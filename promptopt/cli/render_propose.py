"""What `propose` (and `search`/`compare --propose`, `search --rounds`) print about proposals: what joined the
space, what screening said, every rejected text with its reason, and where the record went."""

from __future__ import annotations

from pathlib import Path

from promptopt.cli.render import console, print_search_result

WIDTH = 110  # characters of a proposal's text in a line


def proposals_lines(proposals, *, show_rejected: bool) -> list[str]:
    """The lines, plain text (tests read them)."""
    from promptopt.workflows.propose.filters import one_line  # here: the propose package imports torch

    written = "read back from the cache" if proposals.reused else f"{proposals.attempts} attempts"
    if proposals.seconds and proposals.tokens:
        written += f", {proposals.tokens} tokens in {proposals.seconds:.0f} s ({proposals.tokens / proposals.seconds:.1f} tokens/s)"
    screening = proposals.screening
    filtered = screening.results if screening is not None else proposals.accepted
    drops = {k: v for k, v in sorted(proposals.drops.items()) if k != "worse_than_control"}
    dropped = ", ".join(f"{reason} {count}" for reason, count in drops.items()) or "none"
    lines = [
        f"proposals: {len(filtered)} of {proposals.attempts} written passed the filters ({written}); dropped: {dropped}"
    ]
    if screening is not None:
        lines.append(
            f"screening: {len(proposals.accepted)} of {len(screening.results)} proposals passed screening against "
            f"{screening.control_label} ({screening.control_accuracy:.3f} on the first {screening.first_items} dev items, "
            f"where it was chosen; rejected when less accurate on the first {screening.items} and one-sided "
            f"{screening.test} p < 0.05); {screening.scored_items} item scorings, {screening.seconds:.1f} s"
            + (" (read back)" if screening.reused else "")
        )
    if not proposals.accepted:
        stage = "screening" if screening is not None and screening.results else "the filters"
        total = len(screening.results) if screening is not None and screening.results else proposals.attempts
        lines.append(f"{len(proposals.accepted)} of {total} proposals passed {stage}: the space is unchanged")
    if proposals.task_summary:
        lines.append(f"task summary the proposer wrote: {proposals.task_summary}")
    verdicts = {r["name"]: r for r in screening.results} if screening is not None else {}
    for p in proposals.accepted:
        v = verdicts.get(p.name)
        numbers = f"  [accuracy {v['accuracy']:.3f} on {v['items']} dev items, p = {v['p']:.2g}]" if v else ""
        lines.append(f"  + {p.name}: {one_line(p.text, WIDTH)}{numbers}")
    if proposals.rejected:
        if show_rejected:
            lines.append(f"rejected ({len(proposals.rejected)}):")
            for r in proposals.rejected:
                why = f" ({r['why']})" if r.get("why") else ""
                lines.append(f"  - [{r['reason']}] {one_line(r['text'], WIDTH) or '(empty)'}{why}")
        else:
            lines.append(f"{len(proposals.rejected)} rejected texts: --show-rejected prints them")
    return lines


def print_proposals(proposals, space_path, *, show_rejected: bool = True, record: Path | None = None) -> None:
    for line in proposals_lines(proposals, show_rejected=show_rejected):
        console.print(line, markup=False, highlight=False)
    from promptopt.workflows.propose.space_file import record_path

    record = record or record_path(space_path)
    console.print(f"wrote {space_path} and {record} (every text, kept or not, with its reason)", markup=False)


def print_rounds(result, *, show_rejected: bool = False) -> None:
    for r, (res, made) in enumerate(zip(result.rounds, result.proposals)):
        added = f"+{len(made.accepted)} proposed" if made is not None else "the given space"
        console.print(
            f"round {r} ({added}): best trial #{res.best_number} instruction={res.best_params.get('instruction')!r} "
            f"dev {res.dev['accuracy']:.3f} test {res.test['accuracy']:.3f}",
            markup=False,
        )
        if made is not None:
            print_proposals(made, res.config.study.space, show_rejected=show_rejected)
    print_search_result(result.rounds[-1])
    console.print(
        f"wrote {result.card_path} (the last round's winner), trials.parquet/.csv over all rounds and rounds.json"
    )
