"""promptopt: find prompts that are accurate and stable.

Kept thin on purpose: `import promptopt` loads nothing heavy, and `promptopt.load_prompt` (production
code's entry point, promptopt/production.py) is resolved on first use, without torch or transformers.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name in ("load_prompt", "CardPrompt"):
        from promptopt import production

        return getattr(production, name)
    raise AttributeError(f"module 'promptopt' has no attribute {name!r}")


__all__ = ["CardPrompt", "load_prompt"]
