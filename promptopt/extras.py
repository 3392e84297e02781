"""The install's optional parts: which pip extra (pyproject.toml) brings which modules, and the one line a command
prints when its extra is missing.

`pip install promptopt` is what production needs: `load_prompt`, card validation and the command line (yaml,
jsonschema, jinja2, typer). The optimizer and everything that loads a model (`search`), the HTTP server (`serve`),
the HTML report (`report`) and lm-eval's task index (`lmeval`) are extras. The CLI checks a command's extra before
it parses the command's options (some parse through the model libraries); a module of an extra found missing later
ends in the same line (cli/app.py). Optuna's model: optuna/_imports.py and its extras. Only the import system is
asked (`find_spec`), never the installed metadata: a source tree run without installing is checked the same way.
"""

from __future__ import annotations

import importlib.util

from promptopt.errors import UserError

# extra -> the top-level modules of its own distributions, in pyproject.toml's order (tests/test_install.py keeps
# the two equal)
MODULES: dict[str, tuple[str, ...]] = {
    "search": (
        "torch",
        "transformers",
        "gguf",
        "filelock",
        "accelerate",
        "bitsandbytes",
        "optuna",
        "datasets",
        "nlpaug",
        "sentence_transformers",
        "textblob",
        "pandas",
        "pyarrow",
        "scipy",
        "tqdm",
    ),
    "serve": ("fastapi", "uvicorn"),
    "report": ("plotly", "matplotlib"),
    "lmeval": ("lm_eval",),
    "postgres": ("psycopg2",),
}
# extra -> the extras it includes ("promptopt[search]" in its list): the server, the report and lm-eval's check
# load models and read runs through the optimizer's code
INCLUDES: dict[str, tuple[str, ...]] = {"serve": ("search",), "report": ("search",), "lmeval": ("search",)}


class MissingExtra(UserError, ImportError):
    """A command or call needs an extra that is not installed; the message is the pip command that installs it."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses the name, a half-installed package
        return False


def missing(extra: str) -> list[str]:
    """The modules of `extra` (and of the extras it includes) that cannot be imported here."""
    return [m for name in (*INCLUDES.get(extra, ()), extra) for m in MODULES[name] if not _importable(m)]


def message(extra: str, needed_by: str, module: str | None = None) -> str:
    why = f" ({module} is not installed)" if module else ""
    return f"{needed_by} needs the '{extra}' extra{why}: pip install 'promptopt[{extra}]'"


def require(extra: str, needed_by: str) -> None:
    """Raise MissingExtra naming `extra` and how to install it unless all its modules are importable."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(message(extra, needed_by, absent[0]))


def extra_of(module: str | None) -> str | None:
    """The extra whose distributions provide `module` (a dotted name; its top level decides), or None."""
    top = (module or "").partition(".")[0]
    return next((extra for extra, modules in MODULES.items() if top in modules), None)
