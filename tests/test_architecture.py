"""The layout as a contract: data flows one way (models → metrics … → workflows → cli), search and
robustness are peers that never import each other, the card loader stays light, and a whole `compare`
loads its model once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "promptopt"
# lower numbers may be imported by higher ones, never the other way round
LAYERS = {
    "errors": 0,
    "yamlio": 0,
    "yaml_bounds": 0,
    "progress": 0,
    "registry": 0,  # the one shape of the extension points (strategies, perturbation operators, answer types)
    "extras": 0,  # which optional dependencies (pip extras) a command needs, and the line that names a missing one
    "metrics": 1,
    "models": 2,
    "decision": 2,
    "prompts": 3,
    "card": 3,
    "prompt_formats": 3,
    "tasks": 4,
    "scoring": 5,
    "production": 5,
    "serving": 5,  # the production runtime (promptopt.serving.Server): scoring's peer
    "study": 6,  # the Optuna study over a search space (promptopt.search(...) is the public call, api.py)
    "robustness": 6,
    "trace": 6,
    "workflows": 7,  # the product's workflows: session, search, compare, export, verify, propose
    "api": 8,  # promptopt.search / compare / export / verify: the calls the CLI wraps
    "analyses": 8,  # the papers' measurement studies: read workflows' sessions and runs
    "report": 9,  # the HTML report: presents runs, their analyses (risk-coverage) and export's choice
    "cli": 10,
    "__main__": 10,
}
PEERS = {frozenset({"study", "robustness"})}


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "promptopt" and len(parts) > 1 else None


def _imports(path: Path) -> set[str]:
    """Every promptopt module a file imports, at top level or inside functions (lazy imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {m for m in found if m.startswith("promptopt")}


def _edges():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        unit = rel.parts[0].removesuffix(".py")
        if unit == "__init__":
            continue
        for module in _imports(path):
            target = _unit(module)
            if target and target != unit:
                yield rel, unit, target


def test_every_unit_has_a_layer():
    units = {
        p.name.removesuffix(".py")
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" or p.is_dir()) and p.name != "__pycache__"
    }
    units -= {"__init__", "search_spaces", "perturbations"}  # data folders shipped as package data
    assert units <= set(LAYERS), units - set(LAYERS)


def test_imports_flow_one_way_and_peers_stay_apart():
    wrong = [(str(rel), target) for rel, unit, target in _edges() if LAYERS[target] > LAYERS[unit]]
    assert not wrong, f"imports from a higher layer: {wrong}"
    crossing = [(str(rel), target) for rel, unit, target in _edges() if frozenset({unit, target}) in PEERS]
    assert not crossing, f"search and robustness import each other: {crossing}"


def test_the_check_itself_can_fail(tmp_path):
    """Guard against a vacuous test: a lazy import of robustness inside search is seen."""
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    from promptopt.robustness.suite import load_suite\n")
    assert _imports(module) == {"promptopt.robustness.suite"}


# What the CLI may not do itself: build a scorer, a variant expander, a sweep's settings or run a workflow's
# parts; each command calls one library function (promptopt/workflows/commands.py or a workflow module).
LIBRARY_WORK = {
    "Scorer",
    "CachedScorer",
    "ScorerFactory",
    "VariantExpander",
    "SweepSettings",
    "ModelConfig.load",
    "evaluate_robustness",
    "taboo_stress",
    "run_stress_sweep",
    "load_suite",
    "Similarity",
}


def _names_used(path: Path) -> set[str]:
    """Every name a file imports or refers to (plain names and attribute names)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(alias.name.rsplit(".", 1)[-1] for alias in node.names)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
    return found


def test_the_cli_builds_no_scorer_and_no_expander():
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(_names_used(p) & LIBRARY_WORK)
        for p in sorted((PACKAGE / "cli").glob("*.py"))
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"the CLI does library work: {offenders}"


def test_the_cli_check_can_fail(tmp_path):
    module = tmp_path / "cmd.py"
    module.write_text("def f(lm, data):\n    from promptopt.scoring import Scorer\n    return Scorer(lm, data)\n")
    assert "Scorer" in _names_used(module) & LIBRARY_WORK


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its __init__.py)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the promptopt modules it imports, at top level or inside functions. `from package import name`
    is an edge to the submodule when `name` is one, else to the package (whose __init__ then runs)."""

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            graph[name].update(t for t in map(owner, targets) if t and t != name and t.startswith("promptopt"))
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, cycles, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycles():
    """No module imports itself back through others, lazy imports included: a module is one concept that the
    ones above it use, whatever its length (the old 450-line cap split classes over files, and made these)."""
    cycles = import_cycles(import_graph(_modules()))
    assert not cycles, f"import cycles: {cycles}"


def test_the_cycle_check_can_fail(tmp_path):
    """A lazy import back from a submodule to its sibling is a cycle; importing a sibling by name is an edge to it."""
    package = tmp_path / "promptopt"
    (package / "p").mkdir(parents=True)
    (package / "p" / "__init__.py").write_text("")
    (package / "p" / "a.py").write_text("from promptopt.p import b\n")
    (package / "p" / "b.py").write_text("def f():\n    from promptopt.p.a import x\n")
    (package / "p" / "c.py").write_text("from promptopt.p import b\n")
    modules = {
        "promptopt.p": package / "p" / "__init__.py",
        **{f"promptopt.p.{m}": package / "p" / f"{m}.py" for m in "abc"},
    }
    assert import_cycles(import_graph(modules)) == [["promptopt.p.a", "promptopt.p.b"]]


def test_one_class_one_module():
    """No class is assembled from mixins defined in other modules of the package (one class, one module)."""
    mixins = [
        (path.relative_to(PACKAGE).as_posix(), node.name)
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name.endswith("Mixin")
    ]
    assert not mixins, f"mixins spread a class over modules: {mixins}"


def test_card_loader_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, promptopt.prompts; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
    ).stdout
    assert out.split() == ["False", "False"]


