"""Multi-fidelity `robust` (strategies.py, trial.py): variants only for trials the accuracy pruner left
alive and that can still beat the incumbent. On a constructed scorer (correctness by construction, no
model) it scores fewer (prompt, item) pairs than the full version, gives every COMPLETE trial the same
value, and picks the same winner — a prompt that the accuracy strategy does not pick."""

from __future__ import annotations

import dataclasses
import json
import types

import pandas as pd
import pytest

from promptopt.study import SearchConfig, get_strategy

DEV = 24
# instruction -> (clean-correct items, robust items) of the 24 dev items, nested: the item of rank r (a fixed
# shuffle of dev) is right on the clean prompt iff r < clean, and on every variant iff r < robust.
CASE = {"sharp": (22, 10), "steady": (20, 19), "fair": (18, 16), "middling": (13, 12), "weak": (8, 8), "dull": (5, 5)}
MARKS = (" [typo]", " [reordered]")  # the two variant prompts of a prompt
ORDERS = {
    "accuracy-best first": ["sharp", "fair", "steady", "middling", "weak", "dull"],
    "robust-best first": ["steady", "sharp", "dull", "fair", "weak", "middling"],
    "worst first": ["dull", "weak", "middling", "fair", "sharp", "steady"],
}


def _space(tmp_path):
    lines = [
        "task: sst2",
        "instructions:",
        *[f'  {name}: "{name.title()} instruction."' for name in CASE],
        "exemplars: {candidates: 4, k: 0}",
        "templates:",
        '  plain: {query: "Review: {question}\\nSentiment:"}',
    ]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "space.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


class _Counts:
    def __init__(self, path):
        self.path, self.hits, self.misses = path, 0, 0


class ConstructedScorer:
    """A CachingScorer without a model: correctness follows CASE; `pairs` holds the distinct pairs scored."""

    def __init__(self, data, dev, path):
        self.data, self.cache, self.pairs = data, _Counts(path), set()
        self.lm = types.SimpleNamespace(tokenizer=types.SimpleNamespace(chat_template="{{ messages }}"))  # renders chat
        self.rank = {item.id: r for r, item in enumerate(sorted(dev, key=lambda i: i.question[::-1]))}  # fixed shuffle

    def check_fits(self, prompt, items):
        pass

    def score_table(self, prompt, items):
        keys = list(dict.fromkeys((json.dumps(prompt.to_card(), sort_keys=True), i.id, i.question) for i in items))
        new = [k for k in keys if k not in self.pairs]
        self.pairs.update(new)
        self.cache.misses += len(new)
        self.cache.hits += len(keys) - len(new)
        text = prompt.instruction
        mark = next((m for m in MARKS if text.endswith(m)), None)
        name = text[: -len(mark) if mark else None].split()[0].lower()
        clean, robust = CASE[name]
        rank = [self.rank.get(i.id, DEV) for i in items]  # test items rank past dev: right for no prompt
        if mark is None:
            correct = [r < clean for r in rank]
        elif mark == MARKS[0]:  # the typo variant breaks the odd ranks between robust and clean, reorder the rest
            correct = [r < robust or r % 2 == 0 for r in rank]
        else:
            correct = [r < robust for r in rank]
        n = len(items)
        return pd.DataFrame(
            {
                "item_id": [i.id for i in items],
                "correct": correct,
                "pred": [0] * n,
                "tcb": [1.0] * n,
                "v_eff": [1.0] * n,
                "margin": [1.0] * n,
                "target_nll": [0.5] * n,
                "answer_nll": [0.5] * n,
                "ppl": [1.5] * n,
            }
        )


def expand(scorer, prompt, items):
    return [(prompt.with_(instruction=prompt.instruction + mark), list(items)) for mark in MARKS]


def _config(tmp_path, strategy="robust", **kw):
    return SearchConfig.build(
        task="sst2",
        strategy=strategy,
        trials=len(CASE),
        dev_limit=DEV,
        test_limit=4,
        minibatch=8,
        space=str(_space(tmp_path)),
        out=str(tmp_path / f"run-{strategy}"),
        device="cpu",
        **{
            "incumbent": "none",
            "scan": "off",
            **kw,
        },  # the constructed prompts alone (the incumbent: test_incumbent.py)
    )


