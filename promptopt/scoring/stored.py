"""The answer columns of a per-item table as every written table stores them (`score --out`, compare's
test_items.parquet): `gold` and `pred` in one type, so `(table.pred == table.gold)` reads as the judge did for a
choice task whichever command wrote the table."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

ANSWER_COLUMNS = ("gold", "pred")


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _integer(value) -> bool:
    """An int, or a whole float (pandas turns a column of ints with a missing value into floats)."""
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, (int, np.integer)) or (
        isinstance(value, (float, np.floating)) and float(value).is_integer()
    )


def _text(value):
    if _missing(value):
        return None
    if isinstance(value, (list, tuple, dict, np.ndarray)):
        return json.dumps(value.tolist() if isinstance(value, np.ndarray) else value, default=str)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))  # 12.0 from a column pandas made float: the answer was 12
    return str(value)


def answer_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of `frame` whose `gold` and `pred` share one type: integers (int64, or nullable Int64 where an answer
    is missing) when every value of both is an integer (a choice index), else text (a list of aliases as JSON;
    a missing answer stays missing). A table without those columns is returned as it is."""
    names = [c for c in ANSWER_COLUMNS if c in frame.columns]
    if not names:
        return frame
    table = frame.copy()
    values = [v for c in names for v in table[c].tolist() if not _missing(v)]
    if values and all(_integer(v) for v in values):
        for c in names:
            nulls = table[c].map(_missing).any()
            table[c] = table[c].map(lambda v: None if _missing(v) else int(v)).astype("Int64" if nulls else "int64")
    else:
        for c in names:
            table[c] = table[c].map(_text).astype(object)
    return table


__all__ = ["ANSWER_COLUMNS", "answer_columns"]
