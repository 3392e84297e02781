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

    from promptopt.robustness.suite import Similarity, evaluate_robustness, load_suite
    from promptopt.scoring.calibration import deciding_scorer
    from promptopt.study import SearchConfig, run_search
    from promptopt.study.strategies import signed_stability
    from promptopt.workflows.session import Session

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


def analyze(out: Path = OUT) -> dict:
    """What the candidates say, dev only: Spearman's ρ (95% bootstrap interval over candidates) of each dev-side
    signal against dev Acc_worst under the unseen families; the same within each tie set of the selection rule; and
    leave-one-family-out: does Acc_worst under the other families rank the candidates as the held-out family does?"""
    import numpy as np
    import pandas as pd

    from promptopt.metrics.stats import spearman, spearman_interval
    from promptopt.metrics.stats.selection import Candidate, choose

    cands = pd.read_csv(out / "candidates.csv")
    items = pd.read_parquet(out / "items.parquet")
    cands["cheap_rate"] = cands["cheap_acc_worst"] / cands["dev_accuracy"]  # robust share of the right answers
    cands["unseen_rate"] = cands["unseen_acc_worst"] / cands["dev_accuracy"]
    cands["calibrated"] = (cands["decision"] != "argmax").astype(float)
    report: dict = {"n_candidates": len(cands), "n_prompts": int(cands["trial"].nunique())}

    def rho(x, y):
        x, y = np.asarray(x, float), np.asarray(y, float)
        return round(spearman(x, y), 3), [round(v, 3) for v in spearman_interval(x, y, seed=0)]

    cheap_fams = [c for c in cands.columns if c.startswith("cheap:")]
    cands["cheap_family_mean"] = cands[cheap_fams].mean(axis=1)  # mean accuracy over the families that apply
    cands["cheap_families_applied"] = cands[cheap_fams].notna().sum(axis=1)
    unseen_fams = [c for c in cands.columns if c.startswith("unseen:")]
    cands["unseen_family_mean"] = cands[unseen_fams].mean(axis=1)
    signals = {
        "dev_accuracy": cands["dev_accuracy"],
        "stability": cands["signed_stability"],
        "-cost": -cands["prompt_tokens"],
        "cheap_acc_worst": cands["cheap_acc_worst"],
        "cheap_family_mean": cands["cheap_family_mean"],
        "-cheap_families_applied": -cands["cheap_families_applied"],
    }
    report["rho_vs_unseen_family_mean"] = {k: rho(v, cands["unseen_family_mean"]) for k, v in signals.items()}
    report["rho_vs_unseen_acc_worst"] = {k: rho(v, cands["unseen_acc_worst"]) for k, v in signals.items()}
    report["rho_vs_unseen_rate"] = {
        **{k: rho(v, cands["unseen_rate"]) for k, v in signals.items() if k != "cheap_acc_worst"},
        "cheap_rate": rho(cands["cheap_rate"], cands["unseen_rate"]),
    }
    pivot = cands.pivot(index="trial", columns="decision", values="unseen_acc_worst")
    if {"argmax", "batch"} <= set(pivot.columns):
        diff = (pivot["batch"] - pivot["argmax"]).to_numpy()
        boots = np.random.default_rng(0).choice(diff, (2000, len(diff))).mean(axis=1)
        report["calibrated_minus_argmax_unseen_acc_worst"] = [
            round(float(diff.mean()), 3),
            [round(float(np.quantile(boots, q)), 3) for q in (0.025, 0.975)],
            f"batch better on {int((diff > 0).sum())}, worse on {int((diff < 0).sum())} of {len(diff)} prompts",
        ]
    # per-family: which unseen families does the cheap suite's Acc_worst rank the candidates by?
    fams = [c for c in cands.columns if c.startswith("unseen:") and cands[c].notna().all()]
    report["rho_cheap_acc_worst_vs_unseen_family_acc"] = {
        f.split(":", 1)[1]: rho(cands["cheap_acc_worst"], cands[f]) for f in fams
    }
    # leave one family out over every family (cheap and unseen): Acc_worst under the rest vs accuracy under it
    variants = items[items["suite"] != "clean"]
    clean = items[items["suite"] == "clean"]
    keys = ["trial", "decision"]
    lofo = {}
    for fam in sorted(variants["family"].unique()):
        rest = variants[variants["family"] != fam].groupby([*keys, "item_id"])["correct"].all()
        ok = clean.set_index([*keys, "item_id"])["correct"].astype(bool)
        worst_rest = (ok & rest.reindex(ok.index, fill_value=True)).groupby(keys).mean()
        held = variants[variants["family"] == fam].groupby(keys)["correct"].mean()
        both = pd.concat([worst_rest.rename("rest"), held.rename("held")], axis=1).dropna()
        if len(both) > 3:
            lofo[fam] = rho(both["rest"], both["held"])
    report["leave_one_family_out"] = lofo
    # within tie sets: among candidates dev cannot tell apart, which tie-break picks the higher unseen Acc_worst?
    correct = clean.pivot_table(index=keys, columns="item_id", values="correct", aggfunc="first").astype(bool)
    rows = cands.set_index(keys)
    rows["cheap_family_mean"] = cands.set_index(keys)["cheap_family_mean"]
    picks = {}
    for tie_break in ("stability", "cost", "calibrated", "value"):
        cs = [
            Candidate(
                key=k,
                label=f"{k[0]}/{k[1]}",
                correct=correct.loc[k].tolist(),
                order=j,
                stability=float(rows.loc[k, "signed_stability"]),
                cost=float(rows.loc[k, "prompt_tokens"]),
                calibrated=k[1] != "argmax",
                value=float(rows.loc[k, "dev_accuracy"]),
            )
            for j, k in enumerate(correct.index)
        ]
        sel = choose(cs, tie_break=tie_break)
        tied = [c.key for c in sel.tie_set]
        picks[tie_break] = {
            "winner": sel.winner.label,
            "unseen_acc_worst": round(float(rows.loc[sel.winner.key, "unseen_acc_worst"]), 3),
            "tie_set": len(tied),
            "tie_set_unseen_acc_worst_mean": round(float(rows.loc[tied, "unseen_acc_worst"].mean()), 3),
            "rank_in_tie_set": int(
                (rows.loc[tied, "unseen_acc_worst"] > rows.loc[sel.winner.key, "unseen_acc_worst"]).sum()
            )
            + 1,
            "mde": round(sel.mde, 3),
        }
    report["tie_breaks"] = picks
    # every pair dev cannot tell apart (the rule's paired test): how often does each tie-break prefer the one with the
    # higher unseen Acc_worst (pairs equal on it, or on the tie-break, left out)?
    from promptopt.metrics.stats.selection import compare_with_best

    by_key = {c.key: c for c in cs}
    tied_pairs = []
    for i, a in enumerate(cs):
        for b in cs[i + 1 :]:
            first, second = (a, b) if a.accuracy >= b.accuracy else (b, a)
            if not compare_with_best(first, [second])[0].worse:
                tied_pairs.append((first.key, second.key))
    unseen = rows["unseen_acc_worst"]
    prefer = {
        "stability": lambda k: rows.loc[k, "signed_stability"],
        "cost": lambda k: -rows.loc[k, "prompt_tokens"],
        "calibrated": lambda k: float(k[1] != "argmax"),
        "value": lambda k: rows.loc[k, "dev_accuracy"],
        "cheap_acc_worst": lambda k: rows.loc[k, "cheap_acc_worst"],
        "cheap_family_mean": lambda k: rows.loc[k, "cheap_family_mean"],
    }
    concord = {}
    for name, f in prefer.items():
        agree = disagree = 0
        for x, y in tied_pairs:
            dx, du = f(x) - f(y), unseen[x] - unseen[y]
            if dx == 0 or du == 0:
                continue
            agree += (dx > 0) == (du > 0)
            disagree += (dx > 0) != (du > 0)
        concord[name] = {"agree": agree, "disagree": disagree, "rate": round(agree / max(1, agree + disagree), 3)}
    report["tied_pairs"] = len(tied_pairs)
    report["tie_break_concordance_on_tied_pairs"] = concord
    del by_key
    # within the tie set: Spearman of each signal against unseen Acc_worst, tie-set members only
    tied_keys = [tuple(k) for k in [c.key for c in choose(cs, tie_break="value").tie_set]]
    sub = rows.loc[tied_keys]
    report["within_tie_set_rho_vs_unseen_acc_worst"] = {
        "stability": rho(sub["signed_stability"], sub["unseen_acc_worst"]),
        "-cost": rho(-sub["prompt_tokens"], sub["unseen_acc_worst"]),
        "calibrated": rho((np.array([k[1] for k in tied_keys]) != "argmax").astype(float), sub["unseen_acc_worst"]),
        "cheap_acc_worst": rho(sub["cheap_acc_worst"], sub["unseen_acc_worst"]),
    }
    return report


if __name__ == "__main__":
    if os.environ.get("SEL_ANALYZE"):
        print(json.dumps(analyze(), indent=1, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
    else:
        main()