def _fixed_order_search(tmp_path, strategy, order, studies: list | None = None, **kw):
    """Every prompt of the space once, in `order` (enqueued), through the search's own trial function and pruner
    (the study appended to `studies` when given)."""
    import optuna

    from promptopt.study.context import build_context
    from promptopt.study.outputs import _candidates
    from promptopt.study.storage import pruner, quiet_optuna
    from promptopt.study.strategies import select_winner
    from promptopt.study.trial import make_objective

    quiet_optuna()
    config = _config(tmp_path, **kw)
    data = config.data.load()
    ctx = build_context(config, data, expand)
    ctx.strategy = strategy
    scorer = ConstructedScorer(data, ctx.dev, tmp_path / "unused.sqlite")
    study = optuna.create_study(
        direction="maximize", pruner=pruner(config, strategy, len(ctx.dev)), sampler=optuna.samplers.RandomSampler(0)
    )
    for name in order:
        study.enqueue_trial({"instruction": name, "template": "plain", "k": 0})
    study.optimize(make_objective(ctx, scorer, "test"), n_trials=len(order))
    if studies is not None:
        studies.append(study)
    winner, _ = select_winner(strategy, _candidates(study, strategy))
    values = {t.params["instruction"]: t.value for t in study.trials if t.state.name == "COMPLETE"}
    rungs = {t.params["instruction"]: (t.state.name, t.user_attrs.get("rung")) for t in study.trials}
    return winner["params"]["instruction"], len(scorer.pairs), values, rungs


@pytest.mark.parametrize("order", list(ORDERS.values()), ids=list(ORDERS))
def test_multi_fidelity_robust_scores_fewer_pairs_and_picks_the_same_winner(tmp_path, order):
    multi = get_strategy("robust")
    full = dataclasses.replace(
        multi, multi_fidelity=False, version=1
    )  # every variant of every item, robust values pruned
    assert multi.multi_fidelity and multi.version == 2
    winner_mf, pairs_mf, values_mf, rungs = _fixed_order_search(tmp_path / "mf", multi, order)
    winner_full, pairs_full, values_full, _ = _fixed_order_search(tmp_path / "full", full, order)
    winner_acc, _, _, _ = _fixed_order_search(tmp_path / "acc", get_strategy("accuracy"), order)
    assert winner_mf == winner_full == "steady" != winner_acc == "sharp"  # a case accuracy gets wrong
    assert pairs_mf < pairs_full, (pairs_mf, pairs_full)
    for name, value in values_mf.items():  # a COMPLETE value is the robust accuracy on every dev item, as before
        assert value == pytest.approx(CASE[name][1] / DEV)
        assert values_full.get(name, value) == pytest.approx(value)
    assert rungs["steady"] == ("COMPLETE", "variants")
    if order[0] == "steady":  # after it, a prompt whose clean accuracy is not above 19/24 never has a variant scored
        assert all(
            rungs[name] in {("PRUNED", "clean"), ("PRUNED", "promotion")}
            for name in CASE
            if CASE[name][0] <= 19 and name != "steady"
        )


def test_a_pruned_trial_is_valued_at_its_accuracy_on_the_items_it_saw(tmp_path, monkeypatch):
    """Optuna keeps a pruned trial's last report as its value and TPE ranks pruned trials by it: the trial reports its
    partial value one step past the dev items before it is pruned, and the racing pruner still reads per-item values
    (the same trials dropped after the same items as without that report)."""
    import promptopt.study.trial as trial_module

    def drops(studies):
        return {
            t.params["instruction"]: t.user_attrs["dev_items"] for t in studies[0].trials if t.state.name == "PRUNED"
        }

    studies, without = [], []
    _fixed_order_search(tmp_path / "with", get_strategy("accuracy"), ORDERS["accuracy-best first"], studies)
    monkeypatch.setattr(trial_module, "report_partial", lambda trial, value, n_items: None)
    _fixed_order_search(tmp_path / "without", get_strategy("accuracy"), ORDERS["accuracy-best first"], without)
    assert drops(studies) == drops(without) and len(drops(studies)) >= 2
    for t in studies[0].trials:
        if t.state.name != "PRUNED":
            continue
        seen = t.user_attrs["dev_items"]
        assert sorted(t.intermediate_values) == [*range(seen), DEV]
        assert t.value == t.user_attrs["partial_value"] == t.intermediate_values[DEV]
        assert t.value == pytest.approx(sum(t.intermediate_values[i] for i in range(seen)) / seen)
    # without the report, Optuna's value was the last item's 0/1
    assert all(t.value in (0.0, 1.0) for t in without[0].trials if t.state.name == "PRUNED")


