"""Issue 51's screen: which (model, task) pairs are clearly above chance on dev, so that the robustness experiment
runs where the model can answer. Both shipped models, SST-2 and the per-item-choice tasks that ship offline, each
task's default prompt, dev items only (test is never read). A pair is kept when the Wilson 95% lower bound of its
best reading (argmax acc or acc_norm) is above chance (the mean of 1/choices over the items); pmi:acc_norm ("") is
printed beside it, paired with argmax on the same items (95% paired bootstrap, exact McNemar p).

    .venv/bin/python bench/screen_choice_tasks.py          # SCREEN_DEV=60 dev items per task, SCREEN_MODELS=both
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

DEV = int(os.environ.get("SCREEN_DEV", "60"))
MODELS = os.environ.get("SCREEN_MODELS", "smollm2-135m-instruct,gemma3-270m").split(",")
REPO = Path(__file__).resolve().parent.parent
TASKS = {
    "sst2": "sst2",
    "arc_easy": "arc_easy",
    "sciq": str(REPO / "examples/choice_tasks/sciq.yaml"),
    "piqa": str(REPO / "examples/choice_tasks/piqa.yaml"),
    "openbookqa": str(REPO / "examples/choice_tasks/openbookqa.yaml"),
    "copa": str(REPO / "examples/custom_task/copa.yaml"),
}


def main() -> None:
    import torch

    from promptopt.decision import DecisionRule
    from promptopt.metrics.stats import mcnemar_exact, wilson_interval
    from promptopt.metrics.stats.bootstrap import bootstrap_resamples, percentile_interval
    from promptopt.models import load_model
    from promptopt.scoring import Scorer
    from promptopt.scoring.calibration import decide_table, with_references
    from promptopt.tasks import load_task

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    print(f"{DEV} dev items per task (COPA has 40), each task's default prompt; 95% intervals")
    print("| model | task | items | chance | argmax:acc | argmax:acc_norm | pmi:acc_norm − best argmax | kept |")
    print("|---|---|---|---|---|---|---|---|")
    for model in MODELS:
        lm = load_model(model, device="cpu")
        for name, spec in TASKS.items():
            start = time.perf_counter()
            task = load_task(spec)
            items, prompt = task.dev[:DEV], task.default_prompt()
            scorer = Scorer(lm, task)
            raw = scorer.score(prompt, items).table
            chance = float(np.mean([1 / len(item.choices) for item in items]))
            acc, norm = raw["acc"].to_numpy().astype(bool), raw["acc_norm"].to_numpy().astype(bool)
            best_name, best = ("acc", acc) if acc.mean() >= norm.mean() else ("acc_norm", norm)
            cells = []
            for values in (acc, norm):
                low, high = wilson_interval(int(values.sum()), len(values))
                cells.append(f"{values.mean():.3f} [{low:.3f}, {high:.3f}]")
            pmi_cell = "—"
            if name != "sst2":  # SST-2's labels are fixed: its calibrated rules are batch/contextual, not pmi
                rule = DecisionRule(kind="pmi", reading="acc_norm", content_free=("",))
                pmi = decide_table(rule, with_references(scorer, rule, prompt, items, raw))["correct"].to_numpy()
                draws = bootstrap_resamples(len(items), n_boot=2000, seed=0)
                low, high = percentile_interval(np.array([pmi[d].mean() - best[d].mean() for d in draws]))
                p = mcnemar_exact(pmi, best)[2]
                pmi_cell = f"{pmi.mean():.3f}: {pmi.mean() - best.mean():+.3f} [{low:+.3f}, {high:+.3f}], p {p:.2f}"
            kept = wilson_interval(int(best.sum()), len(best))[0] > chance
            print(
                f"| {model} | {name} | {len(items)} | {chance:.2f} | {cells[0]} | {cells[1]} | {pmi_cell} "
                f"| {'yes (' + best_name + ')' if kept else 'no'} |  <!-- {time.perf_counter() - start:.0f} s -->",
                flush=True,
            )
        del lm


if __name__ == "__main__":
    main()
