"""promptopt: find prompts that are accurate and stable.

One call per thing a user does (promptopt/api.py), each keyword-only with the CLI's names:

    import promptopt
    found = promptopt.search(task="sst2", trials=20, out="runs/sst2")
    result = promptopt.compare(task="sst2", strategies=["ppl", "tcb", "accuracy"], out="runs/cmp")
    card = promptopt.export("runs/cmp", out="card.yaml")
    promptopt.verify("card.yaml").ok
    prompt = promptopt.load_prompt("card.yaml")   # production code: no torch
    promptopt.search(task="sst2", model=promptopt.Model(model, tokenizer))   # a model already loaded

Kept thin on purpose: `import promptopt` loads nothing heavy; each name is resolved on first use, and
`promptopt.load_prompt` (promptopt/production.py) never imports torch or transformers: `pip install promptopt` is
enough for it, the other calls need the `search` extra (promptopt/extras.py).
"""

from __future__ import annotations

import importlib
from importlib import metadata

try:
    __version__ = metadata.version("promptopt")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

_LAZY = {
    "search": "promptopt.api",
    "compare": "promptopt.api",
    "score": "promptopt.api",
    "serve": "promptopt.api",
    "Model": "promptopt.models.memory",
    "export": "promptopt.api",
    "verify": "promptopt.api",
    "load_prompt": "promptopt.production",
    "CardPrompt": "promptopt.production",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'promptopt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "CardPrompt",
    "Model",
    "__version__",
    "compare",
    "export",
    "load_prompt",
    "score",
    "search",
    "serve",
    "verify",
]
