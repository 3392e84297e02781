"""The incumbent and racing (study/incumbent.py, study/racing.py) on per-item outcomes known in advance: the
incumbent is kept on a tie and replaced by a candidate that wins by construction, and the racing pruner drops exactly
the candidates a hand computation drops, at the slice a hand computation says."""

from __future__ import annotations

import optuna
import pytest

from promptopt.study.incumbent import INCUMBENT_PARAM, replacement
from promptopt.study.outputs import _entries, _ship
from promptopt.study.racing import race, racing_pruner, slice_ends, versus_incumbent, versus_leader
from promptopt.study.strategies import get_strategy

N = 40


def test_tie_keeps_the_incumbent():
    incumbent = [True] * 20 + [False] * 20
    winner = [False, True] * 20  # 10 right only with the winner, 10 only with the incumbent: a tie
    test = replacement(winner, incumbent, binary=True, winner_name="trial 3", incumbent_name="the default")
    assert not test.replaced
    assert test.diff == 0.0
    assert test.p == 1.0
    assert test.why.startswith("kept the default: trial 3")


def test_a_winner_by_construction_replaces_it():
    incumbent = [True] * 20 + [False] * 20
    winner = [True] * 32 + [False] * 8  # 12 right only with the winner, none only with the incumbent
    test = replacement(winner, incumbent, binary=True, winner_name="trial 3", incumbent_name="the default")
    assert test.replaced
    assert test.diff == pytest.approx(12 / 40)
    assert test.p == pytest.approx(2 * 0.5**12)  # exact McNemar, by hand: both tails of Binomial(12, 1/2) at 0
    assert test.interval[0] > 0
    assert test.why.startswith("trial 3 replaces the default")


def test_a_significant_p_alone_does_not_replace_when_the_interval_reaches_zero():
    # 6 vs 0 discordant items: p = 2/64 = 0.031 < 0.05, but on 400 items the interval is what decides with it
    incumbent = [False] * 6 + [True] * 394
    winner = [True] * 400
    test = replacement(winner, incumbent, binary=True, winner_name="w", incumbent_name="i")
    assert test.p == pytest.approx(2 / 64)
    assert test.replaced == (test.interval[0] > 0)


def test_a_continuous_objective_uses_wilcoxon():
    incumbent = [-1.0] * 30
    winner = [-0.5 - 0.01 * i for i in range(30)]  # lower NLL on every item
    test = replacement(winner, incumbent, binary=False, winner_name="w", incumbent_name="i")
    assert test.replaced and "Wilcoxon" in test.test
    assert not replacement(incumbent, incumbent, binary=False, winner_name="w", incumbent_name="i").replaced


def test_slices_grow_from_the_first_minibatch():
    assert slice_ends(40, 16) == [16, 32, 40]
    assert slice_ends(100, 16) == [16, 32, 64, 100]
    assert slice_ends(16, 16) == [16]


def test_versus_leader_by_hand():
    leader = [1.0] * 16
    # 0 items ahead, 8 behind: P(X <= 0 | 8, 1/2) = 1/256 < 0.1: dropped
    assert versus_leader([0.0] * 8 + [1.0] * 8, leader, leader_name="trial 1").drop
    # 1 ahead, 3 behind: P(X <= 1 | 4, 1/2) = 5/16: kept
    mine = [1.0] * 12 + [0.0] * 3 + [1.0]
    lead = [1.0] * 12 + [1.0] * 3 + [0.0]
    assert not versus_leader(mine, lead, leader_name="trial 1").drop
    # 0 ahead, 4 behind: 1/16 = 0.0625 < 0.1: dropped; 0 ahead, 3 behind: 1/8 = 0.125: kept
    assert versus_leader([0.0] * 4 + [1.0] * 12, leader, leader_name="t").drop
    assert not versus_leader([0.0] * 3 + [1.0] * 13, leader, leader_name="t").drop


def test_versus_incumbent_by_hand():
    incumbent = [1.0] * 10 + [0.0] * 30  # 30 items the incumbent gets wrong
    # seen 16: 10 right where the incumbent is right, 6 wrong where it is wrong (0 ahead, 0 behind); the 24 still to
    # come are all incumbent-wrong: the best case is 24 vs 0, p = 2·0.5^24: it may still win
    mine = [1.0] * 10 + [0.0] * 6
    assert not versus_incumbent(mine, incumbent, incumbent_name="the default").drop
    # seen 32: 10 behind (wrong where the incumbent is right), 22 items the incumbent also gets wrong, all wrong here;
    # the best case adds the 8 remaining incumbent-wrong items: 8 ahead vs 10 behind, cannot win
    mine = [0.0] * 10 + [0.0] * 22
    verdict = versus_incumbent(mine, incumbent, incumbent_name="the default")
    assert verdict.drop and "8 to 10" in verdict.reason


