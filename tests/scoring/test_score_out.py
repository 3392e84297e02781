"""`score --out` and compare's test_items.parquet store `gold` and `pred` in the same types (one function,
scoring/stored.py): on a choice task both are integers, so `(pred == gold)` is the judge's `correct` in either
table; where answers are text (a generative task), both columns are text."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tests.clirun import promptopt as run_cli


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_score_out_types_gold_and_pred_as_compare_does(suffix, tiny_llama_dir, tmp_path):
    from promptopt.study import SearchConfig
    from promptopt.workflows.compare import run_compare

    out = tmp_path / f"items{suffix}"
    result = run_cli("score", "--task", "sst2", "--model", tiny_llama_dir, "--device", "cpu", "--split", "test",
                     "--limit", "6", "--out", out)  # fmt: skip
    assert result.code == 0, result.stderr
    scored = pd.read_parquet(out) if suffix == ".parquet" else pd.read_csv(out)
    assert scored["gold"].dtype == scored["pred"].dtype == np.int64, scored.dtypes
    assert ((scored["pred"] == scored["gold"]) == scored["correct"].astype(bool)).all()

    config = SearchConfig.build(task="sst2", trials=1, model=str(tiny_llama_dir), out=str(tmp_path / "cmp"),
                                dev_limit=4, test_limit=6, device="cpu")  # fmt: skip
    run_compare(config, ["accuracy"], suite=None, top_n=1, show_progress=False)
    searched = pd.read_parquet(tmp_path / "cmp" / "accuracy" / "best_test_items.parquet")  # the search's own table
    assert searched["gold"].dtype == scored["gold"].dtype and searched["pred"].dtype == scored["pred"].dtype
    compared = pd.read_parquet(tmp_path / "cmp" / "test_items.parquet")
    assert compared["gold"].dtype == scored["gold"].dtype and compared["pred"].dtype == scored["pred"].dtype
    baseline = compared[compared["strategy"] == "baseline"].reset_index(drop=True)
    assert baseline["gold"].tolist() == scored["gold"].tolist()  # the same items, the same golds, the same type
    assert baseline["pred"].tolist() == scored["pred"].tolist()  # the default prompt both times


def test_answer_columns_one_type_for_both():
    from promptopt.scoring.stored import answer_columns

    ints = answer_columns(pd.DataFrame({"gold": [0, 1], "pred": [np.int64(1), 1], "x": ["a", "b"]}))
    assert ints["gold"].dtype == ints["pred"].dtype == np.int64 and ints["x"].tolist() == ["a", "b"]
    missing = answer_columns(pd.DataFrame({"gold": [0, 1], "pred": [1, None]}, dtype=object))
    assert str(missing["pred"].dtype) == "Int64" and missing["pred"].isna().tolist() == [False, True]
    text = answer_columns(pd.DataFrame({"gold": ["12", 7], "pred": [12, None], "aliases": [1, 2]}))
    assert text["gold"].tolist() == ["12", "7"] and text["pred"].tolist()[0] == "12"
    assert pd.isna(text["pred"].tolist()[1])
    aliases = answer_columns(pd.DataFrame({"gold": [["Paris", "paris"]], "pred": ["Paris"]}))
    assert aliases["gold"].tolist() == ['["Paris", "paris"]']
    assert answer_columns(pd.DataFrame({"gold": [math.nan], "pred": [math.nan]}))["pred"].isna().all()
    untouched = pd.DataFrame({"item_id": ["a"]})
    assert answer_columns(untouched) is untouched
