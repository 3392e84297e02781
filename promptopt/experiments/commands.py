"""What each CLI command does beyond parsing and printing, one function per command.

The CLI stays a thin shell: it builds a config or a session, calls one function here (or one workflow
module), and renders what comes back. Anything a library user would otherwise have to assemble by hand
(the variant expander of the `robust` strategy, a protocol's own scorer, a sweep's settings, the checks that
a task suits a command) lives here, so the CLI and the library cannot drift apart.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from promptopt import progress
from promptopt.errors import PromptTooLongError, UserError
from promptopt.experiments.session import Session
from promptopt.yamlio import atomic_write_text, check_output, check_table_path, write_table

ROBUST_SEARCH_SUITE = "cheap"  # the families a `robust` search looks at (seen by its winners)


@contextmanager
def card_errors(card: Path | None):
    """A prompt too long for the model is the card's doing when a card was given: the message names it."""
    try:
        yield
    except PromptTooLongError as exc:
        if card is None:
            raise
        raise PromptTooLongError(f"card {card}: {exc}") from None


def _decided_by(members) -> str:
    """The progress line's note of how answers are decided, where a card's rule is not argmax."""
    rules = sorted({m.rule.name for m in members if m.rule.calibrated})
    parts = ([f"{len(members)} members combined"] if len(members) > 1 else []) + (
        [f"decided by {', '.join(rules)}"] if rules else []
    )
    return f" ({'; '.join(parts)})" if parts else ""


def check_out_files(*paths: Path | None) -> None:
    """Output files are checked before any scoring, so a bad --out never costs a finished computation."""
    for path in paths:
        if path is not None:
            check_output(path, folder=False, what="--out")


# --- search --------------------------------------------------------------------------------------
def variant_expander(strategies, search_suite: str = ROBUST_SEARCH_SUITE) -> object | None:
    """The expander a set of strategies needs (the `robust` strategy scores perturbed dev variants), else None."""
    from promptopt.search import get_strategy

    if not any(get_strategy(name).needs_variants for name in strategies):
        return None
    from promptopt.robustness import VariantExpander

    return VariantExpander(search_suite)


def search(config, request=None, *, search_suite: str | None = ROBUST_SEARCH_SUITE, show_progress: bool = True):
    """`promptopt search`: one study, with the perturbed variants its strategy needs (from `search_suite`), over
    the space plus `request.n` proposed instructions when a request is given -> (SearchResult, Proposals or None)."""
    from promptopt.search import get_strategy, run_search

    if search_suite is None and get_strategy(config.study.strategy).needs_variants:
        raise UserError(f"--search-suite none: strategy '{config.study.strategy}' trains on a search suite's variants")
    expand = variant_expander([config.study.strategy], search_suite) if search_suite else None
    if request is None:
        return run_search(config, expand=expand, show_progress=show_progress), None
    from promptopt.experiments.propose.rounds import search_with_proposals

    return search_with_proposals(config, request, expand=expand, show_progress=show_progress)


def search_rounds(
    config, request, rounds: int, *, search_suite: str | None = ROBUST_SEARCH_SUITE, show_progress: bool = True
):
    """`promptopt search --rounds R`: OPRO-style rounds (promptopt.experiments.propose.rounds)."""
    from promptopt.experiments.propose.rounds import search_rounds as run_rounds

    expand = variant_expander([config.study.strategy], search_suite) if search_suite else None
    return run_rounds(config, request, rounds=rounds, expand=expand, show_progress=show_progress)


def pair(run_a: Path, run_b: Path, out: Path | None):
    """`promptopt pair`: two compares paired item by item (experiments.pair_runs); the table goes to `out` too."""
    from promptopt.experiments.pair_runs import pair_runs

    if out is not None:
        check_table_path(out)
        check_out_files(out)
    table = pair_runs(run_a, run_b)
    if out is not None:
        write_table(table, out)
    return table


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
    from promptopt.experiments.propose import ProposeRequest

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
    from promptopt.experiments.propose import propose_space
    from promptopt.models import ModelConfig
    from promptopt.models.load import cache_root
    from promptopt.tasks import DataConfig

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