def _study_with_incumbent(values: list[float]):
    study = optuna.create_study(
        direction="maximize", pruner=racing_pruner(n_items=len(values), first=16, futility=True)
    )
    study.add_trial(
        optuna.trial.create_trial(
            params={INCUMBENT_PARAM: "default"},
            distributions={INCUMBENT_PARAM: optuna.distributions.CategoricalDistribution(["default"])},
            value=sum(values) / len(values),
            intermediate_values=dict(enumerate(values)),
            user_attrs={
                "incumbent": "the task's default prompt",
                "dev_correct": "".join("+" if v else "-" for v in values),
                "metrics": {"accuracy": sum(values) / len(values), "n": len(values), "signed_stability": 0.0},
            },
        )
    )
    return study


def _race_candidates(study, outcomes: list[list[float]]) -> list[int | None]:
    """Run each candidate's known per-item values through the study as a trial on slices 16, 32, 40; the number of
    items each was pruned after (None: it completed)."""
    pruned_after = []
    for values in outcomes:

        def objective(trial, values=values):
            trial.suggest_int("x", 0, 10**6)
            start = 0
            for end in slice_ends(len(values), 16):
                for i in range(start, end):
                    trial.report(values[i], step=i)
                start = end
                if end < len(values) and trial.should_prune():
                    trial.set_user_attr("dev_items", end)
                    raise optuna.TrialPruned()
            trial.set_user_attr("dev_correct", "".join("+" if v else "-" for v in values))
            trial.set_user_attr("metrics", {"accuracy": sum(values) / len(values), "n": len(values)})
            return sum(values) / len(values)

        study.optimize(objective, n_trials=1)
        last = study.trials[-1]
        pruned_after.append(last.user_attrs["dev_items"] if last.state.name == "PRUNED" else None)
    return pruned_after


_STRATEGY = get_strategy("accuracy")


def test_racing_and_the_incumbent_on_known_outcomes():
    incumbent = [1.0, 0.0] * 20  # right on the even items: 0.5 on 40 dev items
    study = _study_with_incumbent(incumbent)
    hopeless = [0.0] * 40  # first slice: 0 ahead, 8 behind the leader (the incumbent): p = 1/256 < 0.1
    # the incumbent's opposite. First slice: 8 ahead, 8 behind (leader p = 0.60); the best case adds the 12
    # remaining incumbent-wrong items, 20 vs 8, exact McNemar p = 0.036: it may still win. Second slice (32 items):
    # 16 vs 16, and the 4 remaining incumbent-wrong items make the best case 20 vs 16, p = 0.62: dropped
    opposite = [0.0, 1.0] * 20
    better = [1.0] * 32 + [0.0, 1.0] * 4  # 20 ahead, 4 behind (items 32, 34, 36, 38): completes
    pruned = _race_candidates(study, [hopeless, opposite, better])
    assert pruned == [16, 32, None]
    assert "behind the leader the incumbent" in study.pruner.reasons[1]
    assert "cannot beat the incumbent" in study.pruner.reasons[2] and "20 to 16" in study.pruner.reasons[2]
    entries = _entries([t for t in study.trials if t.state.name == "COMPLETE"], get_strategy("accuracy"))
    incumbent_entry = next(e for e in entries if e["params"] == {INCUMBENT_PARAM: "default"})
    searched = [e for e in entries if e is not incumbent_entry]
    shipped, why, detail, kept = _ship(_STRATEGY, None, 0, study, searched, incumbent_entry)
    assert not kept and shipped["number"] == 3, why  # 20 vs 4 discordant: p = 0.0015, interval above 0
    assert detail["incumbent"]["replaced"] is True


def test_the_incumbent_is_kept_when_every_candidate_is_pruned_or_ties():
    incumbent = [1.0] * 30 + [0.0] * 10  # a strong incumbent: 0.75
    study = _study_with_incumbent(incumbent)
    # the same answers: after 16 and 32 items the best case (right on every remaining item the incumbent gets wrong:
    # 10, then 8) is 10 vs 0 and 8 vs 0, p = 2^-9 and 2^-7: it may still win, so it completes, and ties
    tie = list(incumbent)
    pruned = _race_candidates(study, [tie])
    assert pruned == [None]
    entries = _entries([t for t in study.trials if t.state.name == "COMPLETE"], get_strategy("accuracy"))
    incumbent_entry = next(e for e in entries if INCUMBENT_PARAM in e["params"])
    searched = [e for e in entries if e is not incumbent_entry]
    shipped, why, detail, kept = _ship(_STRATEGY, None, 0, study, searched, incumbent_entry)
    assert kept and shipped is incumbent_entry
    assert why.startswith("kept the task's default prompt")
    assert detail["incumbent"]["replaced"] is False
    # nothing searched finished: the incumbent is kept, and the line says why
    shipped, why, _, kept = _ship(_STRATEGY, None, 0, study, [], incumbent_entry)
    assert kept and "no searched prompt finished" in why


def test_race_prefers_the_leader_rule_and_skips_futility_for_continuous_values():
    verdict = race([0.5] * 16, leader=("trial 1", [0.9] * 16), incumbent=("the default", [0.1] * 40), futility=True)
    assert verdict.drop and "leader" in verdict.reason
    assert not race([0.5] * 16, leader=None, incumbent=("the default", [0.9] * 40), futility=True).drop


