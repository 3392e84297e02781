"""The Python API: one call per thing a user does, with the CLI's names, defaults and errors.

    import promptopt
    found = promptopt.study(task="sst2", trials=20, out="runs/sst2")       # an Optuna study -> a card
    found.trials, found.study, found.card_path
    result = promptopt.compare(task="sst2", strategies=["ppl", "tcb", "accuracy"], out="runs/cmp")
    result.table, result.paired                                              # pandas, with intervals
    card = promptopt.export("runs/cmp", out="card.yaml")                     # chosen on dev numbers only
    promptopt.verify("card.yaml").ok                                         # re-scored, fingerprints checked
    prompt = promptopt.load_prompt("card.yaml")                              # production: no torch

Every argument is keyword-only and named as the CLI's option (`--dev-limit` is `dev_limit=`); a mistake raises
`promptopt.errors.UserError` (a `ConfigError` for a bad value) with the one line the CLI prints. The CLI is a thin
shell over exactly these calls. `promptopt/__init__.py` imports this module on first use, so `import promptopt`
stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

EMBEDDED_DEFAULT = "smollm2-135m-instruct"  # promptopt.models.load.EMBEDDED_DEFAULT, without importing torch here

__all__ = ["compare", "export", "search", "search_config", "verify"]


def _names(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [x.strip() for x in value.split(",") if x.strip()]
    return [str(x) for x in value]


def _suite(value: str | None) -> str | None:
    return None if value in (None, "none") else value


def search_config(**flat):
    """A SearchConfig from the CLI's flat names (`task=`, `strategy=`, `dev_limit=`, `subsets="a,b"` ...)."""
    from promptopt.study import SearchConfig

    subsets = flat.get("subsets")
    if isinstance(subsets, str):
        flat["subsets"] = tuple(x.strip() for x in subsets.split(",") if x.strip()) or None
    elif subsets is not None:
        flat["subsets"] = tuple(subsets)
    return SearchConfig.build(**flat)


def search(
    *,
    task: str,
    strategy: str = "accuracy",
    trials: int = 20,
    model: str = EMBEDDED_DEFAULT,
    out: str | Path = "runs/search",
    dev_limit: int | None = None,
    test_limit: int | None = None,
    space: str | None = None,
    decision: str | None = None,
    tie_break: str | None = None,
    seed: int = 1234,
    storage: str | None = None,
    study_name: str | None = None,
    resume: bool = False,
    n_workers: int = 1,
    minibatch: int = 16,
    pruning: bool = True,
    subsets: str | Sequence[str] | None = None,
    batch_size: int = 16,
    device: str = "auto",
    dtype: str | None = None,
    quantize: str | None = None,
    search_suite: str | None = "cheap",
    trust_task_code: bool = False,
    propose: int | None = None,
    propose_mode: str = "grounded",
    proposer: str | None = None,
    screen_items: int | None = None,
    incumbent: str = "default",
    scan: str = "advise",
    budget: float | None = None,
    progress: bool = False,
):
    """`promptopt search`: one Optuna study over the task's search space with `strategy`; writes the run directory
    `out` (trials table, study, the winner's card) and returns its `SearchResult` (`.trials`, `.study`,
    `.card_path`, `.prompt`, `.dev`, `.test`). `propose=N` adds N proposed instructions to the space first.
    `incumbent`: the prompt the run starts from and keeps unless a searched one beats it on dev (`default`, a card's
    path, or `none`); `scan`: `advise`, `stop` or `off` (docs/search.md#the-scan); `budget`: minutes beside `trials`."""
    from promptopt.workflows import search as searching

    config = search_config(
        task=task,
        strategy=strategy,
        trials=trials,
        model=model,
        storage=storage,
        seed=seed,
        out=str(out),
        space=space,
        study_name=study_name,
        resume=resume,
        n_workers=n_workers,
        minibatch=minibatch,
        pruning=pruning,
        decision=decision,
        tie_break=tie_break,
        dev_limit=dev_limit,
        test_limit=test_limit,
        subsets=subsets,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        quantize=quantize,
        trust_task_code=trust_task_code,
        incumbent=incumbent,
        scan=scan,
        budget_minutes=budget,
    )
    request = searching.propose_request(
        propose, propose_mode, proposer, seed, 1, search_suite=_suite(search_suite), screen_items=screen_items
    )
    result, proposals = searching.search(config, request, search_suite=_suite(search_suite), show_progress=progress)
    result.proposals = proposals
    return result


