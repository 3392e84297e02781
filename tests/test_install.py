"""The production install: `pip install promptopt` (no extra) in a fresh venv has no torch and no model library,
loads a card that export wrote and renders it byte for byte as the full install does, and its `promptopt search`
names the extra to install in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import promptopt

REPO = Path(__file__).resolve().parent.parent
QUESTION = "an instant classic, with a 'quoted' word and {braces}"


def _pip(python: Path, *args: str) -> str:
    """pip of the test's own environment run against `python`'s (pip --python): the venv needs no pip of its own."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _wheel(tmp_path: Path) -> Path:
    """The project's wheel, built from a copy of the tree (a build in the checkout would leave build/ there)."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "promptopt", source / "promptopt", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "wheel"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return next(out.glob("promptopt-*.whl"))


@pytest.fixture
def exported_card(tiny_llama_dir, tmp_path) -> Path:
    """A card as production gets it: a search's winner, exported (card v2, with its field hashes)."""
    promptopt.search(
        task="sst2",
        strategy="accuracy",
        trials=2,
        dev_limit=8,
        test_limit=8,
        out=tmp_path / "run",
        model=str(tiny_llama_dir),
    )
    return promptopt.export(tmp_path / "run", out=tmp_path / "card.yaml").card_path


@pytest.mark.slow  # ~25 s: a venv, a wheel build and pip (its cache warm), besides the search that writes the card
@pytest.mark.long
def test_the_production_install_loads_a_card_without_torch(exported_card, tmp_path):
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    _pip(python, "install", "-q", str(_wheel(tmp_path)))

    installed = {row["name"].lower().replace("_", "-") for row in json.loads(_pip(python, "list", "--format", "json"))}
    assert "promptopt" in installed
    model_libraries = {"torch", "transformers", "optuna", "accelerate", "sentence-transformers", "fastapi", "pandas"}
    assert not installed & model_libraries, installed & model_libraries

    code = (
        "import json, sys, promptopt\n"
        "card = promptopt.load_prompt(sys.argv[1])\n"
        "print(json.dumps([card.render(sys.argv[2]), card.parse(' positive'), 'torch' in sys.modules]))\n"
    )
    done = subprocess.run(
        [str(python), "-c", code, str(exported_card), QUESTION], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    rendered, parsed, torch_loaded = json.loads(done.stdout)
    card = promptopt.load_prompt(exported_card)
    assert rendered == card.render(QUESTION) and QUESTION in rendered
    assert parsed == card.parse(" positive") == "positive" and not torch_loaded

    # the command line is there, and a command that needs an extra says which, in one line
    done = subprocess.run(
        [str(env / "bin" / "promptopt"), "search", "--task", "sst2"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.splitlines() == [
        "error: promptopt search needs the 'search' extra (torch is not installed): pip install 'promptopt[search]'"
    ]
