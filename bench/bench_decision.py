"""What a decision rule adds to a search trial, and what an ensemble costs per served input, as ratios against a
baseline measured in the same run (the embedded model, SST-2, CPU).

[1] A trial: one prompt's dev items scored and decided (study/trial.py's RunningDecision) with a fresh scorer and no
    result cache, under argmax (the baseline) and each calibrated rule; `tcb` strategies also read δ_TCB on the
    decided distribution (hidden states kept, one more δ_TCB pass). Rounds alternate the order; medians printed.
[2] Serving: answering N inputs with one card's prompt vs an ensemble of K prompts (scoring/card_answers.py): the
    ensemble runs K forwards per input.
[3] pmi, per trial (ARC-Easy, per-item choices, the default 3-shot prompt): one prompt's dev items decided by argmax
    and by pmi (fresh scorer: every content-free pair is scored), and pmi with δ_TCB on the decided distribution.
[4] pmi, per served input (ARC-Easy test items through answer_table, as `promptopt serve` answers): argmax vs pmi
    with a fresh scorer (each input's choices scored once more after the content-free context), and both again on
    the same scorer ("warm": its prefix caches full and, for pmi, every (context, choice) pair seen before: the case
    of repeated choice texts).

    .venv/bin/python bench/bench_decision.py            # BENCH_ROUNDS=5 BENCH_ITEMS=48 BENCH_ARC_ITEMS=32 by default
"""

from __future__ import annotations

import os
import statistics
import time

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
ITEMS = int(os.environ.get("BENCH_ITEMS", "48"))
ARC_ITEMS = int(os.environ.get("BENCH_ARC_ITEMS", "32"))
SECTIONS = os.environ.get("BENCH_SECTIONS", "1234")  # which of [1]-[4] to run


def main() -> None:
    import torch

    from promptopt.decision import parse_rule
    from promptopt.models import load_model
    from promptopt.prompts import Prompt
    from promptopt.scoring import Scorer
    from promptopt.scoring.calibration import RunningDecision, fit_rule
    from promptopt.scoring.card_answers import CardMember, answer_table
    from promptopt.study.space import load_space
    from promptopt.tasks import load_task

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    lm = load_model("smollm2-135m-instruct", device="cpu")
    task = load_task("sst2")
    dev, test = task.dev[:ITEMS], task.test[:ITEMS]
    base = task.default_prompt()

    def trial(rule: str, hidden: bool) -> float:
        scorer = Scorer(lm, task)  # no result cache: every pair is scored
        start = time.perf_counter()
        running = RunningDecision(scorer_adapter(scorer), base.with_(decision=rule), hidden=hidden)
        for i in range(0, len(dev), 16):
            running.add(dev[i : i + 16])
        running.decided()
        return time.perf_counter() - start

    trial("argmax", False)  # warm-up: the first call pays the output head's one-time statistics
    if "1" in SECTIONS:
        cases = [("argmax", False), ("contextual", False), ("batch", False), ("affine", False), ("batch", True)]
        times = {case: [] for case in cases}
        for r in range(ROUNDS):
            for case in cases if r % 2 == 0 else cases[::-1]:
                times[case].append(trial(*case))
        baseline = statistics.median(times[("argmax", False)])
        print(f"[1] one trial: {ITEMS} SST-2 dev items, default prompt, no result cache, median of {ROUNDS} rounds")
        for case in cases:
            median = statistics.median(times[case])
            label = f"{case[0]}{' + δ_TCB on the decided distribution' if case[1] else ''}"
            print(f"  {label:48s} {median:7.2f} s  {median / baseline:5.3f}x argmax")
    if "3" in SECTIONS or "4" in SECTIONS:
        pmi_sections(lm)
    if "2" not in SECTIONS:
        return

    space = load_space("sst2")
    prompts = [
        Prompt(task="sst2", instruction=text, template=next(iter(space.templates.values())))
        for text in list(space.instructions.values())[:5]
    ]
    scorer = Scorer(lm, task)
    members = [CardMember(p, fit_rule(parse_rule("argmax"), scorer, p, dev)) for p in prompts]
    serve = {}
    for k in (1, 3, 5):
        runs = []
        for _ in range(ROUNDS):
            fresh = Scorer(lm, task)
            start = time.perf_counter()
            answer_table(fresh, members[:k], test)
            runs.append(time.perf_counter() - start)
        serve[k] = statistics.median(runs)
    print(f"[2] serving {ITEMS} inputs (fresh scorer each round), median of {ROUNDS}")
    for k, seconds in serve.items():
        print(f"  K = {k}: {seconds:6.2f} s, {ITEMS / seconds:6.1f} inputs/s, {seconds / serve[1]:5.2f}x one prompt")


