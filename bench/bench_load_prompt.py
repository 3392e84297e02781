"""What production pays for `promptopt.load_prompt`: a fresh interpreter's import + load + render + parse,
against the same interpreter doing nothing (the baseline) and importing torch (what it avoids).
Each is the median of several fresh processes.

    .venv/bin/python bench/bench_load_prompt.py [CARD]      # default: a card of SST-2's default prompt on
                                                            # the embedded model, built in a temp folder
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 7


def fresh(code: str) -> float:
    """Median wall seconds of `python -c code` in fresh processes."""
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def make_card(folder: Path) -> Path:
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig
    from promptopt.workflows.export import build_card
    from promptopt.workflows.formats import card_yaml
    from promptopt.workflows.session import Session

    session = Session(model=ModelConfig(device="cpu"), data=DataConfig(task="sst2", test_limit=5))
    card = build_card(session, session.data.default_prompt(), dev_items=[], test_items=session.items("test"))
    path = folder / "card.yaml"
    path.write_text(card_yaml(card), encoding="utf-8")
    return path


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        card = Path(sys.argv[1]) if len(sys.argv) > 1 else make_card(Path(tmp))
        use = (
            f"import sys, promptopt; c = promptopt.load_prompt({str(card)!r}); c.render('an instant classic'); "
            "c.parse('positive'); assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
        )
        baseline = fresh("pass")
        light = fresh(use)
        torch = fresh("import torch")
    print(f"python startup (baseline)            {baseline * 1000:7.0f} ms")
    print(
        f"import promptopt + load_prompt + use {light * 1000:7.0f} ms  ({(light - baseline) * 1000:.0f} ms over the baseline)"
    )
    print(
        f"import torch (avoided)               {torch * 1000:7.0f} ms  ({(torch - baseline) / max(light - baseline, 1e-9):.1f}x load_prompt's cost)"
    )


if __name__ == "__main__":
    main()
