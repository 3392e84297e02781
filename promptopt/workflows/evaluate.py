"""One prompt on a task, as the CLI's single-prompt commands run it: scored on a split (`score`), under a
perturbation suite (`evaluate`), under taboo decoding (`stress`), token by token (`trace`). Each function checks
its output paths before any scoring and answers with the card's own rule when a card is given."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from promptopt import progress
from promptopt.errors import PromptTooLongError, UserError
from promptopt.workflows.search import ROBUST_SEARCH_SUITE
from promptopt.workflows.session import Session
from promptopt.yamlio import atomic_write_text, check_out_files, check_table_path, write_table


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
        from promptopt.scoring.stored import answer_columns

        write_table(answer_columns(result.table), out)  # gold and pred typed as compare's tables type them
        atomic_write_text(out.with_suffix(".json"), json.dumps(result.summary, indent=1))
    return result


def card_precision(card, dtype: str | None, quantize: str | None) -> tuple[str | None, str | None]:
    """(dtype, quantize) that `score --prompt CARD` loads: the flags where given, else a version-2 card's recorded
    model.dtype and model.quantization, so the card is scored in the precision it was measured in; `none`: full
    precision."""
    if card is not None and (dtype is None or quantize is None):
        from promptopt.models.load import quantize_of
        from promptopt.yamlio import load_yaml

        data = load_yaml(card)
        recorded = data.get("model") if data.get("promptopt_card") == 2 and isinstance(data.get("model"), dict) else {}
        if dtype is None and recorded.get("dtype") in ("float32", "bfloat16", "float16"):
            dtype = recorded["dtype"]
        if quantize is None:
            quantize = quantize_of(recorded.get("quantization"))
    return dtype, None if quantize == "none" else quantize


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
