"""The Python API (promptopt/api.py): one call per thing a user does, the CLI's names, its errors; no old import
paths; one registry shape that an installed package extends (entry points)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pandas as pd
import pytest

import promptopt
from promptopt.errors import ConfigError, UserError
from promptopt.registry import Registry

REPO = Path(__file__).resolve().parent.parent


def test_version_and_light_import():
    code = "import sys, promptopt; print(promptopt.__version__, 'torch' in sys.modules, callable(promptopt.search))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == promptopt.__version__ and out[0][0].isdigit()
    assert out[1:] == ["False", "True"]  # nothing heavy until a call is made


def test_search_compare_export_verify_from_python(tiny_llama_dir, tmp_path):
    model = str(tiny_llama_dir)
    found = promptopt.search(
        task="sst2", strategy="accuracy", trials=2, dev_limit=8, test_limit=8, out=tmp_path / "s", model=model
    )
    assert isinstance(found.trials, pd.DataFrame) and len(found.trials) >= 2
    assert found.card_path.is_file() and found.study.study_name == "sst2-accuracy"
    assert len(found.study.trials) == len(found.trials)

    result = promptopt.compare(
        task="sst2",
        strategies=["ppl", "accuracy"],
        trials=2,
        dev_limit=8,
        test_limit=8,
        suite=None,
        top_n=1,
        minibatch=4,
        out=tmp_path / "c",
        model=model,
    )
    assert result.table["strategy"].tolist() == ["baseline", "ppl", "accuracy"]
    assert isinstance(result.paired, pd.DataFrame) and result.out == tmp_path / "c"
    assert set(result.studies()) == {"sst2-ppl", "sst2-accuracy"}

    exported = promptopt.export(tmp_path / "c", out=tmp_path / "card.yaml")
    assert exported.card_path == tmp_path / "card.yaml" and exported.card_path.is_file()
    assert exported.card["promptopt_card"] == 2
    checked = promptopt.verify(exported.card_path, limit=4)
    assert checked.ok, checked.lines()
    assert promptopt.load_prompt(exported.card_path).render("a fine film") != ""


def test_api_errors_are_the_clis(tmp_path):
    with pytest.raises(ConfigError, match="unknown strategy 'bset'"):
        promptopt.search(task="sst2", strategy="bset", out=tmp_path / "x")
    with pytest.raises(UserError, match="--format xml"):
        promptopt.export(tmp_path, out=tmp_path / "c.yaml", format="xml")
    with pytest.raises(TypeError):  # keyword-only, as the CLI's options are named
        promptopt.search("sst2")


def test_no_old_import_paths_and_search_stays_the_function():
    """The unreleased layout's paths are gone, not aliased: importing one fails, and `promptopt.search` is still the
    search call afterwards (a module `promptopt/search.py` replaced the attribute once imported)."""
    code = textwrap.dedent(  # this tree's modules, not an editable install's of another checkout (its finder goes)
        """
        import sys
        sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
        import importlib, promptopt, promptopt.api
        for old in ("promptopt.search", "promptopt.experiments", "promptopt.experiments.compare", "promptopt.moved"):
            try:
                importlib.import_module(old)
            except ModuleNotFoundError:
                pass
            else:
                raise SystemExit(f"{old} still imports")
        assert promptopt.search is promptopt.api.search, promptopt.search
        finders = [f if isinstance(f, type) else type(f) for f in sys.meta_path]
        assert not [f for f in finders if f.__module__.startswith("promptopt")], sys.meta_path
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.split() == ["ok"], out.stderr


# --- one registry shape ----------------------------------------------------------------------------------------
def test_registry_names_did_you_mean_and_builtins_by_reference():
    registry = Registry("widget", group="promptopt.test-widgets", builtins={"json": "json:dumps"})
    registry.register(len, name="length")
    assert registry.names() == ("json", "length")
    assert registry.get("json") is __import__("json").dumps and registry["length"] is len
    with pytest.raises(ConfigError, match=r"answer\.kind: unknown widget 'lenght' \(did you mean 'length'\?\)"):
        registry.get("lenght", "answer.kind")
    with pytest.raises(ValueError, match="registered already"):
        registry.register(abs, name="length")


def _fake_distribution(root: Path, group: str, name: str, value: str, module: str, source: str) -> None:
    """An installed package as importlib.metadata finds it: a module and a .dist-info with its entry points."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / "promptopt_plugin_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: promptopt-plugin-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {value}\n")


PLUGIN = """
from promptopt.study.strategies import Strategy, accuracy_values

SHORTEST = Strategy(
    name="shortest_ok",
    description="dev accuracy (a plugin's strategy: the same values, its own name)",
    item_values=accuracy_values,
)
"""


@pytest.mark.long
def test_a_strategy_from_an_installed_package_is_listed_and_runs(tiny_llama_dir, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _fake_distribution(site, "promptopt.strategies", "shortest_ok", "my_strategies:SHORTEST", "my_strategies", PLUGIN)
    env = {**__import__("os").environ, "PYTHONPATH": f"{site}:{REPO}"}
    shown = subprocess.run(
        [sys.executable, "-m", "promptopt", "search", "--help"], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "shortest_ok" in " ".join(shown.replace("│", " ").split())  # rich may wrap the list
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "promptopt",
            "search",
            "--task",
            "sst2",
            "--strategy",
            "shortest_ok",
            "--trials",
            "2",
            "--dev-limit",
            "8",
            "--test-limit",
            "4",
            "--minibatch",
            "4",
            "--model",
            str(tiny_llama_dir),
            "--out",
            str(tmp_path / "run"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (tmp_path / "run" / "best_card.yaml").is_file()
    # and without the package the name is unknown, in one line naming the choices
    gone = subprocess.run(
        [sys.executable, "-c", "from promptopt.study import get_strategy; get_strategy('shortest_ok')"],
        capture_output=True,
        text=True,
    )
    assert "unknown strategy 'shortest_ok'" in gone.stderr


def test_a_broken_entry_point_is_one_line(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    _fake_distribution(site, "promptopt.strategies", "broken", "no_such_module:X", "unused", "")
    monkeypatch.syspath_prepend(str(site))
    from promptopt.study.strategies import STRATEGIES

    STRATEGIES.refresh()
    try:
        assert "broken" in STRATEGIES.names()
        with warnings.catch_warnings(), pytest.raises(ConfigError, match="strategy 'broken' from entry point"):
            STRATEGIES.get("broken")
    finally:
        monkeypatch.undo()
        STRATEGIES.refresh()