def test_the_bound_prunes_only_trials_that_cannot_win():
    from promptopt.study.trial import cannot_win

    assert not cannot_win(5, None, 3)  # no incumbent yet
    assert cannot_win(4, (5, 1), 3) and not cannot_win(6, (5, 1), 3)
    assert cannot_win(5, (5, 1), 3) and not cannot_win(5, (5, 4), 3)  # a tie goes to the lower trial number


def test_lazy_variants_give_the_same_column_with_fewer_pairs():
    from promptopt.study.trial import with_robust_correct
    from promptopt.tasks import Item

    items = [Item(f"i{j}", f"question {j}", 0, "a", ("a", "b")) for j in range(4)]
    scored = []

    class Cached:  # variant "a" loses i1, variant "b" loses i2
        def score_table(self, prompt, its):
            scored.extend((prompt, i.id) for i in its)
            return pd.DataFrame(
                {"item_id": [i.id for i in its], "correct": [i.id != {"a": "i1", "b": "i2"}[prompt] for i in its]}
            )

    clean = pd.DataFrame({"item_id": [i.id for i in items], "correct": [True, True, True, False]})
    groups = [("a", items), ("b", items)]
    eager = with_robust_correct(clean, groups, Cached())
    n_eager, scored[:] = len(scored), []
    lazy = with_robust_correct(clean, groups, Cached(), lazy=True)
    assert lazy["robust_correct"].tolist() == eager["robust_correct"].tolist() == [True, False, False, False]
    assert len(scored) == 5 < n_eager == 8  # i3 (clean-wrong) never, i1 not on "b"


def test_search_reports_pairs_scored_and_the_rungs(tmp_path):
    from promptopt.study import run_search

    config = _config(tmp_path).replace(trials=3)
    data = config.data.load()
    scorer = ConstructedScorer(data, config.data.dev(data), tmp_path / "cache.sqlite")
    result = run_search(config, scorer=scorer, data=data, expand=expand, show_progress=False)
    searched = scorer.cache.misses - 4  # the winner's 4 test items are scored after the search
    assert result.pairs_scored == searched > 0
    assert json.loads((tmp_path / "run-robust" / "summary.json").read_text())["pairs_scored"] == searched
    finished = result.trials[result.trials["state"].isin(["COMPLETE", "PRUNED"])]
    assert set(finished["user_attrs_rung"]) <= {"clean", "promotion", "variants"}
    complete = finished[finished["state"] == "COMPLETE"]
    assert (complete["user_attrs_rung"] == "variants").all() and len(complete) >= 1


def test_a_study_of_the_previous_robust_is_refused_on_resume(tmp_path):
    from promptopt.errors import UserError
    from promptopt.study.context import build_context
    from promptopt.study.identity import check_resumable, identity

    for strategy, refused in (("robust", True), ("accuracy", False)):
        config = _config(tmp_path, strategy=strategy)
        current = identity(build_context(config, config.data.load(), expand))
        older = {k: v for k, v in current.items() if k != "strategy_version"}  # recorded before versions existed
        check_resumable("s", current, current)
        if refused:
            with pytest.raises(UserError, match="strategy_version=1 of strategy 'robust'"):
                check_resumable("s", older, current)
            with pytest.raises(UserError, match="strategy_version=1"):
                check_resumable("s", {**current, "strategy_version": 1}, current)
        else:
            check_resumable("s", older, current)
