"""`promptopt propose` and `search/compare --propose`: a space file with N proposed instructions."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from promptopt.experiments.propose.proposer import Proposals, ProposeRequest, propose
from promptopt.experiments.propose.space_file import read_space, with_proposals, write_space
from promptopt.search.space import SearchSpace


@dataclass
class ProposedSpace:
    path: Path
    space: SearchSpace
    proposals: Proposals


def scored_instructions(session, space: SearchSpace) -> list[tuple[str, str, float]]:
    """(name, text, dev accuracy) of each of the space's instructions on the task's default prompt (its
    template and shots): the history a standalone `history` proposal starts from."""
    base = session.data.default_prompt()
    dev = session.items("dev")
    out = []
    for name, text in space.instructions.items():
        table = session.scorer.score(dataclasses.replace(base, instruction=text), dev).table
        out.append((name, text, float(table["correct"].mean())))
    return out


def propose_space(
    session,
    request: ProposeRequest,
    *,
    space: str | None,
    out: str | Path,
    cache_dir: str | Path | None,
    history: list[tuple[str, str, float]] | None = None,
) -> ProposedSpace:
    """Propose `request.n` instructions beside those of `space` (default: the task's built-in space) and write
    the extended space to `out`. The space is checked against the task first, so a wrong space fails before
    anything is generated."""
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
    note = (
        f"Plus {len(proposals.accepted)} instructions proposed by {request.mode} (round {request.round}, seed {request.seed}; "
        "promptopt propose)."
    )
    written = write_space(with_proposals(raw, proposals, note), out)
    return ProposedSpace(Path(out), written, proposals)