@pytest.fixture
def tiny_config(tmp_path, tiny_llama_dir):
    from promptopt.study import SearchConfig

    return SearchConfig.build(
        task="sst2",
        trials=3,
        model=str(tiny_llama_dir),
        out=str(tmp_path / "run"),
        dev_limit=12,
        test_limit=6,
        minibatch=4,
        device="cpu",
    )


def test_a_search_that_keeps_the_incumbent_exports_the_default_prompt(tiny_config, tmp_path):
    """A random 2-layer model answers about alike whatever the prompt: 12 dev items cannot show a searched prompt
    better, so the run keeps the task's default prompt, says so, and export writes that prompt's card."""
    import json

    import promptopt
    from promptopt.prompts import load_card
    from promptopt.study import run_search
    from promptopt.tasks import load_task

    result = run_search(tiny_config, show_progress=False)
    default = load_task("sst2").default_prompt()
    assert result.incumbent["kept"] is True and result.prompt == default
    assert result.selection.startswith("kept the task's default prompt")
    assert result.best_number == 0 and result.trials.loc[0, "params_incumbent"] == "default"
    done = result.trials[result.trials["state"].isin(["COMPLETE", "PRUNED"])]
    assert len(done) == 4  # the incumbent and the 3 trials of the budget
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["incumbent"]["kept"] is True and summary["scan"]["verdict"]
    assert summary["dev_items_spent"]["per_trial"]["0"] == 12
    # the scan is the search's first phase: its 3 prompts (4 items each) are trials 1-3, their slices cache hits
    scanned = result.trials[result.trials["user_attrs_scanned"].fillna(False).astype(bool)]
    assert list(scanned["number"]) == [1, 2, 3] and summary["scan"]["pairs"] == 12
    assert summary["dev_items_spent"]["scan_extra"] == 0
    assert summary["pairs_scored"] == summary["dev_items_spent"]["trials"]
    assert load_card(tmp_path / "run" / "best_card.yaml")[0] == default
    exported = promptopt.export(str(tmp_path / "run"), out=str(tmp_path / "card.yaml"))
    assert load_card(tmp_path / "card.yaml")[0] == default
    assert exported.card["metrics"]["test"]["accuracy"] == exported.default["accuracy"]
    assert any(w.startswith("the card is the task's default prompt: kept") for w in exported.warnings)
    # a resumed study keeps its incumbent (scored once) and its scan
    resumed = run_search(tiny_config.replace(trials=4, resume=True), show_progress=False)
    assert (resumed.trials["params_incumbent"] == "default").sum() == 1
    assert resumed.trials["state"].isin(["COMPLETE", "PRUNED"]).sum() == 5


def test_a_card_incumbent_of_another_task_is_refused(tiny_config, tmp_path):
    from promptopt.errors import UserError
    from promptopt.prompts import save_card
    from promptopt.study import run_search
    from promptopt.tasks import load_task

    card = tmp_path / "boolq.yaml"
    save_card(load_task("boolq").default_prompt(), card, {})
    with pytest.raises(UserError, match="is a prompt for task 'boolq', not 'sst2'"):
        run_search(tiny_config.replace(incumbent=str(card)), show_progress=False)


@pytest.mark.parametrize(
    ("incumbent", "kept", "why"),
    [
        # `steady` (20 of 24 right) against the winner `sharp` (22; its misses nested in steady's): 2 vs 0 discordant,
        # exact McNemar p = 0.5: kept
        ("steady", True, "kept the card"),
        # `middling` (13 right): 9 vs 0 discordant, p = 2·0.5^9 = 0.0039 and the interval above 0: replaced by sharp
        ("middling", False, "replaces the card"),
    ],
)
def test_the_whole_search_keeps_or_replaces_an_incumbent_card_on_known_outcomes(tmp_path, incumbent, kept, why):
    """test_multi_fidelity's constructed scorer (per-item outcomes fixed by the prompt's instruction) through
    run_search with a card as the incumbent: kept on a tie, replaced when the winner beats it by construction."""
    import math

    from promptopt.prompts import Prompt, save_card
    from promptopt.study import run_search
    from tests.study.test_multi_fidelity import ConstructedScorer, _config

    config = _config(tmp_path, strategy="accuracy", pruning=False)
    data = config.data.load()
    card = tmp_path / "mine.yaml"
    template = data.default_prompt().template
    save_card(Prompt(task="sst2", instruction=f"{incumbent.title()} instruction.", template=template), card, {})
    config = config.replace(incumbent=str(card), out=str(tmp_path / incumbent))
    scorer = ConstructedScorer(data, config.data.dev(data), tmp_path / "cache.sqlite")
    result = run_search(config, scorer=scorer, data=data, show_progress=False)
    assert result.incumbent["kept"] is kept
    assert why in result.selection
    shipped = result.prompt.instruction.split()[0].lower()
    assert shipped == (incumbent if kept else "sharp")
    only_winner = 22 - (20 if incumbent == "steady" else 13)
    assert result.incumbent["p"] == pytest.approx(min(1.0, 2 * 0.5**only_winner), abs=1e-6)
    assert math.isclose(result.incumbent["diff"], only_winner / 24, abs_tol=1e-6)