# --- score ---------------------------------------------------------------------------------------
def score(session: Session, *, card: Path | None, split: str, limit: int | None, out: Path | None = None):
    """`promptopt score`: one prompt on a split; with `out`, the per-item table and a .json summary."""
    if out is not None:
        check_table_path(out)
        check_out_files(out, out.with_suffix(".json"))
    members = session.card_members(card, command="score", ensembles=True)  # a bad card fails before the model loads
    items = session.data.split(split)[:limit]
    with card_errors(card):
        progress.step(f"scoring {len(items)} {split} items" + _decided_by(members))
        if len(members) == 1:  # decided by the card's rule, as it is served
            result = session.answering(members[0]).score(members[0].prompt, items)
        else:  # an ensemble card: every member scored, their log-probabilities combined by the card's rules
            from promptopt.scoring.card_answers import answer_table
            from promptopt.scoring.scorer import ScoreResult, summarize

            table = answer_table(session.scorer, members, items)
            result = ScoreResult(table, summarize(table), None)
    if out is not None:
        table = result.table.copy()
        table["gold"] = table["gold"].astype(str)  # golds mix ints and strings across tasks
        write_table(table, out)
        atomic_write_text(out.with_suffix(".json"), json.dumps(result.summary, indent=1))
    return result


def trace(
    text: str,
    *,
    model: str,
    device: str,
    dtype,
    max_new_tokens: int,
    chat,
    dip_ratio: float,
    window: int,
    out: Path | None = None,
    plot: Path | None = None,
):
    """`promptopt trace`: a greedy generation with δ_TCB and friends per token -> (table, model name)."""
    from promptopt.models import load_model
    from promptopt.trace import plot_trace, trace_generation

    if out is not None:
        check_table_path(out)
    if plot is not None and plot.suffix not in (".png", ".svg"):
        raise UserError(f"--plot {plot}: use a .png or .svg file name")
    progress.step(f"loading model {model}")
    lm = load_model(model, device=device, dtype=dtype)
    progress.step(f"generating up to {max_new_tokens} tokens, δ_TCB at each")
    frame = trace_generation(lm, text, max_new_tokens=max_new_tokens, chat=chat, dip_ratio=dip_ratio, window=window)
    if out is not None:
        write_table(frame, out)
    if plot is not None:
        plot_trace(frame, plot, title=f"{lm.name}: {text[:60]}")
    return frame, lm.name


# --- robustness ----------------------------------------------------------------------------------
def items_path(out: Path) -> Path:
    """Where `evaluate --out OUT` keeps every answer: OUT_items.parquet (`--out DIR/robustness` gives the
    robustness_items.parquet a report of DIR reads)."""
    return out.with_name(out.with_suffix("").name + "_items.parquet")


def evaluate(
    session: Session,
    *,
    card: Path | None,
    suite: str,
    split: str,
    limit: int | None,
    out: Path | None = None,
    search_suite: str | None = ROBUST_SEARCH_SUITE,
):
    """`promptopt evaluate`: a prompt under a perturbation suite, each family labelled seen (by `search_suite`) or
    unseen; with `out`, families (.csv), a .json summary and every answer (_items.parquet)."""
    from promptopt.robustness.suite import evaluate_robustness, load_suite, seen_families

    the_suite = load_suite(suite)
    the_search_suite = load_suite(search_suite) if search_suite else None
    if out is not None:
        check_out_files(out.with_suffix(".csv"), out.with_suffix(".json"), items_path(out))
    (member,) = session.card_members(card, command="evaluate")  # a bad card fails before the model loads
    progress.step(
        f"suite {the_suite.name}: {len(the_suite.families)} families on {len(session.data.split(split)[:limit])} "
        f"{split} items" + _decided_by([member])
    )
    with card_errors(card):
        result = evaluate_robustness(
            session.answering(member),  # an adaptive rule re-estimates its bias on each family's variants
            member.prompt,
            session.data.split(split)[:limit],
            the_suite,
            pool=session.data.pool,
            paraphrases=session.paraphrases,
            progress=session.progress,
            seen=seen_families(the_suite, the_search_suite),
        )
    result.summary["search_suite"] = the_search_suite.name if the_search_suite else None
    if out is not None:
        write_table(result.families, out.with_suffix(".csv"))
        write_table(result.items, items_path(out))
        atomic_write_text(out.with_suffix(".json"), json.dumps(result.summary, indent=1, default=str))
    return the_suite, result


