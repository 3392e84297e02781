"""Dev-side evidence for issue 51's selection rule: which tie-break predicts robustness on families a search never
saw, and does robustness under the search suite (`cheap`) transfer to the judging suite (`unseen`)?

Everything here reads dev items only: an `accuracy` search (pruning off, so every trial completes) on the first
SEL_DEV dev items gives SEL_TRIALS candidate prompts; each prompt, decided by argmax and by `batch` (fit on the same
dev items), is stressed on those dev items under `cheap` and under `unseen`. Per candidate it records dev accuracy,
mean signed stability (δ_TCB on the decided distribution), prompt tokens (cost), Acc_worst under each suite, and
accuracy under every family; per item, each answer (so the analysis can pair and resample). No test item is read.

Writes SEL_OUT/candidates.csv, SEL_OUT/items.parquet (clean + every variant's answer, per candidate) and
SEL_OUT/timing.json (seconds per 100 clean dev items scored, cold cache). Run:
    OMP_NUM_THREADS=1 nice -n 10 python bench/selection_transfer.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TASK = os.environ.get("SEL_TASK", "sst2")
TRIALS = int(os.environ.get("SEL_TRIALS", "12"))
DEV = int(os.environ.get("SEL_DEV", "80"))
SEED = int(os.environ.get("SEL_SEED", "0"))
OUT = Path(os.environ.get("SEL_OUT", "/tmp/selection_transfer"))
DECISIONS = tuple(os.environ.get("SEL_DECISIONS", "argmax,batch").split(","))


def main() -> None:
    import optuna
    import pandas as pd
    import torch

    from promptopt.experiments.session import Session
    from promptopt.robustness.suite import Similarity, evaluate_robustness, load_suite
    from promptopt.scoring.calibration import deciding_scorer
    from promptopt.search import SearchConfig, run_search
    from promptopt.search.strategies import signed_stability

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    OUT.mkdir(parents=True, exist_ok=True)
    base = SearchConfig.build(
        task=TASK,
        strategy="accuracy",
        trials=TRIALS,
        dev_limit=DEV,
        test_limit=1,
        device="cpu",
        seed=SEED,
        pruning=False,
        out=str(OUT / "search"),
    )
    session = Session(model=base.model, data=base.data, out=OUT, keep_hidden=True)
    dev = session.items("dev", DEV)
    tokenizer = session.lm.tokenizer
    started = time.perf_counter()
    result = run_search(base, scorer=session.scorer, show_progress=False)
    search_seconds = time.perf_counter() - started
    suites = {name: load_suite(name) for name in ("cheap", "unseen")}
    similarity, rows, items = Similarity(), [], []
    for entry in result.ranking:
        for decision in DECISIONS:
            prompt = dataclasses.replace(entry["prompt"], decision=decision)
            scorer, _ = deciding_scorer(session.scorer, prompt, dev)
            clean = scorer.score(prompt, dev).table
            cost = len(tokenizer(prompt.context(dev[0].question, dev[0].choices, tokenizer=tokenizer))["input_ids"])
            row = {
                "trial": entry["number"],
                "decision": decision,
                "dev_accuracy": float(clean["correct"].mean()),
                "signed_stability": float(signed_stability(clean).mean()),
                "prompt_tokens": cost,
                "n_exemplars": len(prompt.exemplars),
            }
            for name, suite in suites.items():
                rob = evaluate_robustness(
                    scorer,
                    prompt,
                    dev,
                    suite,
                    pool=session.data.pool,
                    similarity=similarity,
                    paraphrases=session.paraphrases,
                )
                row[f"{name}_acc_worst"] = rob.summary["acc_worst"]
                for fam in rob.families.itertuples():
                    row[f"{name}:{fam.family}"] = fam.acc_perturbed
                variants = rob.variants[["item_id", "family", "correct"]].assign(suite=name)
                items.append(variants.assign(trial=entry["number"], decision=decision))
            items.append(
                clean[["item_id", "correct"]].assign(
                    family="",
                    suite="clean",
                    trial=entry["number"],
                    decision=decision,
                    stability=signed_stability(clean),
                )
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
        pd.DataFrame(rows).to_csv(OUT / "candidates.csv", index=False)  # after every prompt: a partial run reads
        pd.concat(items, ignore_index=True).to_parquet(OUT / "items.parquet")
    misses = session.scorer.cache.misses
    (OUT / "timing.json").write_text(
        json.dumps(
            {
                "search_seconds": search_seconds,
                "trials": TRIALS,
                "dev": DEV,
                "seconds_per_100_dev_items_per_trial": 100 * search_seconds / (TRIALS * DEV),
                "pairs_scored": misses,
                "load": os.getloadavg(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
