"""The contract between compare and its readers as a type: a compare_runs.csv row is a `RunRow`, written by
compare's own writer and read back by export's selection through the same record."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from promptopt.metrics.stats.selection import decode_answers, encode_answers
from promptopt.workflows.compare import Evaluated
from promptopt.workflows.compare.records import RunRow
from promptopt.workflows.compare.tables import run_record, strategy_table
from promptopt.workflows.compare.write import write_outputs
from promptopt.workflows.export.select import candidate_of, compare_candidates, select_by_dev

TYPED = ("strategy", "seed", "rank", "winner", "n_test", "accuracy", "accuracy_ci", "selected_by", "trial")
SOURCE = ("dev_accuracy", "dev_correct", "dev_signed_stability", "cost", "card", "members")


def _evaluated(correct, tcb=2.0):
    n = len(correct)
    test = pd.DataFrame({"item_id": [f"i{j}" for j in range(n)], "correct": correct, "tcb": [tcb] * n, "ppl": 1.5})
    robust = {"acc_worst": 0.5, "acc_worst_ci95": [0.25, 0.75], "pdr": 0.1, "acc_worst_unseen": 0.4}
    return Evaluated(test, robust)


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_a_run_row_written_by_compare_is_read_back_by_export_as_the_same_record(tmp_path):
    base, best, second = (
        _evaluated([True, False, True, False]),
        _evaluated([True] * 4, 3.0),
        _evaluated([True, True, False, True]),
    )
    dev_best, dev_second = [True, True, True, False], [True, False, True, False]
    written = [
        run_record("baseline", 0, 0, base, winner=True, how="the task's default prompt", card="task default prompt"),
        run_record(
            "accuracy",
            0,
            0,
            best,
            winner=True,
            how="argmax of dev accuracy",
            trial=4,
            dev_accuracy=0.75,
            dev_correct=encode_answers(dev_best),
            dev_signed_stability=0.25,
            cost=120.0,
            card="accuracy/best_card.yaml",
        ),
        run_record(
            "accuracy",
            0,
            1,
            second,
            winner=False,
            how="",
            trial=1,
            dev_accuracy=0.5,
            dev_correct=encode_answers(dev_second),
            dev_signed_stability=None,
            cost=None,
            card="",
        ),
        run_record("accuracy+ens2", 0, 0, best, winner=True, how="greedy", trial=4, dev_accuracy=0.8, members=[4, 1]),
    ]
    runs = pd.DataFrame([r.columns() for r in written])
    winners = {"baseline": [base], "accuracy": [best], "accuracy+ens2": [best]}
    table = strategy_table(runs, winners, {"accuracy": 1.0})
    write_outputs(tmp_path, table, runs, pd.DataFrame(), {"strategies": ["accuracy"]})

    read = pd.read_csv(tmp_path / "compare_runs.csv")
    assert list(read.columns) == list(runs.columns)  # the file's columns are the record's, in its order
    back = [RunRow.from_columns(row) for _, row in read.iterrows()]
    for mine, theirs in zip(written, back):
        for name in (*TYPED, *SOURCE):
            assert getattr(theirs, name) == getattr(mine, name), name
        assert mine.robustness.keys() == theirs.robustness.keys()
        assert all(_same(float(mine.robustness[k]), float(theirs.robustness[k])) for k in mine.robustness)
        assert theirs.columns().keys() == mine.columns().keys()

    # export reads the searched rows (not the baseline, nor compare's ensembles) through the same record
    candidates = compare_candidates(tmp_path)
    assert candidates["trial"].tolist() == [4, 1]
    seen = [candidate_of(row) for _, row in candidates.iterrows()]
    assert [c.correct for c in seen] == [dev_best, dev_second] == [decode_answers(r.dev_correct) for r in written[1:3]]
    assert seen[0].stability == 0.25 and seen[0].cost == 120.0
    assert math.isnan(seen[1].stability) and math.isnan(seen[1].cost)  # not recorded: NaN, as before
    chosen, _, _ = select_by_dev(candidates)
    assert RunRow.from_columns(chosen).card == "accuracy/best_card.yaml"


def test_a_reader_of_a_foreign_row_gets_none_not_a_traceback():
    """A run folder is someone else's: unreadable optional cells are None (a companion: a good cell is read)."""
    row = {"strategy": "accuracy", "seed": 0, "trial": "x", "cost": "cheap", "members": "[1, 'a']", "dev_correct": "+-"}
    read = RunRow.from_columns(row)
    assert (read.trial, read.cost, read.members, read.dev_correct) == (None, None, None, "+-")
    assert RunRow.from_columns({**row, "trial": 3.0, "cost": "2.5", "members": "[1, 2]"}).members == [1, 2]
    with pytest.raises(KeyError):
        RunRow.from_columns({"seed": 0})  # identity is required


def test_compare_and_export_build_ensemble_candidates_in_one_place(tiny_llama_dir, tmp_path, monkeypatch):
    """`compare --ensembles` and `export --ensemble` take their candidates from one builder
    (workflows/ensemble.py `ensemble_candidates`): a prompt both consider is the same candidate for both, its rule
    fit on the same dev items and its dev answers decided the same way."""
    import json

    import promptopt.workflows.compare.ensembles as compare_side
    import promptopt.workflows.export.ensemble as export_side
    from promptopt.study import SearchConfig
    from promptopt.workflows import ensemble
    from promptopt.workflows.compare import run_compare
    from promptopt.workflows.session import Session

    built = {}

    def recording(caller):
        def build(prompts, scorer, dev, **options):
            built[caller] = ensemble.ensemble_candidates(prompts, scorer, dev, **options)
            return built[caller]

        return build

    monkeypatch.setattr(compare_side, "ensemble_candidates", recording("compare"))
    monkeypatch.setattr(export_side, "build_candidates", recording("export"))
    root = tmp_path / "cmp"
    config = SearchConfig.build(
        task="sst2", trials=3, model=str(tiny_llama_dir), out=str(root), dev_limit=6, test_limit=4, device="cpu"
    )
    run_compare(config, ["accuracy"], suite=None, top_n=1, ensembles=(2,), show_progress=False)
    session = Session(model=config.model, data=config.data, out=root, batch_size=config.batch_size)
    export_side.ensemble_candidates(export_side.search_runs(root, "accuracy"), session, session.items("dev"))

    assert built.keys() == {"compare", "export"}  # neither caller builds candidates its own way

    def by_card(members):
        return {json.dumps(m.prompt.to_card(), sort_keys=True): m for m in members}

    mine, theirs = by_card(built["compare"]), by_card(built["export"])
    shared = mine.keys() & theirs.keys()
    assert len(shared) >= 2, (list(mine), list(theirs))
    for key in shared:
        assert mine[key].rule.to_card() == theirs[key].rule.to_card()
        pd.testing.assert_frame_equal(mine[key].dev.reset_index(drop=True), theirs[key].dev.reset_index(drop=True))
