"""The selection rule (promptopt/metrics/stats/selection.py) on constructed cases: a clear winner is chosen whatever
the tie-break prefers, near-ties go to the tie-break, test numbers never change a choice, and the smallest
detectable difference follows the paired test's power. Pure and fast: no model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from promptopt.errors import ConfigError
from promptopt.metrics.stats.selection import (
    TIE_BREAKS,
    Candidate,
    choose,
    dev_items_for,
    minimum_detectable_effect,
)


def _answers(n: int, right: int, *, offset: int = 0) -> list[bool]:
    """`right` of `n` items correct, starting at item `offset` (wrapping): nested or shifted answer patterns."""
    return [((i - offset) % n) < right for i in range(n)]


def test_a_clear_winner_is_chosen_whatever_the_tie_break_prefers():
    n = 200
    best = Candidate(key="clear", correct=_answers(n, 180), order=1, stability=0.0, cost=900, robust=0.0)
    rivals = [
        Candidate(key=f"rival{j}", correct=_answers(n, 120, offset=j), order=j + 2, stability=0.9, cost=10, robust=0.9)
        for j in range(3)
    ]
    for tie_break in TIE_BREAKS:
        chosen = choose([*rivals, best], tie_break=tie_break)
        assert chosen.winner.key == "clear" and [c.key for c in chosen.tie_set] == ["clear"], tie_break
        assert all(p.worse and p.p < 0.05 and p.interval[1] < 0 for p in chosen.paired.values())
    assert "a clear winner" in chosen.describe() and "no test number was read" in chosen.describe()


def test_near_ties_go_to_the_tie_break():
    n = 40  # the case: one item apart (0.875 vs 0.850)
    top = Candidate(key=0, correct=_answers(n, 35), order=0, stability=0.10, cost=500)
    near = Candidate(key=1, correct=_answers(n, 34), order=1, stability=0.30, cost=300, calibrated=True)
    far = Candidate(key=2, correct=_answers(n, 20), order=2, stability=0.90, cost=100, calibrated=True)
    stable = choose([top, near, far], tie_break="stability")
    assert stable.winner.key == 1 and {c.key for c in stable.tie_set} == {0, 1}  # `far` is significantly worse
    assert stable.paired["1"].diff == pytest.approx(-1 / 40) and not stable.paired["1"].worse
    assert stable.paired["2"].worse
    assert choose([top, near, far], tie_break="cost").winner.key == 1
    assert choose([top, near, far], tie_break="calibrated").winner.key == 1
    argmax = choose([top, near, far], tie_break="argmax")  # export's default: the plain candidate of the tie set
    assert argmax.winner.key == 0 and "(argmax)" in argmax.describe()
    calibrated_top = Candidate(key=0, correct=top.correct, order=0, stability=0.10, calibrated=True)
    assert choose([calibrated_top, near], tie_break="argmax").winner.key == 1  # both calibrated: stability decides
    cheap_top = Candidate(key=0, correct=top.correct, order=0, stability=0.10, cost=200)
    assert choose([cheap_top, near, far], tie_break="cost").winner.key == 0
    record = stable.record()
    assert record["tie_break"] == "stability" and record["winner"] == 1 and record["best"] == 0
    assert [r["candidate"] for r in record["tie_set"]] == [0, 1] and record["tie_set"][1]["stability"] == 0.30
    assert "tie-break 'stability'" in record["why"] and "2 of 3 candidates tie" in record["why"]


def test_equal_tie_break_values_go_to_dev_accuracy_then_the_earlier_candidate():
    n = 40
    a = Candidate(key="a", correct=_answers(n, 30), order=0, stability=0.5)
    b = Candidate(key="b", correct=_answers(n, 31), order=1, stability=0.5)
    c = Candidate(key="c", correct=_answers(n, 31, offset=3), order=2, stability=0.5)
    assert choose([a, b, c]).winner.key == "b"  # tie on stability: higher accuracy, then the earlier of b and c
    unmeasured = Candidate(key="u", correct=_answers(n, 31), order=0)  # NaN stability ranks last
    assert choose([unmeasured, a]).winner.key == "a"


def test_test_numbers_never_change_a_choice():
    """A candidate is built from dev answers and dev-side numbers only; the same dev data beside any test data gives
    the same choice (the builder below is what a caller does: it reads the dev columns of a table of both)."""
    rng = np.random.default_rng(0)
    dev = {k: rng.random(60) < p for k, p in {"a": 0.80, "b": 0.78, "c": 0.50}.items()}
    stability = {"a": 0.1, "b": 0.4, "c": 0.9}

    def build(test_accuracy: dict) -> list[Candidate]:
        rows = [{"key": k, "dev": dev[k], "test": test_accuracy[k], "stability": stability[k]} for k in dev]
        return [
            Candidate(key=r["key"], correct=r["dev"], order=j, stability=r["stability"]) for j, r in enumerate(rows)
        ]

    choices = {
        choose(build(test), tie_break=t).winner.key
        for test in ({"a": 0.9, "b": 0.1, "c": 0.5}, {"a": 0.1, "b": 0.9, "c": 0.99})
        for t in ("stability",)
    }
    assert choices == {"b"}
    assert not any("test" in f for f in Candidate.__dataclass_fields__)  # nothing to carry a test number in


def test_fill_measures_only_the_tie_set():
    n = 100
    cands = [
        Candidate(key="best", correct=_answers(n, 80), order=0),
        Candidate(key="near", correct=_answers(n, 78), order=1),
        Candidate(key="poor", correct=_answers(n, 40), order=2),
    ]
    measured = []

    def fill(tied):
        measured.extend(c.key for c in tied)
        return [Candidate(**{**c.__dict__, "robust": {"best": 0.3, "near": 0.6}[c.key]}) for c in tied]

    chosen = choose(cands, tie_break="robust", fill=fill)
    assert chosen.winner.key == "near" and measured == ["best", "near"]


def test_the_rule_refuses_what_it_cannot_pair():
    with pytest.raises(ConfigError, match="unknown tie-break 'cheapest'"):
        choose([Candidate(key=0, correct=[True])], tie_break="cheapest")
    with pytest.raises(ValueError, match="same dev items"):
        choose([Candidate(key=0, correct=[True, False]), Candidate(key=1, correct=[True])])
    with pytest.raises(ValueError, match="no candidate"):
        choose([])


def test_minimum_detectable_effect_follows_the_paired_power():
    # (1.96 + 0.84)·√(d/n): 40 items, 15% discordant -> 0.17; 4× the items halve it
    assert minimum_detectable_effect(40, 0.15) == pytest.approx(2.8016 * math.sqrt(0.15 / 40), rel=1e-3)
    assert minimum_detectable_effect(160, 0.15) == pytest.approx(minimum_detectable_effect(40, 0.15) / 2)
    assert dev_items_for(minimum_detectable_effect(123, 0.2), 0.2) == 123
    assert math.isnan(minimum_detectable_effect(40, float("nan")))
    one = choose([Candidate(key=0, correct=[True, False])])
    assert math.isnan(one.mde) and "the only candidate" in one.describe()


def test_a_real_one_item_gap_is_a_tie_at_40_items_and_a_clear_win_at_2000():
    """Power: the same 5-point gap (and 10% discordance) ties on 40 dev items and separates on 2000."""

    def pair(n):
        first = np.zeros(n, dtype=bool)
        first[: int(0.8 * n)] = True
        second = first.copy()
        second[: int(0.075 * n)] = False  # 7.5% only the first gets right
        second[int(0.8 * n) : int(0.825 * n)] = True  # 2.5% only the second
        return [Candidate(key="a", correct=first, order=0, cost=9), Candidate(key="b", correct=second, order=1, cost=1)]

    assert choose(pair(40), tie_break="cost").winner.key == "b"
    assert choose(pair(2000), tie_break="cost").winner.key == "a"


# --- a search's winner goes through the rule (the constructed scorer of test_multi_fidelity: no model) ---------------
def _search(tmp_path, name, scorer_class=None, **kw):
    from promptopt.study import run_search
    from tests.study.test_multi_fidelity import ConstructedScorer, _config

    config = _config(tmp_path / name, strategy="accuracy", pruning=False, **kw)
    data = config.data.load()
    scorer = (scorer_class or ConstructedScorer)(data, config.data.dev(data), tmp_path / name / "cache.sqlite")
    return run_search(config, scorer=scorer, data=data, show_progress=False)


def test_a_searchs_winner_goes_through_the_rule(tmp_path):
    """The six prompts of test_multi_fidelity's case on 24 dev items: `sharp` (22 right) is the best point estimate;
    `steady` (20) and `fair` (18) are not significantly worse (their misses are nested in its hits), the rest are. The
    default tie-break (stability, here rising with accuracy) keeps `sharp`; `--tie-break cost` takes the cheapest
    prompt of the tie set, `fair`, and both runs record the same tie set."""
    import json

    import yaml

    default = _search(tmp_path, "default")
    cheap = _search(tmp_path, "cheap", tie_break="cost")
    assert default.prompt.instruction.startswith("Sharp") and cheap.prompt.instruction.startswith("Fair")
    for result in (default, cheap):
        summary = json.loads((result.card_path.parent / "summary.json").read_text())
        detail = summary["selection_detail"]
        tied = {result.trials.set_index("number").loc[r["candidate"], "params_instruction"] for r in detail["tie_set"]}
        assert tied == {"sharp", "steady", "fair"} and detail["n_dev_items"] == 24 and detail["n_candidates"] == 6
        assert summary["selection"] == result.selection and "no test number was read" in result.selection
        provenance = yaml.safe_load(result.card_path.read_text())["provenance"]
        assert (
            provenance["tie_break"] == detail["tie_break"]
            and "3 of 6 candidates tie with the best" in provenance["selection"]
        )
    assert json.loads((cheap.card_path.parent / "summary.json").read_text())["selection_detail"]["tie_break"] == "cost"


def test_test_items_never_change_a_searchs_choice(tmp_path):
    """The same dev answers beside other test answers (every test item right, or every one wrong, for every prompt):
    the same winner, for the same reason."""
    from tests.study.test_multi_fidelity import ConstructedScorer

    class TestRight(ConstructedScorer):
        def score_table(self, prompt, items):
            table = super().score_table(prompt, items)
            test = [i.id not in self.rank for i in items]
            return table.assign(correct=[c or t for c, t in zip(table["correct"], test)])

    wrong, right = _search(tmp_path, "wrong"), _search(tmp_path, "right", scorer_class=TestRight)
    assert wrong.test["accuracy"] == 0 and right.test["accuracy"] == 1  # the test numbers did differ
    assert wrong.best_params == right.best_params and wrong.selection == right.selection


def test_compare_prints_what_the_dev_size_can_detect(capsys):
    from promptopt.cli.render_robustness import print_dev_choices

    mde = minimum_detectable_effect(48, 0.15)
    print_dev_choices(
        [
            {"strategy": "tcb", "seed": 0, "tied": 4, "n_candidates": 12, "n_dev_items": 48, "mde": mde},
            {"strategy": "accuracy", "seed": 0, "tied": 1, "n_candidates": 12, "n_dev_items": 48, "mde": mde},
            # every trial dropped by racing: the search kept its incumbent, no tie set to count
            {"strategy": "ppl", "seed": 0, "tied": 0, "n_candidates": None, "n_dev_items": 48, "mde": mde},
        ]
    )
    out = " ".join(capsys.readouterr().out.split())
    assert f"48 dev items detect a difference of {mde:.3f}" in out and "tcb/0 4 of 12, accuracy/0 1 of 12" in out
    assert "ppl/0 none finished (the incumbent kept)" in out and "None" not in out
    print_dev_choices([])  # a compare from before the rule: nothing to say
    assert capsys.readouterr().out == ""


def test_an_unknown_tie_break_is_one_error_line(tmp_path):
    from tests.clirun import assert_one_line_error, promptopt

    for command in ("search", "compare"):
        assert_one_line_error(
            promptopt(command, "--task", "sst2", "--tie-break", "cheapest", "--out", str(tmp_path / command)),
            "unknown tie-break 'cheapest'",
        )
    assert not (tmp_path / "search").exists() and not (tmp_path / "compare").exists()
    assert_one_line_error(
        promptopt("export", str(tmp_path), "--out", str(tmp_path / "c.yaml"), "--tie-break", "cheapest"),
        "unknown tie-break 'cheapest'",
    )