def compare(
    *,
    task: str,
    strategies: str | Sequence[str] = ("ppl", "tcb", "accuracy"),
    trials: int = 20,
    model: str = EMBEDDED_DEFAULT,
    out: str | Path = "runs/compare",
    dev_limit: int | None = None,
    test_limit: int | None = None,
    seeds: int = 1,
    top_n: int = 3,
    select: str = "strategy",
    suite: str | None = "unseen",
    search_suite: str | None = "cheap",
    robust_limit: int | None = None,
    ensembles: Sequence[int] = (),
    ensemble_of: str | Sequence[str] | None = None,
    ensemble_objective: str = "accuracy",
    tie_break: str | None = None,
    space: str | None = None,
    seed: int = 1234,
    storage: str | None = None,
    resume: bool = False,
    n_workers: int = 1,
    minibatch: int = 16,
    pruning: bool = True,
    subsets: str | Sequence[str] | None = None,
    batch_size: int = 16,
    device: str = "auto",
    dtype: str | None = None,
    quantize: str | None = None,
    trust_task_code: bool = False,
    propose: int | None = None,
    propose_mode: str = "grounded",
    proposer: str | None = None,
    screen_items: int | None = None,
    incumbent: str = "default",
    scan: str = "advise",
    progress: bool = False,
):
    """`promptopt compare`: every strategy (`strategy` or `strategy@rule`) searched with the same budget and items,
    the winners measured on held-out test items and stressed under `suite`, paired on the same items. Returns the
    `CompareResult` (`.table`, `.runs`, `.paired` as pandas tables, `.summary`, `.out`, `.studies()`).
    `incumbent="none"`: each strategy's own winner, as the δ_TCB paper compared them (default: each search keeps the
    task's default prompt unless its winner beats it on dev)."""
    from promptopt.workflows import search as searching
    from promptopt.workflows.compare import run_compare

    request = searching.propose_request(
        propose, propose_mode, proposer, seed, 1, search_suite=_suite(search_suite), screen_items=screen_items
    )
    base = search_config(
        task=task,
        strategy="tcb",
        trials=trials,
        model=model,
        storage=storage,
        seed=seed,
        out=str(out),
        space=space,
        resume=resume,
        n_workers=n_workers,
        minibatch=minibatch,
        pruning=pruning,
        tie_break=tie_break,
        dev_limit=dev_limit,
        test_limit=test_limit,
        subsets=subsets,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        quantize=quantize,
        trust_task_code=trust_task_code,
        incumbent=incumbent,
        scan=scan,
    )
    return run_compare(
        base,
        _names(strategies),
        show_progress=progress,
        seeds=seeds,
        top_n=top_n,
        select=select,
        suite=_suite(suite),
        search_suite=_suite(search_suite),
        robust_limit=robust_limit,
        propose=request,
        ensembles=tuple(int(k) for k in ensembles),
        ensemble_of=_names(ensemble_of) or None,
        ensemble_objective=ensemble_objective,
    )


def export(
    run: str | Path,
    *,
    out: str | Path,
    strategy: str | None = None,
    trial: int | None = None,
    format: str = "card",  # noqa: A002 - the CLI's --format
    select: str = "dev",
    ensemble: int | None = None,
    flag_rate: float | None = None,
    flag_signal: str = "auto",
    tie_break: str | None = None,
    device: str | None = None,
):
    """`promptopt export RUN`: the winner of a search or compare run (chosen on dev numbers only; `select="robust"`:
    dev Acc_worst among the accurate; `tie_break` decides among the candidates dev cannot tell apart,
    promptopt/metrics/stats/selection.py), or a named trial, or an ensemble of `ensemble` members, written to `out` as a
    card (or chat messages, a text template, an lm-eval task). Returns `Exported` (`.card`, `.card_path`,
    `.warnings`: read them, they say when the card is worse than the task's default prompt)."""
    from promptopt.workflows.export import export_run

    return export_run(
        run,
        out=out,
        strategy=strategy,
        trial=trial,
        fmt=format,
        device=device,
        select=select,
        ensemble=ensemble,
        flag_rate=flag_rate,
        flag_signal=flag_signal,
        tie_break=tie_break,
    )


def verify(
    card: str | Path,
    *,
    limit: int | None = None,
    model: str | None = None,
    device: str = "auto",
    quantize: str | None = None,
):
    """`promptopt verify CARD`: the card re-scored on its recorded items with its recorded model, every fingerprint
    and hash checked, loaded in the card's recorded precision unless `quantize` ("4bit", "8bit", "none") says
    otherwise. Returns a `Verification` (`.ok`, `.checks`, `.lines()`)."""
    from promptopt.workflows.verify import verify_card

    return verify_card(card, limit=limit, model=model, device=device, quantize=quantize)
