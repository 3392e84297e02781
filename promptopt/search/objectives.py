"""Search strategies: what a trial's per-item results are worth.

Each single-objective strategy scores an item i and the trial's value is the mean over the dev items,
so per-item values can be reported to a paired pruner (Optuna's WilcoxonPruner) as they arrive.

- accuracy:  v_i = correct_i
- ppl:       v_i = correct_i − λ_ppl · nll_i, nll_i = −log p(gold answer | prompt) per answer token
             (the δ_TCB paper's PPL-guided baseline: prefer prompts that make the gold answer likely).
- tcb:       v_i = correct_i + λ_tcb · sign_i · stability_i, with
             stability_i = (clip(log10 δ_TCB,i, −1, 5) + 1) / 6 ∈ [0, 1]  (scale-free: δ spans 1 … 50,000)
             sign_i = +1 when item i is correct, −1 when it is wrong.
             A stably *correct* answer is rewarded, a stably *wrong* one ("confidently and stably wrong")
             is penalized, so stability never buys accuracy back. λ_tcb = 0.25: a full swing of stability
             on every item is worth a quarter of accuracy; accuracy dominates, stability decides near-ties.
- pareto:    two objectives, both maximized: accuracy and mean signed stability (Σ sign_i · stability_i / n),
             searched with NSGA-II; the Pareto front is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from promptopt.errors import ConfigError

LAMBDA_PPL = 0.1
LAMBDA_TCB = 0.25
_LOG_TCB_RANGE = (-1.0, 5.0)


def stability(tcb: np.ndarray | pd.Series) -> np.ndarray:
    """Scale-free stability in [0, 1]: clipped log10 δ_TCB (δ = +inf maps to 1)."""
    lo, hi = _LOG_TCB_RANGE
    values = np.asarray(tcb, dtype=float)
    logs = np.where(np.isposinf(values), hi, np.log10(np.clip(values, 1e-300, None)))
    logs = np.where(np.isnan(values), lo, logs)  # no critical point: no credit
    return (np.clip(logs, lo, hi) - lo) / (hi - lo)


def signed_stability(table: pd.DataFrame) -> np.ndarray:
    sign = np.where(table["correct"].to_numpy(dtype=bool), 1.0, -1.0)
    return sign * stability(table["tcb"])


@dataclass(frozen=True)
class Strategy:
    name: str
    directions: tuple[str, ...]
    description: str

    @property
    def multi_objective(self) -> bool:
        return len(self.directions) > 1

    def item_values(self, table: pd.DataFrame) -> np.ndarray:
        """Per-item contributions (single-objective strategies only); their mean is the trial value."""
        correct = table["correct"].to_numpy(dtype=float)
        if self.name == "accuracy":
            return correct
        if self.name == "ppl":
            return correct - LAMBDA_PPL * np.log(table["ppl"].to_numpy(dtype=float))  # log ppl = nll per token
        if self.name == "tcb":
            return correct + LAMBDA_TCB * signed_stability(table)
        raise ValueError(f"{self.name} has no per-item value")

    def values(self, table: pd.DataFrame) -> tuple[float, ...]:
        if self.name == "pareto":
            return float(table["correct"].mean()), float(signed_stability(table).mean())
        return (float(self.item_values(table).mean()),)


STRATEGIES = {
    "accuracy": Strategy("accuracy", ("maximize",), "dev accuracy only"),
    "ppl": Strategy("ppl", ("maximize",), f"accuracy − {LAMBDA_PPL}·mean gold NLL per token (PPL-guided baseline)"),
    "tcb": Strategy("tcb", ("maximize",), f"accuracy + {LAMBDA_TCB}·mean signed stability (δ_TCB-guided)"),
    "pareto": Strategy("pareto", ("maximize", "maximize"), "Pareto front of (accuracy, mean signed stability)"),
}


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy '{name}': use one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
