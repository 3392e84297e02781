"""What every part of a search shares: the run's resolved inputs (strategy, space, items) and how a
trial's parameters become a Prompt. Everything here is checked against the task data, before a model or
a study exists."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from promptopt.errors import ConfigError, PromptTooLongError
from promptopt.prompts import Prompt
from promptopt.study.config import SearchConfig
from promptopt.study.incumbent import INCUMBENT_PARAM, incumbent_prompt
from promptopt.study.space import SearchSpace, load_space
from promptopt.study.strategies import Strategy, get_strategy


@dataclass
class SearchResult:
    config: SearchConfig
    trials: pd.DataFrame
    best_params: dict
    best_number: int
    prompt: Prompt  # the winner, decoded
    dev: dict
    test: dict
    card_path: Path
    wall_seconds: float
    cache_hit_rate: float
    pareto: pd.DataFrame | None = None
    selection: str = ""  # how the winner was chosen, in words
    selection_detail: dict = field(default_factory=dict)  # the selection rule's record (tie set, tie-break, mde)
    ranking: list = field(default_factory=list)  # distinct trials in the strategy's order of preference
    duplicates_skipped: int = 0  # sampled points that decoded to a prompt already evaluated (not counted)
    pairs_scored: int = 0  # distinct (prompt, item) pairs this process scored for the trials (result-cache misses)
    proposals: object = None  # what `propose=N` added to the space (workflows.propose.Proposals), else None
    incumbent: dict | None = (
        None  # the replacement test's record and whether the incumbent was kept (None: no incumbent)
    )
    scan: dict | None = None  # the sensitivity scan's record (study/scan.py), None when off
    dev_items_spent: dict | None = None  # dev items scored per trial and in all, and the scan's pairs

    @property
    def study(self):
        """The Optuna study the trials live in (loaded from the run's storage)."""
        import optuna

        return optuna.load_study(study_name=self.config.name, storage=self.config.storage_url)


@dataclass
class SearchContext:
    config: SearchConfig
    strategy: Strategy
    space: SearchSpace
    data: object  # TaskData
    candidates: list
    dev: list
    test: list
    expand: object = None  # (scorer, prompt, items) -> [(variant prompt, variant items)], for `robust`
    incumbent: Prompt | None = None  # the prompt the user has (study/incumbent.py); None: --incumbent none


def build_context(config: SearchConfig, data, expand=None) -> SearchContext:
    """Strategy, space and items of a run, checked against the task's data."""
    strategy = get_strategy(config.study.strategy)
    space = load_space(config.study.space or data.spec.name)
    candidates = space.check_against(data, pool_draw=config.study.pool_draw)
    _check_decisions(config.study.decision, space, data)
    dev = config.data.dev(data)
    dev_size_note(config, len(dev))  # too few to choose anything: one error before any model loads
    return SearchContext(
        config,
        strategy,
        space,
        data,
        candidates,
        dev,
        config.data.test(data),
        expand,
        incumbent_prompt(config.study.incumbent, data, config.study.decision),
    )


def dev_size_note(config: SearchConfig, n_dev: int) -> str | None:
    """`dev_size_warning` as the search's input check: below the floor a ConfigError, else the warning or None."""
    from promptopt.metrics.stats.selection import dev_size_warning

    limit = config.data.dev_limit
    try:
        return dev_size_warning(n_dev, flag="--dev-limit" if limit is not None else None)
    except ValueError as exc:
        where = f"--dev-limit {limit}" if limit is not None else f"task {config.data.task}: its dev split"
        raise ConfigError(f"{where}: {exc}") from None


_WARNED: set[str] = set()


def warn_once(text: str | None) -> None:
    """A `warning: ...` line on stderr, even for a quiet run, once per process (a compare's searches share it)."""
    if text and text not in _WARNED:
        _WARNED.add(text)
        print(f"warning: {text}", file=sys.stderr, flush=True)


def _check_decisions(decision: str | None, space: SearchSpace, data) -> None:
    """Calibrated rules need the same labels on every item: refused for per-item choices before anything runs."""
    from promptopt.decision import parse_rule
    from promptopt.scoring.calibration import need_fixed_labels

    for name in [decision] if decision is not None else space.decisions:
        need_fixed_labels(parse_rule(name), data.dev + data.test, data.spec.name)


def require_variants(ctx: SearchContext) -> None:
    """A strategy that scores perturbed dev variants cannot run without something that makes them."""
    if ctx.strategy.needs_variants and ctx.expand is None:
        raise ConfigError(
            f"strategy '{ctx.strategy.name}' needs perturbed variants of the dev items: run it through the "
            "promptopt CLI or pass expand= (promptopt.robustness.VariantExpander)"
        )


def check_search(config: SearchConfig, data, expand=None) -> None:
    """Everything about a search that can be checked against the task data without a model or a study."""
    require_variants(build_context(config, data, expand))


def _exemplar_size(item) -> int:
    """Characters an item adds to a prompt as a shot: its question, answer and choices."""
    return len(item.question) + len(str(item.target)) + sum(len(c) for c in item.choices or ())


def _longest_candidates(candidates: list, k: int) -> list:
    return sorted(candidates, key=_exemplar_size, reverse=True)[:k]


def fit_space_to_model(ctx: SearchContext, tokenizer, note=None) -> None:
    """A model without a chat template (Gemma-3-270M base) cannot render the space's chat templates: they leave the
    space for this run (said once in a note); a space of chat templates only is refused in one line."""
    if getattr(tokenizer, "chat_template", None):
        return
    space = ctx.space
    chat = [name for name, template in space.templates.items() if template.chat]
    if not chat:
        return
    if len(chat) == len(space.templates):
        raise ConfigError(
            f"{space.where}: templates: every template is a chat template ({', '.join(chat)}) but the model has no "
            "chat template: add a plain one"
        )
    from dataclasses import replace

    ctx.space = replace(space, templates={n: t for n, t in space.templates.items() if not t.chat})
    if note is not None:
        note(f"the model has no chat template: the space's chat template(s) {', '.join(chat)} are not searched")


def check_prompts_fit(ctx: SearchContext, scorer) -> None:
    """Every prompt the space can produce must fit the model: each instruction × template with the k_max
    longest candidate shots, on the longest dev/test items. Checked before the study exists, so a space
    that cannot fit fails with one line and leaves nothing behind."""
    space, spec = ctx.space, ctx.data.spec
    longest = _longest_candidates(ctx.candidates, space.k_max)
    shots = tuple(item.as_exemplar() for item in longest)
    by_size = lambda item: len(item.question) + sum(len(c) for c in item.choices or ())  # noqa: E731
    items = sorted(ctx.dev + ctx.test, key=by_size, reverse=True)[:3]
    for instruction_name, instruction in space.instructions.items():
        for template_name, template in space.templates.items():
            prompt = Prompt(
                task=spec.name, instruction=instruction, exemplars=shots, template=space.widest_format(template)
            )
            try:
                scorer.check_fits(prompt, items)
            except PromptTooLongError as exc:
                # `exc` names the query item it measured; a shot longer than every query is the likelier culprit
                shot = longest[0] if longest and _exemplar_size(longest[0]) > by_size(items[0]) else None
                where = f"{shot.where}, " if shot is not None and shot.where else ""
                culprit = (
                    f"; its longest shot is pool item {shot.id} ({where}{_exemplar_size(shot):,} characters)"
                    if shot is not None
                    else ""
                )
                raise PromptTooLongError(
                    f"{space.where}: instruction '{instruction_name}' with template '{template_name}' and {len(shots)} shots "
                    f"does not fit: {exc}{culprit}"
                ) from None


def decode_params(config: SearchConfig, data, params: dict):
    """The Prompt a finished trial's parameters stand for, given the run's settings and task data."""
    return decode(build_context(config, data), params)


def decode(ctx: SearchContext, params: dict):
    """The Prompt a set of trial parameters stands for (the incumbent's trial: the incumbent)."""
    import optuna

    if INCUMBENT_PARAM in params:
        if ctx.incumbent is None:
            raise ConfigError(
                "the incumbent's trial cannot be decoded by a run without an incumbent (--incumbent none)"
            )
        return ctx.incumbent

    return ctx.space.suggest(optuna.trial.FixedTrial(params), ctx.candidates, ctx.data.spec, ctx.config.study.decision)


def note(show: bool):
    """A printer of `note: ...` lines on stderr, or None when the run is quiet."""
    return (lambda text: print(f"note: {text}", file=sys.stderr, flush=True)) if show else None