def pmi_sections(lm) -> None:
    """[3] and [4]: what pmi adds per trial and per served input, on per-item choices (ARC-Easy)."""
    from promptopt.decision import parse_rule
    from promptopt.scoring import Scorer
    from promptopt.scoring.calibration import RunningDecision, fit_rule
    from promptopt.scoring.card_answers import CardMember, answer_table
    from promptopt.tasks import load_task

    task = load_task("arc_easy")
    dev, test, base = task.dev[:ARC_ITEMS], task.test[:ARC_ITEMS], task.default_prompt()

    def trial(rule: str, hidden: bool) -> float:
        scorer = Scorer(lm, task)
        start = time.perf_counter()
        running = RunningDecision(scorer_adapter(scorer), base.with_(decision=rule), hidden=hidden)
        for i in range(0, len(dev), 16):
            running.add(dev[i : i + 16])
        running.decided()
        return time.perf_counter() - start

    if "3" in SECTIONS:
        cases = [("argmax", False), ("pmi", False), ("pmi", True)]
        times = {case: [] for case in cases}
        trial("argmax", False)
        for r in range(ROUNDS):
            for case in cases if r % 2 == 0 else cases[::-1]:
                times[case].append(trial(*case))
        baseline = statistics.median(times[("argmax", False)])
        print(
            f"[3] one trial: {ARC_ITEMS} ARC-Easy dev items, default prompt, no result cache, median of {ROUNDS} rounds"
        )
        for case in cases:
            median = statistics.median(times[case])
            label = f"{case[0]}{' + δ_TCB on the decided distribution' if case[1] else ''}"
            print(f"  {label:48s} {median:7.2f} s  {median / baseline:5.3f}x argmax")
    if "4" in SECTIONS:
        scorer = Scorer(lm, task)
        members = {
            name: [CardMember(base, fit_rule(parse_rule(name), scorer, base, dev))] for name in ("argmax", "pmi")
        }
        runs = {"argmax": [], "pmi": [], "argmax (warm)": [], "pmi (warm)": []}
        for r in range(ROUNDS):
            for name in ["argmax", "pmi"] if r % 2 == 0 else ["pmi", "argmax"]:
                fresh = Scorer(lm, task)
                for label in (name, f"{name} (warm)"):  # again on the same scorer: its caches full
                    start = time.perf_counter()
                    answer_table(fresh, members[name], test)
                    runs[label].append(time.perf_counter() - start)
        baseline = statistics.median(runs["argmax"])
        warm = statistics.median(runs["argmax (warm)"])
        print(f"[4] serving {ARC_ITEMS} ARC-Easy inputs (answer_table, as serve answers), median of {ROUNDS}")
        for name, values in runs.items():
            median = statistics.median(values)
            ratio = median / (warm if "warm" in name else baseline)
            print(
                f"  {name:14s} {median:6.2f} s  {1000 * median / ARC_ITEMS:7.1f} ms/input  {ratio:5.3f}x argmax"
                + (" (warm)" if "warm" in name else "")
            )


def scorer_adapter(scorer):
    """A plain Scorer seen as the caching scorer a trial holds: score_table and score_with_hidden."""

    class Adapter:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def score_table(self, prompt, items):
            return self.inner.score(prompt, items).table

        def score_with_hidden(self, prompt, items):
            result = self.inner.score(prompt, items)
            return result.table, result.hidden

    return Adapter(scorer)


if __name__ == "__main__":
    main()