@dataclass
class StressRun:
    result: object  # TabooResult
    data: object  # the task data the items came from (the protocol's, with --protocol)


def check_generative(session: Session, command: str) -> None:
    if not session.data.spec.generative:
        raise UserError(
            f"{command} needs a generative task (answer type number, alias_match or code); "
            f"{session.data.spec.name} is scored by log-likelihood"
        )


def stress(
    session: Session,
    *,
    card: Path | None,
    protocol=None,
    split: str,
    limit: int | None,
    ranks,
    mode: str,
    temperature: float,
    seed: int,
    batch_size: int | str,
    out: Path | None = None,
) -> StressRun:
    """`promptopt stress --task`: taboo decoding at each rank on one task, with the task's prompt (or a card), or
    with a stress protocol's own prompt, items and decoding settings (then scored by a scorer of its own data)."""
    from promptopt.robustness import taboo_stress

    if out is not None:
        check_out_files(out.with_suffix(".csv"), out.with_suffix(".parquet"))
    if protocol is not None:
        from promptopt.scoring import Scorer

        data, prompt, items = protocol.apply(session.data_config, limit=limit)
        prompt = session.prompt(card) if card else prompt
        scorer = Scorer(session.lm, data, batch_size=batch_size, progress=session.progress or progress.bars())
    else:
        data, prompt, items, scorer = (
            session.data,
            session.prompt(card),
            session.data.split(split)[:limit],
            session.scorer,
        )
    progress.step(f"taboo decoding on {len(items)} items: the baseline and ranks {list(ranks)} ({mode})")
    with card_errors(card):
        result = taboo_stress(scorer, prompt, items, ranks=ranks, mode=mode, temperature=temperature, seed=seed)
    if out is not None:
        write_table(result.summary, out.with_suffix(".csv"))
        write_table(result.items, out.with_suffix(".parquet"))
    return StressRun(result, data)


def stress_sweep(
    *,
    tasks: list[str],
    models: list[str],
    protocol,
    ranks,
    mode: str,
    temperature: float,
    seed: int,
    split: str,
    limit: int | None,
    out: Path,
    subsets,
    device: str,
    dtype,
    quantize,
    batch_size: int | str,
    log=print,
    trust_task_code: bool = False,
):
    """`promptopt stress --models/--tasks`: the taboo paper's sweep, every condition kept in `out` (resumable)."""
    from promptopt.experiments.stress_sweep import SweepSettings, run_stress_sweep
    from promptopt.models import ModelConfig

    if not tasks:
        raise UserError("a sweep needs --tasks (comma-separated generative tasks)")
    check_output(out, folder=True, what="--out")
    probe = ModelConfig(spec=models[0] if models else "x", device=device, dtype=dtype, quantize=quantize)
    settings = SweepSettings(
        protocol=protocol.name if protocol else None,
        protocol_sha256=protocol.digest if protocol else None,
        ranks=tuple(ranks),
        mode=mode,
        temperature=temperature,
        seed=seed,
        split=split,
        limit=limit,
        dtype=probe.resolved_dtype(),
        device_type=probe.resolved_device_type(),
        quantize=quantize,
        batch_size=batch_size,
        subsets=subsets,
    )
    return run_stress_sweep(
        models=models,
        tasks=tasks,
        settings=settings,
        out=out,
        protocol=protocol,
        device=device,
        log=log,
        trust_task_code=trust_task_code,
    )
