"""Does a search pay? Today's search against the new one (incumbent, racing, scan), task by task, judged on test
against the prompt the user already had: the task's default prompt (issue 57).

For every task × seed × arm, `promptopt search` runs in a subprocess with the same trial budget and items:
- `old`: the search as it was before the incumbent (a checkout of the commit before it, `--old-tree`);
- `new`: this tree's search with its defaults (the incumbent, racing, the scan advising);
then the card it shipped and the task's default prompt are scored on the same test items in this process and paired:
Δ = shipped − default with its 95% paired bootstrap interval and the exact McNemar p. Recorded per run: the search's
CPU seconds (its process's user + system, this machine's noise is in them), the (prompt, item) pairs it scored (no
noise: the cache's misses), the scan's verdict and whether the incumbent was kept.

Where does a better prompt exist at all? `--sample K` scores K prompts drawn at random from the space on every dev and
test item once per task; the best of them on dev (dev chooses) is paired with the default on test.

Resumable and recorded: each finished unit is one line of OUT/results.jsonl (a rerun skips what is there; a killed
search restarts in a fresh folder), and `--table` prints the Markdown table of what is there.

    .venv/bin/python bench/search_value.py --out bench/runs/search_value --old-tree /work/wt-old \
        --tasks sst2,arc_easy,copa,sciq,piqa,siqa --seeds 1 --trials 12 --dev-limit 60 --test-limit 150 --sample 12
    .venv/bin/python bench/search_value.py --out bench/runs/search_value --table
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = {  # name -> (task, space or None: the task's built-in space)
    "sst2": ("sst2", None),
    "arc_easy": ("arc_easy", None),
    "copa": ("examples/custom_task/copa.yaml", "examples/custom_task/copa_space.yaml"),
    "sciq": ("examples/choice_tasks/sciq.yaml", "examples/choice_tasks/sciq_space.yaml"),
    "piqa": ("examples/choice_tasks/piqa.yaml", "examples/choice_tasks/piqa_space.yaml"),
    "siqa": ("bench/tasks/siqa.yaml", "bench/tasks/siqa_space.yaml"),
}


def done_keys(results: Path) -> set[str]:
    if not results.is_file():
        return set()
    return {json.loads(line)["key"] for line in results.read_text().splitlines() if line.strip()}


def append(results: Path, row: dict) -> None:
    with results.open("a") as f:  # one line per finished unit: a kill loses at most the unit in flight
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_search(arm: str, name: str, seed: int, args, out: Path) -> dict:
    """One search in a subprocess (a fresh run folder: no cache from an earlier try) -> its cost and summary."""
    task, space = TASKS[name]
    if out.exists():
        shutil.rmtree(out)
    tree = Path(args.old_tree) if arm == "old" else Path(args.new_tree or ROOT)
    command = [sys.executable, "-m", "promptopt", "search"]
    command += ["--task", str(ROOT / task) if task.endswith(".yaml") else task]
    command += ["--space", str(ROOT / space)] if space else []
    command += ["--trials", str(args.trials), "--seed", str(seed), "--out", str(out), "--quiet"]
    command += ["--dev-limit", str(args.dev_limit), "--test-limit", str(args.test_limit), "--model", args.model]
    if arm == "new-stop":
        command += ["--scan", "stop"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    cpu, wall = children_cpu(), time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    cpu, wall = children_cpu() - cpu, time.perf_counter() - wall
    if done.returncode != 0:
        raise SystemExit(f"{arm} {name} seed {seed}: search failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"cpu_seconds": cpu, "wall_seconds": wall, "summary": summary, "commit": commit.stdout.strip()}


class Scorer:
    """The task's default prompt and any card, scored on the same test (and dev) items by this tree's scorer."""

    def __init__(self, name: str, args) -> None:
        from promptopt.models import ModelConfig
        from promptopt.tasks import DataConfig
        from promptopt.workflows.session import Session

        task, _ = TASKS[name]
        task = str(ROOT / task) if task.endswith(".yaml") else task
        self.session = Session(
            model=ModelConfig(spec=args.model),
            data=DataConfig(task=task, dev_limit=args.dev_limit, test_limit=args.test_limit),
            out=Path(args.out) / "cache" / name,
        )

    def correct(self, prompt, split: str) -> list[bool]:
        from promptopt.scoring.calibration import RunningDecision

        running = RunningDecision(self.session.scorer, prompt)
        running.add(self.session.items(split))
        return [bool(c) for c in running.decided()["correct"]]

    def default(self):
        return self.session.data.default_prompt()


def paired(a: list[bool], b: list[bool]) -> dict:
    """a − b on the same items: difference, 95% paired bootstrap interval, exact McNemar p."""
    import numpy as np

    from promptopt.metrics.stats.binomial import mcnemar_exact
    from promptopt.metrics.stats.bootstrap import bootstrap_draws, percentile_interval

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    low, high = percentile_interval(bootstrap_draws(len(x), seed=0) @ (x - y) / len(x))
    only_a, only_b, p = mcnemar_exact(a, b)
    return {
        "a": float(x.mean()),
        "b": float(y.mean()),
        "delta": float((x - y).mean()),
        "ci95": [low, high],
        "mcnemar_p": p,
        "only_a": only_a,
        "only_b": only_b,
        "n": len(x),
    }


def sample_space(name: str, scorer: Scorer, args) -> dict:
    """K random prompts of the space on every dev and test item; the best on dev against the default on test."""
    import optuna

    from promptopt.study import SearchConfig
    from promptopt.study.context import build_context, fit_space_to_model
    from promptopt.study.trial import prompt_key

    task, space = TASKS[name]
    task = str(ROOT / task) if task.endswith(".yaml") else task
    config = SearchConfig.build(
        task=task, space=str(ROOT / space) if space else None, dev_limit=args.dev_limit, test_limit=args.test_limit
    )
    ctx = build_context(config, scorer.session.data)
    fit_space_to_model(ctx, scorer.session.scorer.lm.tokenizer)  # as the search does: no chat templates without one
    draft = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=20261206))
    default = scorer.default()
    default_dev, default_test = scorer.correct(default, "dev"), scorer.correct(default, "test")
    seen, rows = {prompt_key(default)}, []
    for _ in range(args.sample * 5):
        if len(rows) == args.sample:
            break
        prompt = ctx.space.suggest(draft.ask(), ctx.candidates, ctx.data.spec, None)
        if prompt_key(prompt) in seen:
            continue
        seen.add(prompt_key(prompt))
        rows.append((prompt, scorer.correct(prompt, "dev")))
    dev_acc = [sum(c) / len(c) for _, c in rows]
    best = max(range(len(rows)), key=lambda i: dev_acc[i])
    best_test = scorer.correct(rows[best][0], "test")
    # the scan's analysis on the sample itself (K prompts on every dev item, far above the scan's own budget): what
    # a scan this large would have said, beside what the search's own scan said on its first slice
    from promptopt.study.scan import analyse

    wide = analyse([c for _, c in rows], default_dev, dev_items=len(default_dev))
    return {
        "sampled": len(rows),
        "scan_on_sample": wide.record(),
        "dev_accuracies": dev_acc,
        "default_dev": sum(default_dev) / len(default_dev),
        "best_dev_vs_default": paired(rows[best][1], default_dev),
        "best_test_vs_default": paired(best_test, default_test),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/runs/search_value")
    parser.add_argument("--old-tree", default=None, help="a checkout of the search before the incumbent")
    parser.add_argument("--new-tree", default=None, help="a checkout of the new search (default: this tree)")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--arms", default="old,new")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--dev-limit", type=int, default=60)
    parser.add_argument("--test-limit", type=int, default=150)
    parser.add_argument("--sample", type=int, default=0, help="K random prompts per task on all of dev and test")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--table", action="store_true", help="print the table of what is recorded, run nothing")
    args = parser.parse_args()
    out = Path(args.out).resolve()  # the searches run in other trees' folders
    results = out / "results.jsonl"
    if args.table:
        print(table(results))
        return
    out.mkdir(parents=True, exist_ok=True)
    arms = [a for a in args.arms.split(",") if a]  # --arms "" with --sample: only the samples
    if "old" in arms and not args.old_tree:
        raise SystemExit("--old-tree: a checkout of the commit before the incumbent (git worktree add DIR 402e3df)")
    settings = {k: getattr(args, k) for k in ("trials", "dev_limit", "test_limit", "model")}
    for name in args.tasks.split(","):
        scorer = None
        for seed in [int(s) for s in args.seeds.split(",")]:
            for arm in arms:
                key = f"{name}/{args.model}/seed{seed}/{arm}/t{args.trials}-d{args.dev_limit}-n{args.test_limit}"
                if key in done_keys(results):
                    continue
                print(f"search_value: {key}", file=sys.stderr, flush=True)
                run = run_search(arm, name, seed, args, out / "runs" / key)
                scorer = scorer or Scorer(name, args)
                from promptopt.prompts import load_card

                shipped, _ = load_card(out / "runs" / key / "best_card.yaml")
                versus = paired(scorer.correct(shipped, "test"), scorer.correct(scorer.default(), "test"))
                summary = run["summary"]
                append(
                    results,
                    {
                        "key": key,
                        "task": name,
                        "seed": seed,
                        "arm": arm,
                        "commit": run["commit"],  # the searched tree's: a rerun of an arm on new code is told apart
                        **settings,
                        "cpu_seconds": run["cpu_seconds"],
                        "wall_seconds": run["wall_seconds"],
                        "pairs_scored": summary.get("pairs_scored"),
                        "dev_items_spent": summary.get("dev_items_spent"),
                        "trials": summary.get("trials"),
                        "kept_incumbent": (summary.get("incumbent") or {}).get("kept"),
                        "scan": summary.get("scan"),
                        "selection": summary.get("selection"),
                        "dev_accuracy": summary["dev"]["accuracy"],
                        "shipped_vs_default_test": versus,
                        "date": time.strftime("%Y-%m-%d"),
                    },
                )
        key = f"{name}/{args.model}/sample{args.sample}/d{args.dev_limit}-n{args.test_limit}"
        if args.sample and key not in done_keys(results):
            print(f"search_value: {key}", file=sys.stderr, flush=True)
            scorer = scorer or Scorer(name, args)
            append(results, {"key": key, "task": name, "arm": "sample", **settings, **sample_space(name, scorer, args)})
    print(table(results))


def table(results: Path) -> str:
    """The Markdown table of every recorded unit."""
    if not results.is_file():
        return "(nothing recorded yet)"
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    lines = [
        "| task | arm | seed | shipped − default on test [95% CI], McNemar p | kept default | scan | CPU s | pairs scored |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["arm"] == "sample":
            v, d = r["best_test_vs_default"], r["best_dev_vs_default"]
            lines.append(
                f"| {r['task']} | best of {r['sampled']} random (dev {d['delta']:+.3f} [{d['ci95'][0]:+.3f}, "
                f"{d['ci95'][1]:+.3f}]) | – | {v['delta']:+.3f} [{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}], p {v['mcnemar_p']:.3g} "
                f"(n {v['n']}) | – | – | – | – |"
            )
            continue
        v = r["shipped_vs_default_test"]
        scan = (r.get("scan") or {}).get("verdict", "–")
        lines.append(
            f"| {r['task']} | {r['arm']} | {r['seed']} | {v['delta']:+.3f} [{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}], "
            f"p {v['mcnemar_p']:.3g} (n {v['n']}) | {r.get('kept_incumbent')} | {scan} | {r['cpu_seconds']:.0f} | "
            f"{r.get('pairs_scored')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