def test_compare_loads_the_model_once(tiny_llama_dir, tmp_path, monkeypatch):
    import promptopt.models.load as load
    from promptopt.study import SearchConfig
    from promptopt.workflows.compare import run_compare

    calls = []
    real = load.load_model
    monkeypatch.setattr(load, "load_model", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    config = SearchConfig.build(
        task="sst2",
        trials=2,
        model=str(tiny_llama_dir),
        out=str(tmp_path / "cmp"),
        dev_limit=8,
        test_limit=4,
        minibatch=4,
        device="cpu",
    )
    table = run_compare(config, ["ppl", "tcb", "accuracy"], suite="quick", show_progress=False).table
    assert table["strategy"].tolist() == ["baseline", "ppl", "tcb", "accuracy"]
    assert len(calls) == 1


@pytest.mark.parametrize("space", ["examples/custom_task/copa_space.yaml"])
def test_compare_runs_a_custom_task_with_its_space(tiny_llama_dir, tmp_path, space):
    import optuna

    from promptopt.study import SearchConfig
    from promptopt.workflows.compare import run_compare

    repo = PACKAGE.parent
    config = SearchConfig.build(
        task=str(repo / "examples/custom_task/copa.yaml"),
        space=str(repo / space),
        trials=4,
        model=str(tiny_llama_dir),
        out=str(tmp_path / "copa"),
        dev_limit=6,
        test_limit=4,
        minibatch=3,
        device="cpu",
    )
    table = run_compare(config, ["accuracy"], suite=None, show_progress=False).table
    assert table["n_test"].tolist() == [4, 4]
    study = optuna.load_study(study_name="copa-accuracy", storage=f"sqlite:///{tmp_path / 'copa' / 'study.db'}")
    assert sum("incumbent" in t.params for t in study.trials) == 1  # the task's default prompt, scored first
    for trial in study.trials:  # k = 0 samples no exemplar keys, so it cannot make duplicate prompts
        if "incumbent" in trial.params:
            continue
        keys = [p for p in trial.params if p.startswith("key_")]
        assert (trial.params["k"] == 0) == (not keys)


# --- contracts: what scoring needs of a model runner, and what search and robustness need of a scorer --------
def test_the_implementations_keep_their_contracts(tiny_lm, tiny_llama_dir, tmp_path):
    import inspect

    from promptopt.models import ModelRunner, Runner
    from promptopt.scoring import CachedScorer, CachingScorer, PromptScorer, ResultCache, Scorer
    from promptopt.tasks import load_task

    scorer = Scorer(tiny_lm, load_task("sst2"))
    cached = CachedScorer(scorer, ResultCache(tmp_path / "cache.sqlite"))
    assert isinstance(Runner(tiny_lm), ModelRunner) and isinstance(scorer.runner, ModelRunner)
    assert isinstance(scorer, PromptScorer) and not isinstance(scorer, CachingScorer)  # no result cache: no score_table
    assert isinstance(cached, PromptScorer) and isinstance(cached, CachingScorer)
    for protocol, implementation in ((ModelRunner, Runner), (PromptScorer, Scorer), (CachingScorer, CachedScorer)):
        for name, member in inspect.getmembers(protocol, inspect.isfunction):
            if name.startswith("_"):
                continue
            wanted = [p for p in inspect.signature(member).parameters if p != "self"]
            got = inspect.signature(getattr(implementation, name)).parameters
            if not any(p.kind == p.VAR_KEYWORD for p in got.values()):  # CachedScorer forwards **kwargs
                assert set(wanted) <= set(got), f"{implementation.__name__}.{name} lacks {set(wanted) - set(got)}"


def _runner_calls(tree) -> list[tuple[str, int, set[str]]]:
    """(method, line, keywords) of every `<...runner>.loglikelihood(...)` / `.generate(...)` call in a module."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method, owner = node.func.attr, node.func.value
        name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
        if method in ("loglikelihood", "generate") and name.endswith("runner"):
            found.append((method, node.lineno, {k.arg for k in node.keywords if k.arg}))
    return found


def test_every_runner_call_stays_inside_the_protocol():
    """The other direction of the contract: what the package passes a runner is what `ModelRunner` states, so a
    stand-in written against the Protocol alone takes every call (tests/test_api_objects.py runs one)."""
    import inspect

    from promptopt.models import ModelRunner

    stated = {m: set(inspect.signature(getattr(ModelRunner, m)).parameters) for m in ("loglikelihood", "generate")}
    calls, beyond = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "runner.py":  # the Runner itself (its own helpers)
            continue
        for method, line, keywords in _runner_calls(ast.parse(path.read_text(encoding="utf-8"))):
            calls += 1
            beyond += [f"{path.relative_to(PACKAGE)}:{line} {method}({k}=)" for k in keywords - stated[method]]
    assert calls >= 6, calls  # the scorer's, robustness's, propose's and diagnose's calls are all seen
    assert not beyond, f"runner calls with keywords ModelRunner does not state: {beyond}"
    # and the check can fail: a call with an unstated keyword is seen
    bad = ast.parse("self.runner.loglikelihood(pairs, tcb_targets=t, speed=2)")
    assert _runner_calls(bad) == [("loglikelihood", 1, {"tcb_targets", "speed"})]


def test_a_stand_in_without_a_member_breaks_the_contract():
    from promptopt.models import ModelRunner
    from promptopt.scoring import PromptScorer

    class NoGenerate:
        lm, batch_size = None, 1

        def loglikelihood(self, requests):
            return []

    assert not isinstance(NoGenerate(), ModelRunner)
    assert not isinstance(object(), PromptScorer)
