"""`promptopt propose` and `search/compare --propose`: a space file with the proposals that passed the filters and
screening, and beside it a JSON record naming every text, kept or not, with the reason (`record_path`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from promptopt import progress
from promptopt.study.space import SearchSpace
from promptopt.workflows.propose import screen as screening
from promptopt.workflows.propose.proposer import Proposals, ProposeRequest, propose
from promptopt.workflows.propose.space_file import read_space, record_path, with_proposals, write_space
from promptopt.yamlio import atomic_write_text


@dataclass
class ProposedSpace:
    path: Path
    space: SearchSpace
    proposals: Proposals
    record: Path | None = None  # the JSON beside the space: every text and why it was kept or not


def scored_instructions(session, space: SearchSpace) -> list[tuple[str, str, float]]:
    """(name, text, dev accuracy) of each of the space's instructions on the task's default prompt (its
    template and shots): the history a standalone `history` proposal starts from."""
    base = session.data.default_prompt()
    dev = session.items("dev")
    out = []
    for name, text in progress.iterate(list(space.instructions.items()), "scoring the space's instructions on dev"):
        table = session.scorer.score(dataclasses.replace(base, instruction=text), dev).table
        out.append((name, text, float(table["correct"].mean())))
    return out


def hand_written(space: SearchSpace) -> dict[str, str]:
    """The space's own instructions: those no proposal wrote (a space grown by earlier rounds keeps both)."""
    own = {k: v for k, v in space.instructions.items() if k not in space.proposals}
    return own or dict(space.instructions)


def propose_space(
    session,
    request: ProposeRequest,
    *,
    space: str | None,
    out: str | Path,
    cache_dir: str | Path | None,
    history: list[tuple[str, str, float]] | None = None,
    record: Path | None = None,
) -> ProposedSpace:
    """Propose `request.n` instructions beside those of `space` (default: the task's built-in space), screen the
    ones the filters let through on `request.screen_items` dev items (0: no screening) and write the extended space to
    `out`, with the record of every text beside it (`record`, default `record_path(out)`). The space is checked
    against the task first, so a wrong space fails before anything is generated."""
    raw, base = read_space(space or session.data.spec.name)
    base.check_against(session.data)
    if request.mode == "history" and history is None:
        history = scored_instructions(session, base)
    label_words = [w for t in base.templates.values() for w in (t.label_words or ())]
    proposals = propose(
        request,
        session=session,
        instructions=base.instructions,
        template_label_words=label_words,
        history=history,
        cache_dir=cache_dir,
    )
    through_filters = len(proposals.accepted)
    if request.screen_items and proposals.accepted:
        own = hand_written(base)
        key = screening.screen_key(session, proposals.key, own, request.screen_items)
        verdicts = screening.screen(
            session, own, proposals.accepted, items=request.screen_items, key=key, cache_dir=cache_dir
        )
        proposals = screening.apply(proposals, verdicts)
        progress.step(
            f"{len(proposals.accepted)} of {through_filters} proposals passed screening "
            f"({verdicts.seconds:.1f} s{', read back' if verdicts.reused else ''})"
        )
    note = (
        f"Plus {len(proposals.accepted)} instructions proposed by {request.mode} (round {request.round}, seed {request.seed}; "
        "promptopt propose)."
        if proposals.accepted
        else ""
    )
    written = write_space(with_proposals(raw, proposals, note), out)
    record = Path(record) if record is not None else record_path(out)
    atomic_write_text(record, json.dumps(record_of(proposals, request, through_filters), indent=1, ensure_ascii=False))
    return ProposedSpace(Path(out), written, proposals, record)


def record_of(proposals: Proposals, request: ProposeRequest, through_filters: int) -> dict:
    """The JSON beside the space: what was asked, every text with its fate, screening's control and cost."""
    verdicts = {r["name"]: r for r in proposals.screening.results} if proposals.screening is not None else {}
    return {
        "request": dataclasses.asdict(request),
        "attempts": proposals.attempts,
        "through_filters": through_filters,
        "accepted": [
            {"name": p.name, "text": p.text, "screening": verdicts.get(p.name), "provenance": p.provenance}
            for p in proposals.accepted
        ],
        "rejected": proposals.rejected,
        "drops": proposals.drops,
        "proposer_seconds": proposals.seconds,
        "proposer_tokens": proposals.tokens,
        "reused": proposals.reused,
        "screening": (
            {k: v for k, v in proposals.screening.to_json().items() if k != "results"}
            | {"reused": proposals.screening.reused}
            if proposals.screening is not None
            else None
        ),
        "task_summary": proposals.task_summary,
    }
