"""A command whose pip extra is missing says which one to install, in one line (promptopt/extras.py); the base
install's `promptopt --help` still works; extras.py's table is pyproject.toml's. A missing module is simulated in
a fresh process the way Python documents it: `sys.modules[name] = None` makes `import name` fail and find_spec
find nothing (the real base install is tests/test_install.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata

import pytest

from promptopt import extras
from tests.clirun import REPO, Result, assert_one_line_error

RUN_WITHOUT = """
import sys
absent, patch, argv = sys.argv[1].split(","), sys.argv[2], sys.argv[3:]
for name in filter(None, absent):
    sys.modules[name] = None
import promptopt.cli
if patch:  # a command whose up-front check misses a module: the entry point still names the extra
    command, extra = patch.split("=")
    sys.modules["promptopt.cli.app"].COMMAND_EXTRAS[command] = extra
sys.argv = ["promptopt", *argv]
promptopt.cli.main()
"""
EVERY_EXTRA = sorted({m for modules in extras.MODULES.values() for m in modules})


def without(absent: list[str], *args: str, patch: str = "") -> Result:
    proc = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT, ",".join(absent), patch, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def line(command: str, extra: str, module: str) -> str:
    return f"error: promptopt {command} needs the '{extra}' extra ({module} is not installed): pip install 'promptopt[{extra}]'"


@pytest.mark.parametrize(
    ("absent", "args", "extra", "module"),
    [
        (["torch", "transformers"], ["search", "--task", "sst2", "--trials", "2"], "search", "torch"),
        (["optuna"], ["compare", "--task", "sst2"], "search", "optuna"),
        (["fastapi", "uvicorn"], ["serve", "card.yaml", "--port", "8123"], "serve", "fastapi"),
        (["torch"], ["serve", "card.yaml"], "serve", "torch"),  # the server loads the card's model
        (["plotly"], ["report", "runs/x"], "report", "plotly"),
        (["torch"], ["diagnose", "geometry", "--help"], "search", "torch"),
    ],
)
def test_a_command_without_its_extra_names_it_in_one_line(absent, args, extra, module):
    result = without(absent, *args)
    assert_one_line_error(result)
    assert result.stderr.strip() == line(args[0], extra, module)


def test_the_base_install_lists_the_commands():
    shown = without(EVERY_EXTRA, "--help")
    assert shown.returncode == 0, shown.stderr
    assert {"search", "compare", "serve", "report"} <= set(re.findall(r"│ (\S+)", shown.stdout))
    assert_one_line_error(without(EVERY_EXTRA, "search", "--help"), "'search' extra")


def test_a_module_missed_by_the_check_still_names_its_extra():
    """serve's check made to look for the search extra only: the import of fastapi inside the command fails, and the
    entry point turns it into the same line (the command's name, the module's extra), not a traceback."""
    result = without(["fastapi"], "serve", "card.yaml", patch="serve=search")
    assert_one_line_error(result)
    assert result.stderr.strip() == line("serve", "serve", "fastapi")


def test_with_the_extras_installed_nothing_is_missing():
    for extra in ("search", "serve", "report"):  # what the set-up installs (Makefile); lmeval is `make bench`'s
        assert extras.missing(extra) == [], extra
    assert extras.extra_of("sentence_transformers.models") == "search" and extras.extra_of("json") is None


def _requirement_name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower().replace("_", "-")


def test_the_table_is_pyprojects():
    """extras.MODULES holds, per extra, the modules of exactly the distributions pyproject.toml lists (in its
    order), and INCLUDES the extras it includes; the base install has no model library."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    optional = project["optional-dependencies"]
    provides = {}  # distribution -> its top-level modules, for those installed here
    for module, distributions in metadata.packages_distributions().items():
        for distribution in distributions:
            provides.setdefault(distribution.lower().replace("_", "-"), set()).add(module)
    renamed = {"sentence-transformers": "sentence_transformers", "lm-eval": "lm_eval", "psycopg2-binary": "psycopg2"}
    for extra, modules in extras.MODULES.items():
        own = [_requirement_name(r) for r in optional[extra] if not r.startswith("promptopt[")]
        assert modules == tuple(renamed.get(d, d) for d in own), extra
        for distribution, module in zip(own, modules):
            if distribution in provides:  # installed: the module is really the distribution's
                assert module in provides[distribution], (extra, distribution, provides[distribution])
        included = [r for r in optional[extra] if r.startswith("promptopt[")]
        wanted = [f"promptopt[{','.join(extras.INCLUDES[extra])}]"] if extra in extras.INCLUDES else []
        assert included == wanted, extra
    assert optional["all"] == [f"promptopt[{','.join(extras.MODULES)}]"]
    base = {_requirement_name(r) for r in project["dependencies"]}
    assert not base & {d for extra in extras.MODULES for d in map(_requirement_name, optional[extra])}
