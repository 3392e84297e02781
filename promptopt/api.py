"""The Python API: one call per thing a user does, with the CLI's names, defaults and errors.

    import promptopt
    found = promptopt.search(task="sst2", trials=20, out="runs/sst2")       # an Optuna study -> a card
    found.trials, found.study, found.card_path
    result = promptopt.compare(task="sst2", strategies=["ppl", "tcb", "accuracy"], out="runs/cmp")
    result.table, result.paired                                              # pandas, with intervals
    card = promptopt.export("runs/cmp", out="card.yaml")                     # chosen on dev numbers only
    promptopt.verify("card.yaml").ok                                         # re-scored, fingerprints checked
    prompt = promptopt.load_prompt("card.yaml")                              # production: no torch

Every argument is keyword-only and named as the CLI's option (`--dev-limit` is `dev_limit=`); a mistake raises
`promptopt.errors.UserError` (a `ConfigError` for a bad value) with the one line the CLI prints. The CLI is a thin
shell over exactly these calls. Besides names, the calls take objects (docs/python-api.md): `model=` a loaded
transformers model and tokenizer (`promptopt.Model(model, tokenizer)` or the pair) or a `ModelRunner`; `strategy=` a
`Strategy`; `decision=` a `DecisionRule` or `RuleKind`; `task=` a `TaskSpec` or `TaskData`. None needs registering
first. `promptopt/__init__.py` imports this module on first use, so `import promptopt` stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the documented return types, without importing what they need at import time
    from fastapi import FastAPI

    from promptopt.scoring.scorer import ScoreResult
    from promptopt.study import SearchConfig, SearchResult
    from promptopt.workflows.compare import CompareResult
    from promptopt.workflows.verify import Verification

EMBEDDED_DEFAULT = "smollm2-135m-instruct"  # promptopt.models.load.EMBEDDED_DEFAULT, without importing torch here

__all__ = ["compare", "export", "score", "search", "search_config", "serve", "verify"]

_ADOPTED: set[tuple[str, str]] = set()  # (registry kind, name): entries registered here from objects passed in


def __getattr__(name: str):
    if name == "Model":  # promptopt.models.memory.Model, imported (with torch) on first use
        from promptopt.models.memory import Model

        return Model
    raise AttributeError(f"module 'promptopt.api' has no attribute {name!r}")


def _names(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [x.strip() for x in value.split(",") if x.strip()]
    return [str(x) for x in value]


def _suite(value: str | None) -> str | None:
    return None if value in (None, "none") else value


# --- objects in, names out: what the internals (configs, studies, cards) record ---------------------------------
def _model_spec(model: Any, *, n_workers: int = 1, device: str = "auto", dtype=None, quantize=None) -> str:
    """The spec string that names `model`: a spec as it is; an object (`promptopt.Model`, a (model, tokenizer)
    pair, a LoadedModel or a ModelRunner) under a generated `in-memory:NAME` spec in this process (models/memory.py).

    Args:
        model: a model spec or a model object.
        n_workers: worker processes the call starts; an object cannot reach them.
        device: the call's device; for an object, `auto` or where it is.
        dtype: the call's dtype; for an object, None or what it computes in.
        quantize: the call's quantize; for an object, None or how it is quantized.

    Returns:
        str: The spec that the run, its study and its cards record.

    Raises:
        ConfigError: `model` is neither a spec nor a model object, or an object is given with `n_workers > 1`.
        UnsupportedError: `device`, `dtype` or `quantize` would change an in-memory model.
    """
    if isinstance(model, (str, Path)):
        return str(model)
    from promptopt.errors import ConfigError
    from promptopt.models import ModelConfig, memory

    spec = memory.register(model)
    if n_workers > 1:
        raise ConfigError(
            f"model={type(model).__name__} object with n_workers={n_workers}: worker processes cannot receive an "
            "in-memory model; use n_workers=1, or save the model (save_pretrained) and pass its folder"
        )
    ModelConfig(spec=spec, device=device, dtype=dtype, quantize=quantize).check()
    return spec


def _adopt(registry, obj: Any, name: str, where: str, n_workers: int) -> str:
    """`obj`'s name in `registry`, registering it under that name unless the name is already another entry's (one
    this module registered from an earlier object is replaced: a notebook cell run again)."""
    from promptopt.errors import ConfigError

    key = (registry.kind, name)
    if name in registry.names():
        current = registry.get(name)
        if current is obj or current == obj:
            return name
        if key not in _ADOPTED:
            raise ConfigError(
                f"{where}: {registry.kind} {name!r} is already another {registry.kind} (built in, installed or "
                "registered): give yours another name"
            )
    if n_workers > 1:
        raise ConfigError(
            f"{where}: a {registry.kind} object with n_workers={n_workers}: worker processes look {registry.kind}s up "
            "by name and cannot see one passed in memory; use n_workers=1 or install it (an entry point)"
        )
    registry.register(obj, name=name, replace=True)
    _ADOPTED.add(key)
    return name


def _strategy_name(strategy: Any, n_workers: int = 1) -> str:
    """The name of `strategy` (a name, or a `promptopt.study.strategies.Strategy`, adopted under its own name)."""
    if isinstance(strategy, str):
        return strategy
    from promptopt.errors import ConfigError
    from promptopt.study.strategies import STRATEGIES, Strategy

    if not isinstance(strategy, Strategy):
        raise ConfigError(f"strategy: expected a strategy name or a Strategy, got {type(strategy).__name__}")
    return _adopt(STRATEGIES, strategy, strategy.name, "strategy", n_workers)


def _decision_text(decision: Any, n_workers: int = 1) -> str | None:
    """`decision` as a rule's text (`kind[:reading]`): a name as it is; a `RuleKind` (a rule of your own) adopted under
    its name; an unfitted `DecisionRule` written as the text that parses back to it."""
    if decision is None or isinstance(decision, str):
        return decision
    from promptopt.decision import DECISION_RULES, DecisionRule, RuleKind, parse_rule
    from promptopt.errors import ConfigError

    if isinstance(decision, RuleKind):
        return _adopt(DECISION_RULES, decision, decision.name, "decision", n_workers)
    if not isinstance(decision, DecisionRule):
        raise ConfigError(
            f"decision: expected a rule name, a DecisionRule or a RuleKind, got {type(decision).__name__}"
        )
    text = decision.name + (f":{decision.reading}" if decision.reading else "")
    if parse_rule(text) != decision:
        raise ConfigError(
            f"decision: DecisionRule(kind={decision.kind!r}) carries fitted parameters or settings a search does not "
            f"take (a search fits its rule on its own dev items): pass DecisionRule(kind={decision.kind!r}, "
            "reading=...) or the name"
        )
    return text


def _task_name(task: Any, subsets: str | Sequence[str] | None = None, trust_task_code: bool = False) -> str:
    """What a run records for `task`: a name or path as it is; a `TaskSpec` or `TaskData` by its task file (the
    built-in name for a built-in task), once it is known to be what that file gives (runs, exports and cards re-read
    the task from it).

    Raises:
        ConfigError: not a task, or an object that its task file does not reproduce (edited in memory).
    """
    if isinstance(task, (str, Path)):
        return str(task)
    from promptopt.errors import ConfigError
    from promptopt.tasks.catalog import load_task_spec
    from promptopt.tasks.data import TaskData
    from promptopt.tasks.spec import TaskSpec

    if not isinstance(task, (TaskSpec, TaskData)):
        raise ConfigError(f"task: expected a task name or path, a TaskSpec or a TaskData, got {type(task).__name__}")
    spec = task.spec if isinstance(task, TaskData) else task
    where = Path(str(spec.where))
    if not where.is_file():
        raise ConfigError(f"task: TaskSpec '{spec.name}' has no task file (where: {str(spec.where)[:80]!r})")
    try:
        builtin = load_task_spec(spec.name).where == spec.where
    except Exception:  # not a built-in name
        builtin = False
    name = spec.name if builtin else str(where)
    if load_task_spec(str(where), trust_task_code=trust_task_code) != spec:
        raise ConfigError(f"task: TaskSpec '{spec.name}' differs from its file {where} (edited in memory): save it")
    if isinstance(task, TaskData):
        from promptopt.tasks.data import load_task_data

        fresh = load_task_data(spec, subsets=_names(subsets) or None)
        if fresh.carving() != task.carving():
            raise ConfigError(
                f"task: this TaskData of '{spec.name}' holds other items than its file carves"
                f"{' with these subsets' if subsets else ''}: pass its TaskSpec, or write the items to a task file"
            )
    return name


def search_config(**flat: object) -> SearchConfig:
    """A SearchConfig from the CLI's flat names (`task=`, `strategy=`, `dev_limit=`, `subsets="a,b"` ...).

    Args:
        **flat: the settings by the CLI's names; `subsets` may be a comma-separated string or a sequence.

    Returns:
        The validated settings.

    Raises:
        ConfigError: an unknown setting or a bad value, in one line naming it.
    """
    from promptopt.study import SearchConfig

    subsets = flat.get("subsets")
    if isinstance(subsets, str):
        flat["subsets"] = tuple(x.strip() for x in subsets.split(",") if x.strip()) or None
    elif subsets is not None:
        flat["subsets"] = tuple(subsets)
    return SearchConfig.build(**flat)


def search(
    *,
    task: Any,
    strategy: Any = "accuracy",
    trials: int = 20,
    model: Any = EMBEDDED_DEFAULT,
    out: str | Path = "runs/search",
    dev_limit: int | None = None,
    test_limit: int | None = None,
    space: str | None = None,
    decision: Any = None,
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
) -> SearchResult:
    """`promptopt search`: one Optuna study over the task's search space with `strategy`.

    Args:
        task: a built-in task name or task YAML path, or a `TaskSpec` / `TaskData` (recorded by its task file).
        strategy: a strategy name, or a `promptopt.study.strategies.Strategy` (no registering needed).
        trials: finished trials to reach.
        model: a model spec (built-in name, folder, .gguf file, hub id), or a loaded model:
            `promptopt.Model(model, tokenizer)`, the pair `(model, tokenizer)`, or any `ModelRunner`.
        out: the run directory (trials table, study, the winner's card `best_card.yaml`).
        dev_limit: score only the first N dev items; test_limit: the first N test items.
        space: a search space YAML (default: the task's built-in space).
        decision: one decision rule for every trial: a name (`contextual`, `batch:acc_norm` ...), an unfitted
            `promptopt.decision.DecisionRule`, or a `RuleKind` of your own.
        tie_break: how the winner is chosen among trials dev cannot tell apart (default: the strategy's).
        seed: the study's (`promptopt search --help`);
            `n_workers > 1` takes names only (worker processes cannot receive objects).
        storage: as `seed` above.
        study_name: as `seed` above.
        resume: as `seed` above.
        n_workers: as `seed` above.
        minibatch: as `seed` above.
        pruning: as `seed` above.
        subsets: the data's and the model load's; an in-memory
            model is used as it is (`device`, `dtype`, `quantize` may only say what it is).
        batch_size: as `subsets` above.
        device: as `subsets` above.
        dtype: as `subsets` above.
        quantize: as `subsets` above.
        trust_task_code: as `subsets` above.
        search_suite: the perturbation suite a `robust` search trains on (`none`: none).
        propose: add `propose` proposed instructions to the space first.
        propose_mode: as `propose` above.
        proposer: as `propose` above.
        screen_items: as `propose` above.
        incumbent: the prompt the run starts from and keeps unless a searched one beats it on dev (`default`, a
            card's path, or `none`).
        scan: `advise`, `stop` or `off` (docs/search.md#the-scan).
        budget: minutes beside `trials`: no trial starts after them.
        progress: show progress bars.

    Returns:
        The run's result (`.trials`, `.study`, `.card_path`, `.prompt`, `.dev`, `.test`, `.proposals`).

    Raises:
        ConfigError: a bad value (an unknown name, an object of the wrong kind, an object with `n_workers > 1`).
        UserError: any other mistake the CLI reports in one line (a missing file, a prompt too long for the model).
    """
    from promptopt.workflows import search as searching

    config = search_config(
        task=_task_name(task, subsets, trust_task_code),
        strategy=_strategy_name(strategy, n_workers),
        trials=trials,
        model=_model_spec(model, n_workers=n_workers, device=device, dtype=dtype, quantize=quantize),
        storage=storage,
        seed=seed,
        out=str(out),
        space=space,
        study_name=study_name,
        resume=resume,
        n_workers=n_workers,
        minibatch=minibatch,
        pruning=pruning,
        decision=_decision_text(decision, n_workers),
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


def _strategy_list(strategies: Any, n_workers: int) -> list[str]:
    """compare's strategies as `name` / `name@rule` texts: a comma-separated string, or a sequence whose entries are
    names, `Strategy` objects or (strategy, decision rule) pairs."""
    if isinstance(strategies, str):
        return _names(strategies)
    from promptopt.study.strategies import Strategy

    if isinstance(strategies, Strategy):
        strategies = [strategies]
    out = []
    for entry in strategies:
        if isinstance(entry, tuple) and len(entry) == 2:
            out.append(f"{_strategy_name(entry[0], n_workers)}@{_decision_text(entry[1], n_workers)}")
        else:
            out.append(_strategy_name(entry, n_workers))
    return out


def compare(
    *,
    task: Any,
    strategies: Any = ("ppl", "tcb", "accuracy"),
    trials: int = 20,
    model: Any = EMBEDDED_DEFAULT,
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
) -> CompareResult:
    """`promptopt compare`: every strategy searched with the same budget and items, the winners measured on held-out
    test items and stressed under `suite`, paired on the same items.

    Args:
        task: a task name or path, or a `TaskSpec` / `TaskData` (as `search`).
        strategies: names (`strategy` or `strategy@rule`, a list or a comma-separated string), `Strategy` objects,
            or (strategy, rule) pairs whose rule is a name, a `DecisionRule` or a `RuleKind`.
        model: a model spec or a loaded model (as `search`).
        out: the compare directory.
        seeds: searches per strategy, winners kept per search, and how the table's rows are chosen.
        top_n: as `seeds` above.
        select: as `seeds` above.
        suite: the stress suite for the winners, the suite a `robust` search trains on,
            and how many test items are stressed.
        search_suite: as `suite` above.
        robust_limit: as `suite` above.
        ensembles: ensembles of K winners to measure besides.
        ensemble_of: as `ensembles` above.
        ensemble_objective: as `ensembles` above.
        incumbent: `none` compares each strategy's own winner (as the δ_TCB paper did); the default keeps the
            task's default prompt unless a winner beats it on dev.
        scan: as `search`.
        progress: show progress bars.

    The other keyword arguments (`trials`, `dev_limit`, `test_limit`, `tie_break`, `space`, `seed`, `storage`,
    `resume`, `n_workers`, `minibatch`, `pruning`, `subsets`, `batch_size`, `device`, `dtype`, `quantize`,
    `trust_task_code`, `propose`, `propose_mode`, `proposer`, `screen_items`) mean what they mean for `search`.

    Returns:
        The compare's result (`.table`, `.runs`, `.paired` as pandas tables, `.summary`, `.out`, `.studies()`).

    Raises:
        ConfigError: a bad value (as `search`).
        UserError: any other mistake the CLI reports in one line.
    """
    from promptopt.workflows import search as searching
    from promptopt.workflows.compare import run_compare

    request = searching.propose_request(
        propose, propose_mode, proposer, seed, 1, search_suite=_suite(search_suite), screen_items=screen_items
    )
    base = search_config(
        task=_task_name(task, subsets, trust_task_code),
        strategy="tcb",
        trials=trials,
        model=_model_spec(model, n_workers=n_workers, device=device, dtype=dtype, quantize=quantize),
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
        _strategy_list(strategies, n_workers),
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


def score(
    *,
    task: Any,
    prompt: str | Path | None = None,
    model: Any = EMBEDDED_DEFAULT,
    split: str = "test",
    limit: int | None = None,
    out: str | Path | None = None,
    subsets: str | Sequence[str] | None = None,
    order: str | None = None,
    batch_size: int | str = 16,
    device: str = "auto",
    dtype: str | None = None,
    quantize: str | None = None,
    trust_task_code: bool = False,
    progress: bool = False,
) -> ScoreResult:
    """`promptopt score`: one prompt on a split of the task's items, answered as its card answers (its decision rule;
    an ensemble card's members combined).

    Args:
        task: a task name or path, or a `TaskSpec` / `TaskData` (as `search`).
        prompt: a card's path (a search's `best_card.yaml` or an exported card); None: the task's own prompt.
        model: a model spec or a loaded model (as `search`).
        split: `pool`, `dev` or `test`.
        limit: score only the first N items of the split as carved.
        out: also write the per-item table here (.parquet or .csv) and its summary beside it (.json).
        subsets: the data's and the scorer's (`promptopt score --help`).
        order: as `subsets` above.
        batch_size: as `subsets` above.
        trust_task_code: as `subsets` above.
        device: the model load's (default: a version-2 card's recorded precision).
        dtype: as `device` above.
        quantize: as `device` above.
        progress: show progress bars.

    Returns:
        `.table` (one row per item: correct, pred, δ_TCB, V_eff, margin, PPL ...) and
            `.summary` (accuracy with its 95% interval, δ_TCB's mean, median and geometric mean ...).

    Raises:
        ConfigError: a bad value (as `search`).
        UserError: any other mistake the CLI reports in one line (a bad card, a prompt too long for the model).
    """
    from promptopt import progress as progress_lines
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig
    from promptopt.workflows import evaluate
    from promptopt.workflows.session import Session

    dtype, quantize = evaluate.card_precision(prompt, dtype, quantize)
    spec = _model_spec(model, device=device, dtype=dtype, quantize=quantize)
    session = Session(
        model=ModelConfig(spec=spec, device=device, dtype=dtype, quantize=quantize),
        data=DataConfig(
            task=_task_name(task, subsets, trust_task_code),
            subsets=tuple(_names(subsets)) or None,
            trust_task_code=trust_task_code,
            order=order,
        ),
        batch_size=batch_size,
        progress=progress,
    )
    with progress_lines.reporting("score", quiet=not progress):
        return evaluate.score(
            session,
            card=Path(prompt) if prompt is not None else None,
            split=split,
            limit=limit,
            out=Path(out) if out is not None else None,
        )


def serve(
    card: str | Path,
    *,
    model: Any = None,
    device: str = "auto",
    dtype: str | None = None,
    quantize: str | None = None,
    batch_size: int | str = 16,
    settings=None,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key_file: str | Path | None = None,
    run: bool = True,
    log_level: str = "info",
) -> FastAPI:
    """`promptopt serve CARD`: the card's prompt over HTTP (POST /v1/answer, GET /healthz; docs/serving.md).

    Args:
        card: a version-2 card (`promptopt export`).
        model: what answers: None (the card's recorded model), a model spec, or a loaded model (as `search`).
        device: the model load's (default: the card's recorded precision).
        dtype: as `device` above.
        quantize: as `device` above.
        batch_size: as `device` above.
        settings (ServeSettings): a `promptopt.serving.ServeSettings` (batching, limits, timeouts; default: the CLI's defaults).
        host: where to listen, and the file holding the API key (needed off loopback).
        port: as `host` above.
        api_key_file: as `host` above.
        run: listen and serve until SIGTERM or SIGINT; False: return the app without listening (to mount it in your
            own ASGI server, or to call it with a test client), with no bind check.
        log_level: uvicorn's.

    Returns:
        The app (once the server stops, when `run`); `app.state` holds the server and its settings.

    Raises:
        ConfigError: a card that cannot be served, or a bad value.
        UserError: an address that cannot be used (in use, or off loopback without an API key).
    """
    from promptopt.serving.app import ServeSettings, create_app

    model_options = {
        "model": None if model is None else _model_spec(model, device=device, dtype=dtype, quantize=quantize),
        "device": device,
        "dtype": dtype,
        "quantize": quantize,
        "batch_size": batch_size,
    }
    settings = settings or ServeSettings()
    if not run:
        from promptopt.serving.runtime import Server

        server = Server(card, limits=settings.limits, **model_options)
        server.warm()
        return create_app(server, settings)
    from promptopt.serving.launch import Listen, prepare
    from promptopt.serving.launch import run as run_app

    listen = Listen(host=host, port=port)
    app, _ = prepare(card, listen=listen, api_key_file=api_key_file, settings=settings, **model_options)
    run_app(app, listen, log_level=log_level)
    return app


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
    model: Any = None,
    device: str = "auto",
    quantize: str | None = None,
) -> Verification:
    """`promptopt verify CARD`: the card re-scored on its recorded items with its recorded model, every fingerprint
    and hash checked, loaded in the card's recorded precision unless `quantize` says otherwise.

    Args:
        card: a version-2 card.
        limit: re-score only the first N recorded test items.
        model: None (the card's recorded model), another spec (scored; its fingerprint difference fails the check),
            or a loaded model (as `search`): how a card measured on an in-memory model is verified, its tensors'
            fingerprint compared with the recorded one.
        device: where the model loads.
        quantize: `4bit`, `8bit` or `none` instead of the card's recorded precision.

    Returns:
        The checks (`.ok`, `.checks`, `.lines()`).

    Raises:
        UserError: a card that cannot be read, or a recorded model or task that is not here (one line saying what
            verify needs, e.g. an in-memory model's weights).
    """
    from promptopt.workflows.verify import verify_card

    spec = (
        None if model is None else _model_spec(model, device=device, quantize=None if quantize == "none" else quantize)
    )
    return verify_card(card, limit=limit, model=spec, device=device, quantize=quantize)
