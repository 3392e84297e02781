"""The layout as a contract: data flows one way (models → metrics … → experiments → cli), search and
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
    "metrics": 1,
    "models": 2,
    "decision": 2,
    "prompts": 3,
    "card": 3,
    "prompt_formats": 3,
    "tasks": 4,
    "scoring": 5,
    "production": 5,
    "serving": 5,  # the production runtime (promptopt.production.Server, lazily): scoring's peer
    "search": 6,
    "robustness": 6,
    "trace": 6,
    "experiments": 7,
    "cli": 8,
    "__main__": 8,
}
PEERS = {frozenset({"search", "robustness"})}


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
# parts; each command calls one library function (promptopt/experiments/commands.py or a workflow module).
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


def test_the_cli_is_small_modules():
    """One module per command group; none grows back into the 850-line file it was (lines as ruff formats them)."""
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in (PACKAGE / "cli").glob("*.py")}
    assert {"app.py", "options.py", "render.py", "search.py", "robustness.py", "diagnose.py", "cards.py"} <= set(sizes)
    assert max(sizes.values()) < 450, sizes


MAX_MODULE_LINES = 450  # lines as ruff formats them


def _module_sizes() -> dict[str, int]:
    return {
        p.relative_to(PACKAGE).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_module_is_over_450_lines():
    """Small modules with one job each: none in promptopt/ over MAX_MODULE_LINES."""
    sizes = _module_sizes()
    over = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: split them by job: {over}"


def test_the_size_check_counts_every_module():
    """Guard against a vacuous check: nested packages are counted, and the largest module is near the bound."""
    sizes = _module_sizes()
    assert {"experiments/compare/workflow.py", "metrics/stats/correlation.py", "robustness/suite/spec.py"} <= set(sizes)
    assert max(sizes.values()) > MAX_MODULE_LINES // 2


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
    from promptopt.experiments import run_compare
    from promptopt.search import SearchConfig

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

    from promptopt.experiments import run_compare
    from promptopt.search import SearchConfig

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
    for trial in study.trials:  # k = 0 samples no exemplar keys, so it cannot make duplicate prompts
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


def test_a_stand_in_without_a_member_breaks_the_contract():
    from promptopt.models import ModelRunner
    from promptopt.scoring import PromptScorer

    class NoGenerate:
        lm, batch_size = None, 1

        def loglikelihood(self, requests):
            return []

    assert not isinstance(NoGenerate(), ModelRunner)
    assert not isinstance(object(), PromptScorer)
