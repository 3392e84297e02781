"""Perturbation operators (determinism, protection rules, applicability), suites, robustness metrics
against hand-computed values, and the CLI for evaluate/stress."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from promptopt.errors import ConfigError
from promptopt.metrics.stats import accuracy_variance, performance_drop_rate, worst_case
from promptopt.prompts import Exemplar, Prompt, PromptTemplate
from promptopt.robustness.perturb import (
    ClauseReorderOperator,
    DistractorOperator,
    ExemplarReorderOperator,
    ExemplarReplaceOperator,
    KeyboardTypoOperator,
    SpellingTypoOperator,
    SynonymOperator,
    TautologyOperator,
    protected_words,
    protection_holds,
)
from promptopt.robustness.suite import Similarity, builtin_suite_names, load_suite, make_variants, parse_suite
from promptopt.tasks import Item, load_task

ITEM = Item(
    "q1",
    "Janet has 16 ducks. The farm is large. The barn is red. How many eggs does Janet sell for 2 dollars?",
    "18",
    "18",
)
SHOTS = tuple(Exemplar(id=f"e{i}", question=f"question {i}", answer=str(i)) for i in range(3))
PROMPT = Prompt(task="gsm8k", exemplars=SHOTS, template=PromptTemplate(query="Question: {question}\nAnswer:"))
POOL = [Item(f"p{i}", f"pool question {i}", str(i), str(i)) for i in range(5)]


def test_pdr_accvar_worst_case_hand_values():
    assert performance_drop_rate(0.8, 0.6) == pytest.approx(0.25)
    assert performance_drop_rate(0.5, 0.6) == pytest.approx(-0.2)  # perturbation helped: negative
    assert math.isnan(performance_drop_rate(0.0, 0.3))  # undefined, not a division by zero
    assert accuracy_variance([0.5, 0.7, 0.9]) == pytest.approx(((0.2) ** 2 + 0 + 0.2**2) / 3)
    assert worst_case({"a": 0.6, "b": 0.4, "c": float("nan")}) == ("b", 0.4)
    assert worst_case({}) == (None, pytest.approx(float("nan"), nan_ok=True))


def test_protection_rules():
    assert protected_words(PROMPT, ITEM) == ["16", "2"]
    mc = Item("m", "great fun", 1, "positive", ("negative", "positive"))
    assert "positive" in protected_words(Prompt(task="sst2"), mc)
    assert protection_holds("pay 3 for 2 apples", "pay 3 for 2 pears", ["3", "2"])
    assert not protection_holds("pay 3 for 2 apples", "pay 8 for 2 apples", ["3", "2"])
    assert not protection_holds("a positive film", "a good film", ["positive"])


@pytest.mark.parametrize(
    "operator",
    [
        SynonymOperator(max_words=2),
        KeyboardTypoOperator(max_chars=1, max_words=2),
        SpellingTypoOperator(max_words=1),
    ],
)
def test_nlpaug_operators_are_deterministic_and_keep_numbers(operator):
    item = Item(
        "s",
        "the acting is superb and the story moves quickly across 3 decades",
        1,
        "positive",
        ("negative", "positive"),
    )
    prompt = Prompt(task="sst2")
    first = operator.apply(prompt, item, 17, {})
    second = operator.apply(prompt, item, 17, {})
    assert first.item.question == second.item.question  # same seed, same variant
    assert first.item.question != item.question
    assert "3" in first.item.question.split()  # numbers are stopwords for nlpaug
    others = {operator.apply(prompt, item, seed, {}).item.question for seed in range(6)}
    assert len(others) > 1  # other seeds give other variants


def test_clause_reorder_only_where_safe():
    variant = ClauseReorderOperator().apply(PROMPT, ITEM, 3, {})
    sentences = variant.item.question.split(". ")
    assert sentences[0] == "Janet has 16 ducks" and variant.item.question.endswith("for 2 dollars?")
    assert sorted(variant.item.question.split()) == sorted(ITEM.question.split())
    dependent = Item("d", "Ann has 3 cats. She feeds them. They sleep. How many cats?", "3", "3")
    assert ClauseReorderOperator().apply(PROMPT, dependent, 3, {}) is None  # "She"/"They" point back
    assert ClauseReorderOperator().apply(PROMPT, Item("x", "One sentence only?", "1", "1"), 3, {}) is None


def test_prompt_level_operators():
    ctx = {"seed": 5, "index": 0, "pool": POOL, "evaluated": {"p0"}}
    reordered = ExemplarReorderOperator().apply(PROMPT, ITEM, 0, ctx)
    assert (
        sorted(e.id for e in reordered.prompt.exemplars) == ["e0", "e1", "e2"] and reordered.prompt.exemplars != SHOTS
    )
    assert reordered.prompt == ExemplarReorderOperator().apply(PROMPT, ITEM, 99, ctx).prompt  # one order for all items
    replaced = ExemplarReplaceOperator().apply(PROMPT, ITEM, 0, ctx)
    new_ids = {e.id for e in replaced.prompt.exemplars} - {"e0", "e1", "e2"}
    assert len(new_ids) == 1 and new_ids <= {"p1", "p2", "p3", "p4"}  # never an evaluated item
    assert ExemplarReorderOperator().apply(PROMPT.with_(exemplars=SHOTS[:1]), ITEM, 0, ctx) is None


def test_distractor_and_tautology():
    distracted = DistractorOperator().apply(PROMPT, ITEM, 1, {"distractors": ["A bird sang."]})
    assert distracted.item.question.endswith("A bird sang. How many eggs does Janet sell for 2 dollars?")
    stressed = TautologyOperator(phrase=" and true is true", repeat=5).apply(PROMPT, ITEM, 1, {})
    assert stressed.item.question.count("and true is true") == 5


def test_suite_validation(tmp_path):
    assert {"default", "quick"} <= set(builtin_suite_names())
    suite = load_suite("default")
    assert {f.operator for f in suite.families} >= {
        "synonym",
        "lm_paraphrase",
        "clause_reorder",
        "exemplar_reorder",
        "exemplar_replace",
        "distractor",
        "tautology",
        "keyboard_typos",
        "spelling_typos",
    }
    assert suite.distractors
    with pytest.raises(ConfigError, match=r"s.yaml: families.x.operator: expected one of"):
        parse_suite({"families": {"x": {"operator": "rot13"}}}, str(tmp_path / "s.yaml"))
    with pytest.raises(ConfigError, match="similarity_threshold: expected a number in"):
        parse_suite({"similarity_threshold": 3, "families": {"x": {"operator": "tautology"}}}, str(tmp_path / "s.yaml"))
    with pytest.raises(ConfigError, match="unknown suite"):
        load_suite("nope")


def test_similarity_filter_drops_and_counts(tmp_path):
    suite = parse_suite(
        {"seed": 1, "similarity_threshold": 0.999, "families": {"syn": {"operator": "synonym"}}},
        str(tmp_path / "s.yaml"),
    )
    data = load_task("sst2")
    kept, counts = make_variants(
        suite, suite.families[0], data.default_prompt(), data.dev[:6], {"pool": data.pool}, Similarity()
    )
    assert counts["similarity"] + counts["unchanged"] + len(kept) == 6
    assert counts["similarity"] >= 1  # a strict threshold removes real variants, and says so
    loose = parse_suite(
        {"seed": 1, "similarity_threshold": 0.0, "families": {"syn": {"operator": "synonym"}}}, str(tmp_path / "s.yaml")
    )
    kept_loose, _ = make_variants(
        loose, loose.families[0], data.default_prompt(), data.dev[:6], {"pool": data.pool}, Similarity()
    )
    assert len(kept_loose) > len(kept)


@pytest.mark.slow
@pytest.mark.long
def test_evaluate_and_stress_cli(tmp_path):
    from tests.clirun import promptopt as run

    proc = run("evaluate", "--task", "sst2", "--suite", "quick", "--limit", "6", "--out", str(tmp_path / "rob"))
    assert proc.returncode == 0, proc.stderr
    assert "acc_worst" in proc.stdout and (tmp_path / "rob.csv").is_file()
    summary = yaml.safe_load((tmp_path / "rob.json").read_text())
    assert summary["suite"] == "quick" and summary["n_items"] == 6
    proc = run("stress", "--task", "basic_arithmetic", "--ranks", "1,2", "--limit", "4")
    assert proc.returncode == 0, proc.stderr
    assert "retention" in proc.stdout
    bad = run("stress", "--task", "sst2", "--limit", "2")
    assert bad.returncode == 2 and "needs a generative task" in bad.stderr
    bad = run("stress", "--task", "basic_arithmetic", "--ranks", "0")
    assert bad.returncode == 2 and "--ranks" in bad.stderr


@pytest.mark.long
def test_variants_are_identical_across_processes_and_hash_seeds():
    import contextlib
    import io
    import os
    import subprocess
    import sys

    code = (
        "from promptopt.robustness.perturb import SynonymOperator, SpellingTypoOperator, KeyboardTypoOperator\n"
        "from promptopt.prompts import Prompt\nfrom promptopt.tasks import Item\n"
        "it = Item('s', 'the acting is superb and the story moves quickly across 3 decades of change', 1, 'positive', ('negative', 'positive'))\n"
        "print([op.apply(Prompt(task='sst2'), it, 17, {}).item.question for op in "
        "(SynonymOperator(max_words=2), SpellingTypoOperator(max_words=1), KeyboardTypoOperator(max_chars=1))])\n"
    )
    # this process against one fresh interpreter with another hash seed: two hash seeds show a dependence as
    # well as three, and this process has WordNet loaded already (a fresh one takes ~10 s). Seed 0 switches
    # randomization off, so it differs from whatever this process drew.
    other = "1" if os.environ.get("PYTHONHASHSEED") == "0" else "0"
    fresh = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": other},
    ).stdout
    here = io.StringIO()
    with contextlib.redirect_stdout(here):
        exec(code, {})
    assert here.getvalue() == fresh


def test_protection_drops_are_counted(tmp_path, monkeypatch):
    from promptopt.robustness import perturb
    from promptopt.robustness.perturb import Operator, Variant

    class ChangeNumbers(Operator):
        name = "change_numbers"

        def apply(self, prompt, item, seed, context):
            return Variant(prompt, Item(item.id, item.question.replace("16", "61"), item.gold, item.target))

    monkeypatch.setitem(perturb.OPERATORS._entries, "change_numbers", ChangeNumbers)  # registered, undone after
    suite = parse_suite(
        {"similarity_threshold": 0.0, "families": {"bad": {"operator": "change_numbers"}}}, str(tmp_path / "s.yaml")
    )
    other = Item("q2", "How many legs do 2 cats have?", "8", "8")
    kept, counts = make_variants(suite, suite.families[0], PROMPT, [ITEM, other], {}, Similarity())
    assert counts["protection"] == 1 and counts["unchanged"] == 1 and not kept  # q2 has no 16: unchanged


def test_lm_paraphrase_is_deterministic(tiny_lm):
    from promptopt.models import Runner
    from promptopt.robustness.perturb import LMParaphraseOperator

    items = [
        Item("a", "Tom has 3 apples and buys 2 more.", "5", "5"),
        Item("b", "What is the capital of France?", "Paris", "Paris"),
    ]
    context = {"lm": tiny_lm, "runner": Runner(tiny_lm)}
    first = [v and v.item.question for v in LMParaphraseOperator().apply_many(PROMPT, items, [1, 2], context)]
    second = [
        v and v.item.question for v in LMParaphraseOperator().apply_many(PROMPT, items, [1, 2], context)
    ]  # no memo: generated again
    assert first == second and any(first)


def test_paraphrase_memo_belongs_to_the_caller(tiny_lm):
    """Paraphrases are reused through the memo the caller passes (a session owns one), and counted there;
    another memo shares nothing (no process-wide state)."""
    from promptopt.models import Runner
    from promptopt.robustness.perturb import LMParaphraseOperator, ParaphraseMemo

    items = [
        Item("a", "Tom has 3 apples and buys 2 more.", "5", "5"),
        Item("b", "What is the capital of France?", "Paris", "Paris"),
    ]
    memo, runner = ParaphraseMemo(), Runner(tiny_lm)
    context = {"lm": tiny_lm, "runner": runner, "paraphrases": memo}
    first = [v and v.item.question for v in LMParaphraseOperator().apply_many(PROMPT, items, [1, 2], context)]
    assert (memo.hits, memo.misses) == (0, 2) and len(memo.texts) == 2
    again = [v and v.item.question for v in LMParaphraseOperator().apply_many(PROMPT, items, [1, 2], context)]
    assert again == first and (memo.hits, memo.misses) == (2, 2)
    other = ParaphraseMemo()
    LMParaphraseOperator().apply_many(PROMPT, items, [1, 2], {**context, "paraphrases": other})
    assert (other.hits, other.misses) == (0, 2) and (memo.hits, memo.misses) == (2, 2)


def test_bad_operator_options_fail_when_the_suite_is_read():
    with pytest.raises(
        ConfigError, match=r"^s\.yaml: families\.para: lm_paraphrase: variants must be an integer from 1 to 3, got 7$"
    ):
        parse_suite({"families": {"para": {"operator": "lm_paraphrase", "variants": 7}}}, "s.yaml")


def test_lm_paraphrase_does_not_depend_on_its_batch(tiny_lm):
    """An item's paraphrase is capped by its own question's length, not by the longest question it is
    batched with (before, a short question paraphrased beside a long one could run longer)."""
    from promptopt.models import Runner
    from promptopt.robustness.perturb import LMParaphraseOperator

    short = Item("a", "Tom has 3 apples.", "3", "3")
    long = Item(
        "b",
        "A train leaves the station at noon and travels for three hours at sixty miles per hour; how far does it go?",
        "180",
        "180",
    )
    context = {"lm": tiny_lm, "runner": Runner(tiny_lm, batch_size=1)}  # no memo: each call generates
    alone = LMParaphraseOperator().apply_many(PROMPT, [short], [0], context)[0]
    together = LMParaphraseOperator().apply_many(PROMPT, [long, short], [0, 0], context)[1]
    assert (alone and alone.item.question) == (together and together.item.question)
    n_question = len(tiny_lm.tokenizer(short.question)["input_ids"])
    if alone is not None:
        assert (
            len(tiny_lm.tokenizer(alone.item.question, add_special_tokens=False)["input_ids"])
            <= int(n_question * 1.5) + 16 + 2
        )


def test_similarity_embeds_each_text_once():
    from promptopt.robustness.suite import Similarity

    sim = Similarity()
    a, b = ["the film was great", "a dull movie"], ["the movie was great", "a boring film"]
    first = sim(a, b)
    assert (sim.hits, sim.misses) == (0, 4)
    again = sim(a, b[::-1])  # the same texts, paired differently: nothing is embedded again
    assert (sim.hits, sim.misses) == (4, 4) and sim.hit_rate == 0.5
    np.testing.assert_allclose(again[::-1], sim(a[::-1], b), rtol=1e-6)
    assert first[0] > 0.8 and first[0] > again[0]  # same-meaning pairs score higher than mismatched ones


@pytest.mark.slow
def test_lm_paraphrase_on_the_embedded_model_with_the_real_similarity_filter(embedded_lm, tmp_path):
    """SmolLM2 paraphrases real SST-2 sentences and the sentence-embedding filter judges them: kept variants
    are new text at least `similarity_threshold` from the original, and every other one is a counted drop."""
    from promptopt.robustness.perturb import ParaphraseMemo
    from promptopt.robustness.suite import evaluate_robustness
    from promptopt.scoring import Scorer

    path = tmp_path / "para.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "para",
                "seed": 1,
                "similarity_threshold": 0.8,
                "families": {"para": {"operator": "lm_paraphrase", "variants": 1}},
            }
        )
    )
    suite = load_suite(str(path))
    data = load_task("sst2")
    items = data.dev[:4]
    similarity = Similarity()
    memo = ParaphraseMemo()  # generated here: nothing reused from another test
    result = evaluate_robustness(
        Scorer(embedded_lm, data),
        data.default_prompt(),
        items,
        suite,
        pool=data.pool,
        similarity=similarity,
        paraphrases=memo,
    )
    assert (memo.hits, memo.misses) == (0, len(items))
    row = result.families.set_index("family").loc["para"]
    drops = {
        reason: int(row[f"dropped_{reason}"]) for reason in ("not_applicable", "protection", "unchanged", "similarity")
    }
    assert row["n_variants"] + sum(drops.values()) == len(items), drops
    assert row["n_variants"] >= 1, drops  # the embedded model writes paraphrases the filter keeps
    assert similarity.misses >= 2 * row["n_variants"]  # the real filter embedded each kept pair (original, variant)
    originals = {item.id: item.question for item in items}
    for variant in result.variants.itertuples():
        assert variant.question != originals[variant.item_id]
        assert similarity([originals[variant.item_id]], [variant.question])[0] >= suite.similarity_threshold
