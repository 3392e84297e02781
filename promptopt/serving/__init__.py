"""Serving a prompt card: the runtime that answers as the scorer does (`Server`), its HTTP app (`create_app`, FastAPI
under uvicorn, `promptopt serve`), and the fragility signals a card's flag reads (`signals`).

- runtime.py: Server — a card with its model, answering inputs (answer, label log-probs, δ_TCB, the flag)
- inputs.py: what a request may ask, and the one-line errors · signals.py: the flag's signals and threshold
- batcher.py: concurrent requests batched for one worker thread · security.py: bind check, API key, rate limit
- app.py: the FastAPI app · launch.py: the bind check, the model load and uvicorn

The names below are resolved on first use, so `import promptopt.serving` loads neither torch nor FastAPI.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "Server": "runtime",
    "Input": "inputs",
    "InputError": "inputs",
    "Limits": "inputs",
    "Flag": "signals",
    "SIGNALS": "signals",
    "flag_from_card": "signals",
    "ServeSettings": "app",
    "create_app": "app",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"promptopt.serving.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'promptopt.serving' has no attribute {name!r}")


__all__ = sorted(_LAZY)
