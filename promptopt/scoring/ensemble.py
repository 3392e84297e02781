"""An ensemble's answers from its members' decided tables: the argmax of the mean of the members'
label-normalized decision scores (promptopt.decision.ensemble_scores), δ_TCB the minimum over members."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from promptopt.decision import ensemble_scores


def combined_decisions(tables: Sequence[pd.DataFrame], keys: Sequence[str] = ("item_id",)) -> pd.DataFrame:
    """The ensemble's answers on rows the member tables share (joined on `keys`): `pred` and, where the tables
    carry gold, `correct`. Rows a member lacks are left out."""
    merged = None
    for k, table in enumerate(tables):
        part = table[[*keys, "decision_scores", *(["gold"] if "gold" in table and k == 0 else [])]].rename(
            columns={"decision_scores": f"scores_{k}"}
        )
        merged = part if merged is None else merged.merge(part, on=list(keys), how="inner")
    scores = [ensemble_scores([list(row[f"scores_{k}"]) for k in range(len(tables))]) for _, row in merged.iterrows()]
    out = merged[list(keys) + (["gold"] if "gold" in merged else [])].copy()
    out["decision_scores"] = scores
    out["pred"] = [int(np.argmax(s)) for s in scores]
    if "gold" in out:
        out["correct"] = out["pred"].to_numpy() == out["gold"].to_numpy()
    return out.reset_index(drop=True)


def ensemble_test(tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The ensemble's test answers from its members' decided test tables (item_id, gold, decision_scores, tcb):
    `correct`, `pred`, and δ_TCB as the minimum over members (the most fragile member bounds the ensemble)."""
    combined = combined_decisions(tables)
    tcb = pd.concat([t.set_index("item_id")["tcb"].rename(k) for k, t in enumerate(tables)], axis=1).min(axis=1)
    combined["tcb"] = combined["item_id"].map(tcb).to_numpy(dtype=float)
    combined["ppl"] = np.nan  # a perplexity belongs to one prompt
    combined["decision"] = f"ensemble of {len(tables)}"
    return combined


__all__ = ["combined_decisions", "ensemble_test"]
