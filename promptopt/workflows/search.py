"""A search on a session, as `promptopt search` runs it: one study with the perturbed variants its strategy needs,
OPRO-style rounds, and the proposal request built from the CLI's options (or `promptopt propose`'s space file)."""

from __future__ import annotations

from pathlib import Path

from promptopt.errors import UserError
from promptopt.workflows.session import Session
from promptopt.yamlio import check_out_files

ROBUST_SEARCH_SUITE = "cheap"  # the families a `robust` search looks at (seen by its winners)


# --- search --------------------------------------------------------------------------------------
def variant_expander(strategies, search_suite: str = ROBUST_SEARCH_SUITE) -> object | None:
    """The expander a set of strategies needs (the `robust` strategy scores perturbed dev variants), else None."""
    from promptopt.study import get_strategy

    if not any(get_strategy(name).needs_variants for name in strategies):
        return None
    from promptopt.robustness import VariantExpander

    return VariantExpander(search_suite)


def search(config, request=None, *, search_suite: str | None = ROBUST_SEARCH_SUITE, show_progress: bool = True):
    """`promptopt search`: one study, with the perturbed variants its strategy needs (from `search_suite`), over
    the space plus `request.n` proposed instructions when a request is given -> (SearchResult, Proposals or None)."""
    from promptopt.study import get_strategy, run_search

    if search_suite is None and get_strategy(config.study.strategy).needs_variants:
        raise UserError(f"--search-suite none: strategy '{config.study.strategy}' trains on a search suite's variants")
    expand = variant_expander([config.study.strategy], search_suite) if search_suite else None
    if request is None:
        return run_search(config, expand=expand, show_progress=show_progress), None
    from promptopt.workflows.propose.rounds import search_with_proposals

    return search_with_proposals(config, request, expand=expand, show_progress=show_progress)


def search_rounds(
    config, request, rounds: int, *, search_suite: str | None = ROBUST_SEARCH_SUITE, show_progress: bool = True
):
    """`promptopt search --rounds R`: OPRO-style rounds (promptopt.workflows.propose.rounds)."""
    from promptopt.workflows.propose.rounds import search_rounds as run_rounds

    expand = variant_expander([config.study.strategy], search_suite) if search_suite else None
    return run_rounds(config, request, rounds=rounds, expand=expand, show_progress=show_progress)


# --- propose -------------------------------------------------------------------------------------
PROPOSALS_PER_ROUND = 4  # search --rounds R without --propose N


def propose_request(
    n: int | None,
    mode: str,
    proposer: str | None,
    seed: int,
    rounds: int,
    *,
    search_suite: str | None = ROBUST_SEARCH_SUITE,
    standalone: bool = False,
    screen_items: int | None = None,
):
    """The proposal request of the CLI options, or None when nothing is to be proposed. A mode given
    without --propose is an error (it would silently do nothing)."""
    from promptopt.workflows.propose import ProposeRequest

    if n is None and rounds > 1:  # rounds alone: round 0 searches the space as it is, later rounds propose from history
        if mode not in ("grounded", "history"):
            raise UserError(f"--propose-mode {mode}: give --propose N (how many instructions round 0 adds)")
        n, mode = PROPOSALS_PER_ROUND, "history"
    if n is None:
        if mode != "grounded":
            raise UserError(f"--propose-mode {mode}: give --propose N (how many instructions to add)")
        if screen_items is not None:
            raise UserError("--screen-items: give --propose N (nothing is proposed, so nothing is screened)")
        return None
    if mode == "history" and not standalone and rounds < 2:
        raise UserError("--propose-mode history proposes from a search's scored instructions: use --rounds R (R ≥ 2)")
    if mode == "reflect" and not search_suite:
        raise UserError(
            "--propose-mode reflect shows answers that the search suite's perturbations change: give a --search-suite"
        )
    extra = {} if screen_items is None else {"screen_items": screen_items}
    return ProposeRequest(
        n=n, mode=mode, proposer=proposer, seed=seed, search_suite=search_suite or ROBUST_SEARCH_SUITE, **extra
    )


def propose(
    *,
    task: str,
    model: str,
    device: str,
    dtype,
    quantize,
    subsets,
    dev_limit,
    test_limit,
    batch_size: int | str,
    request,
    space: str | None,
    out: Path,
    cache: Path | None,
    trust_task_code: bool = False,
):
    """`promptopt propose`: the space plus N proposals, written to `out` (a YAML file)."""
    from promptopt.models import ModelConfig
    from promptopt.models.load import cache_root
    from promptopt.tasks import DataConfig
    from promptopt.workflows.propose import propose_space

    if Path(out).suffix not in (".yaml", ".yml"):
        raise UserError(f"--out {out}: a space file is YAML; use a .yaml file name")
    check_out_files(Path(out))
    session = Session(
        model=ModelConfig(spec=model, device=device, dtype=dtype, quantize=quantize),
        data=DataConfig(
            task=task,
            subsets=tuple(subsets.split(",")) if subsets else None,
            dev_limit=dev_limit,
            test_limit=test_limit,
            trust_task_code=trust_task_code,
        ),
        batch_size=batch_size,
    )
    return propose_space(session, request, space=space, out=out, cache_dir=cache or cache_root() / "proposals")
