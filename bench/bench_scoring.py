"""Benchmark 2: k-shot scoring throughput — prefix-cached vs uncached, and vs lm-evaluation-harness on the
same items, model (the de-quantized embedded SmolLM2 folder) and prompt (SST-2, fixed 4-shot
"Review: …\\nSentiment:" with " negative"/" positive"). Predictions must agree item by item.

Needs `pip install lm-eval` beside the project (`make bench` does it). Target: ≥ 5× lm-eval's items/s.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

N_ITEMS = int(os.environ.get("BENCH_ITEMS", "200"))


def lm_eval_task(folder: Path, shots, items) -> str:
    (folder / "pool.jsonl").write_text("\n".join(json.dumps({"sentence": s.question, "label": s.gold}) for s in shots))
    (folder / "items.jsonl").write_text("\n".join(json.dumps({"sentence": i.question, "label": i.gold}) for i in items))
    (folder / "bench_sst2.yaml").write_text(
        f"""task: bench_sst2
dataset_path: json
dataset_kwargs:
  data_files: {{train: {folder / 'pool.jsonl'}, test: {folder / 'items.jsonl'}}}
training_split: train
test_split: test
fewshot_split: train
fewshot_config: {{sampler: first_n}}
num_fewshot: {len(shots)}
output_type: multiple_choice
doc_to_text: "Review: {{{{sentence}}}}\\nSentiment:"
doc_to_choice: ["negative", "positive"]
doc_to_target: label
target_delimiter: " "
fewshot_delimiter: "\\n\\n"
metric_list:
  - metric: acc
"""
    )
    return "bench_sst2"


def main() -> None:
    import torch

    from promptopt.models import load_model
    from promptopt.models.load import _dequantized_folder, _resolve
    from promptopt.scoring import Scorer
    from promptopt.tasks import load_task

    torch.set_num_threads(2)
    lm = load_model("smollm2-135m-instruct", device="cpu")
    task = load_task("sst2")
    items = task.dev[:N_ITEMS]
    prompt = task.default_prompt()
    assert prompt.template.query == "Review: {question}\nSentiment:" and len(prompt.exemplars) == 4

    scorer = Scorer(lm, task, batch_size=16)
    scorer.score(prompt, items[:8])
    start = time.perf_counter()
    cached = scorer.score(prompt, items)
    t_cached = time.perf_counter() - start
    scorer.runner.use_prefix_cache = False
    start = time.perf_counter()
    uncached = scorer.score(prompt, items)
    t_uncached = time.perf_counter() - start
    same = (cached.table["pred"] == uncached.table["pred"]).all()
    max_lp = (cached.table["gold_logprob"] - uncached.table["gold_logprob"]).abs().max()
    print(f"[2a] SST-2 4-shot, {len(items)} items: prefix-cached {len(items) / t_cached:.1f} items/s, "
          f"uncached {len(items) / t_uncached:.1f} items/s -> {t_uncached / t_cached:.2f}x "
          f"(same predictions: {same}, max |Δ log p| {max_lp:.2e})")

    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        print("[2b] lm-eval is not installed: pip install lm-eval (make bench does it)")
        sys.exit(1)
    _, folder, filename = _resolve("smollm2-135m-instruct")
    model_dir = _dequantized_folder(folder, filename)
    with tempfile.TemporaryDirectory() as tmp:
        name = lm_eval_task(Path(tmp), task.pool[:4], items)
        start = time.perf_counter()
        out = lm_eval.simple_evaluate(
            model="hf", model_args=f"pretrained={model_dir},dtype=float32", tasks=[name],
            task_manager=TaskManager(include_path=tmp), batch_size=16, device="cpu", log_samples=True,
        )
        t_lm_eval = time.perf_counter() - start
    samples = sorted(out["samples"][name], key=lambda s: s["doc_id"])
    lm_preds = [max(range(2), key=lambda c: s["filtered_resps"][c][0]) for s in samples]
    lm_gold_lp = [s["filtered_resps"][s["target"]][0] for s in samples]
    agree = sum(int(a == b) for a, b in zip(lm_preds, cached.table["pred"]))
    max_diff = max(abs(a - b) for a, b in zip(lm_gold_lp, cached.table["gold_logprob"]))
    ratio = t_lm_eval / t_cached
    print(f"[2b] lm-eval {len(items) / t_lm_eval:.2f} items/s (whole simple_evaluate call), promptopt {len(items) / t_cached:.1f} items/s "
          f"-> {ratio:.1f}x  (target ≥ 5x: {'met' if ratio >= 5 else 'NOT met'})")
    print(f"     identical predictions on {agree}/{len(items)} items; max |Δ log p(gold)| vs lm-eval {max_diff:.2e}; "
          f"acc promptopt {cached.summary['accuracy']:.3f} vs lm-eval {out['results'][name]['acc,none']:.3f}")


if __name__ == "__main__":
    main()
