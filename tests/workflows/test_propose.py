"""Instruction proposals: filters (each reason), cleaning, the space file with provenance, proposing with
the embedded model (seeded, cached by content hash, reflect on real answer changes), and search rounds."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from promptopt.errors import ConfigError, UserError
from promptopt.models.load import ModelConfig
from promptopt.prompts import load_card
from promptopt.study.space import load_space, parse_space
from promptopt.tasks.data import DataConfig
from promptopt.workflows.propose import ProposeRequest, propose_space
from promptopt.workflows.propose.filters import ProposalFilter, gold_strings, label_words, shingles
from promptopt.workflows.propose.proposer import find_flips
from promptopt.workflows.propose.requests import clean, first_sentences
from promptopt.workflows.session import Session
from tests.clirun import promptopt


def _cosines(table: dict):
    """A stand-in similarity for the filter's plumbing: cosine 1 for listed pairs, 0 otherwise."""
    return lambda a, b: [1.0 if (x, y) in table or (y, x) in table else 0.0 for x, y in zip(a, b)]


def test_each_filter_reason_on_hand_made_proposals():
    later = (
        "Label each review as negative when the critic disliked the film.",
        "Mark a review negative when the critic disliked the film.",
    )
    screen = ProposalFilter(
        existing=["Decide whether each review is negative or positive."],
        golds={"photosynthesis", "negative", "b"},
        labels={"negative", "positive"},
        quoted=shingles(["it 's of the quality of a lesser harrison ford motion picture"]),
        similarity=_cosines(
            {
                ("Say if each review is negative or positive.", "Decide whether each review is negative or positive."),
                later,
            }
        ),
    )
    cases = {
        "": "empty",
        "Be brief.": "too_short",
        " ".join(["word"] * 81): "too_long",
        "Answer with {question} only, please.": "markup",
        "<|im_start|>system you are a judge": "markup",
        "The answer is photosynthesis in every case.": "leaks_gold",
        "Positive or negative.": "only_label_words",
        "Say if each review is negative or positive.": "near_duplicate",
        "Remember: it's of the quality of a lesser harrison ford film.": "quotes_item",
    }
    for text, reason in cases.items():
        assert screen.admit(text) == reason, text
    assert dict(screen.drops) == {reason: list(cases.values()).count(reason) for reason in set(cases.values())}
    # label words and one-letter golds are the task's vocabulary, not leakage; a word inside another is no match
    assert screen.admit(later[0]) is None
    assert screen.admit("Think about option b carefully, then answer the question.") is None
    assert screen.admit("Explain photosynthesisal cycles briefly before answering.") is None
    # an accepted proposal is compared with the ones after it
    assert screen.admit(later[1]) == "near_duplicate" and screen.drops["near_duplicate"] == 2


def test_real_embeddings_catch_a_reworded_duplicate():
    from promptopt.robustness.suite import Similarity

    screen = ProposalFilter(
        existing=["Decide whether each movie review is negative or positive."],
        golds=set(),
        labels=set(),
        similarity=Similarity(),
    )
    assert screen.reason("Decide whether every movie review is positive or negative.") == "near_duplicate"
    assert screen.reason("You are a film critic; read the text closely before you answer.") is None


def test_gold_and_label_words_of_real_tasks():
    sst2 = DataConfig(task="sst2").load()
    assert label_words([*sst2.pool, *sst2.dev]) == {"negative", "positive"}
    arc = DataConfig(task="arc_easy", dev_limit=20).load()
    golds = gold_strings(arc.dev[:20])
    item = arc.dev[0]
    assert item.choices[item.gold].lower() in golds
    assert label_words([*arc.pool, *arc.dev]) == set()  # ARC's choices differ per item
    screen = ProposalFilter(existing=[], golds=golds, labels=set(), similarity=_cosines({}))
    leaking = f"Remember that the answer is often {item.choices[item.gold]}, so choose well."
    assert screen.reason(leaking) == ("leaks_gold" if len(item.choices[item.gold]) > 1 else None)


def test_cleaning_a_reply():
    assert (
        clean('Instruction: "Classify the review as negative or positive."\n\nMore text', mode="grounded")
        == "Classify the review as negative or positive."
    )
    assert clean(" classify each review by its sentiment\n", mode="induce") == "Classify each review by its sentiment."
    assert first_sentences("Task: One. Two! Three?") == "One. Two!"


def test_space_file_provenance_is_validated(tmp_path):
    raw = yaml.safe_load(Path("search_spaces/sst2.yaml").read_text())
    raw["proposals"] = {"ghost": {"mode": "grounded"}}
    with pytest.raises(ConfigError, match=r"x.yaml: proposals.ghost: expected the name of an instruction"):
        parse_space(raw, "x.yaml")
    raw["instructions"]["ghost"] = "A proposed instruction for each review."
    raw["proposals"] = {"ghost": "grounded"}
    with pytest.raises(ConfigError, match=r"proposals.ghost: expected a mapping with at least mode"):
        parse_space(raw, "x.yaml")
    raw["proposals"] = {"ghost": {"mode": "grounded", "round": 0}}
    assert parse_space(raw, "x.yaml").proposals == {"ghost": {"mode": "grounded", "round": 0}}


def test_request_is_checked():
    with pytest.raises(
        ConfigError, match="--propose-mode: expected one of induce, grounded, history, reflect, got 'ape'"
    ):
        ProposeRequest(n=2, mode="ape")
    with pytest.raises(ConfigError, match="--propose: expected a positive number"):
        ProposeRequest(n=0)


@pytest.fixture(scope="module")
def sst2_session():
    return Session(
        model=ModelConfig(spec="smollm2-135m-instruct", device="cpu"),
        data=DataConfig(task="sst2", dev_limit=16, test_limit=16),
    )


def _untimed(proposals) -> dict:
    """The proposals' record without its wall time (the one field two identical runs differ in)."""
    return {k: v for k, v in proposals.to_json().items() if k != "seconds"}


@pytest.mark.long
def test_grounded_proposals_are_seeded_cached_and_carry_provenance(sst2_session, tmp_path, monkeypatch):
    request = ProposeRequest(n=1, mode="grounded", seed=3, screen_items=0)  # generation, not screening (its own tests)
    first = propose_space(sst2_session, request, space=None, out=tmp_path / "a.yaml", cache_dir=tmp_path / "cache_a")
    again = propose_space(sst2_session, request, space=None, out=tmp_path / "b.yaml", cache_dir=tmp_path / "cache_b")
    texts = [p.text for p in first.proposals.accepted]
    assert (
        texts and _untimed(first.proposals) == _untimed(again.proposals) and not again.proposals.reused
    )  # same seed, same proposals
    assert first.proposals.attempts == len(first.proposals.accepted) + len(first.proposals.rejected)
    assert sum(first.proposals.drops.values()) == len(first.proposals.rejected)
    space = load_space(str(tmp_path / "a.yaml"))
    builtin = load_space("sst2")
    assert list(space.instructions)[: len(builtin.instructions)] == list(builtin.instructions)
    for p in first.proposals.accepted:
        assert space.instructions[p.name] == p.text
        prov = space.proposals[p.name]
        assert (
            prov["mode"] == "grounded"
            and prov["proposer"] == "smollm2-135m-instruct"
            and len(prov["proposer_sha256"]) == 64
        )
        assert prov["seed"] == 3 and prov["round"] == 0 and prov["tip"] and len(prov["rows"]) == 3
        pool_ids = {i.id for i in sst2_session.data.pool}
        assert set(prov["rows"]) <= pool_ids  # grounded on pool rows, never on dev or test items
    assert first.proposals.task_summary
    # the cache answers the same request without generating anything
    monkeypatch.setattr(type(sst2_session.scorer.runner), "generate", lambda *a, **k: pytest.fail("generated again"))
    cached = propose_space(sst2_session, request, space=None, out=tmp_path / "c.yaml", cache_dir=tmp_path / "cache_a")
    assert cached.proposals.reused and [p.text for p in cached.proposals.accepted] == texts
    assert (tmp_path / "c.yaml").read_bytes() == (tmp_path / "a.yaml").read_bytes()


@pytest.mark.long
def test_reflect_shows_answers_a_perturbation_changed(sst2_session, tmp_path):
    flips = find_flips(sst2_session, "cheap")
    assert flips, "the default SST-2 prompt changes some answers under the cheap suite"
    for flip in flips:
        assert flip.perturbed.question != flip.item.question and flip.answer != flip.perturbed_answer
        assert flip.answer in flip.item.choices and flip.perturbed_answer in flip.item.choices
    made = propose_space(
        sst2_session,
        ProposeRequest(n=1, mode="reflect", seed=0, screen_items=0),
        space=None,
        out=tmp_path / "r.yaml",
        cache_dir=tmp_path / "cache",
    )
    attempts = [p.provenance for p in made.proposals.accepted] + [r["provenance"] for r in made.proposals.rejected]
    assert len(attempts) == made.proposals.attempts >= 1
    for provenance in attempts:  # accepted or not, every proposal was shown answers that changed
        assert provenance["perturbed_families"] and set(provenance["perturbed_families"]) <= {f.family for f in flips}
        assert set(provenance["rows"]) <= {f.item.id for f in flips}


def test_history_mode_needs_scored_instructions(sst2_session):
    from promptopt.workflows.propose import propose

    with pytest.raises(UserError, match="history: needs scored instructions"):
        propose(ProposeRequest(n=1, mode="history"), session=sst2_session, instructions={"none": ""})


def test_cli_mistakes_are_one_line(tmp_path):
    result = promptopt("propose", "--task", "sst2", "--n", "2", "--out", tmp_path / "space.txt")
    assert (
        result.code == 2
        and result.stderr.strip()
        == f"error: --out {tmp_path / 'space.txt'}: a space file is YAML; use a .yaml file name"
    )
    result = promptopt("search", "--task", "sst2", "--propose-mode", "reflect", "--out", tmp_path / "s")
    assert result.code == 2 and "give --propose N" in result.stderr and not (tmp_path / "s").exists()
    result = promptopt(
        "search", "--task", "sst2", "--propose", "2", "--propose-mode", "history", "--out", tmp_path / "s"
    )
    assert result.code == 2 and "use --rounds R" in result.stderr and not (tmp_path / "s").exists()


@pytest.mark.long
def test_search_rounds_warm_start_one_table_and_resume(tiny_llama_dir, tmp_path):
    """Plumbing on a tiny random model: its proposals are noise, most are filtered; the rounds still grow
    the space, start from the previous best and resume to the same tables."""
    out = tmp_path / "rounds"
    args = [
        "search",
        "--task",
        "sst2",
        "--model",
        tiny_llama_dir,
        "--strategy",
        "accuracy",
        "--trials",
        "3",
        "--dev-limit",
        "8",
        "--test-limit",
        "8",
        "--propose",
        "1",
        "--propose-mode",
        "induce",
        "--rounds",
        "2",
        "--out",
        out,
        "--seed",
        "5",
    ]
    result = promptopt(*args)
    assert result.code == 0, result.stderr
    rounds = json.loads((out / "rounds.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1]
    trials = pd.read_parquet(out / "trials.parquet")
    assert sorted(trials["round"].unique()) == [0, 1]
    first_of_round1 = trials[(trials["round"] == 1) & (trials["number"] == 0)].iloc[0]
    # round 1 started from round 0's card: its incumbent (trial 0), that card's prompt
    assert first_of_round1["params_incumbent"] == str(out / "round0" / "best_card.yaml")
    kept = json.loads((out / "round1" / "summary.json").read_text())["incumbent"]["kept"]
    same_card = load_card(out / "round0" / "best_card.yaml")[0] == load_card(out / "round1" / "best_card.yaml")[0]
    assert same_card == kept  # kept: round 1 ships round 0's card; replaced: another prompt (never a duplicate)
    params = [c for c in trials.columns if c.startswith("params_")]
    space1 = load_space(str(out / "round1" / "space.yaml"))
    for entry in rounds[1]["proposed"]:
        assert space1.proposals[entry["name"]]["mode"] == "history" and space1.proposals[entry["name"]]["round"] == 1
    written = [
        json.loads(p.read_text()) for p in (out / "proposals").glob("*.json") if not p.name.startswith("screen-")
    ]
    history = [
        a
        for w in written
        for a in [p["provenance"] for p in w["accepted"]] + [r["provenance"] for r in w["rejected"]]
        if a["mode"] == "history"
    ]
    assert history and all(
        a["round"] == 1 and a["parents"] for a in history
    )  # every round-1 attempt saw round 0's instructions
    searched0 = (trials["round"] == 0) & (trials["state"] == "COMPLETE") & trials["params_incumbent"].isna()
    tried0 = set(trials.loc[searched0, "params_instruction"])  # the instructions round 0 scored (not its incumbent)
    assert all(set(a["parents"]) == tried0 for a in history)
    assert set(load_space(str(out / "round0" / "space.yaml")).instructions) <= set(space1.instructions)
    assert (out / "best_card.yaml").read_text() == (out / "round1" / "best_card.yaml").read_text()
    page = promptopt("report", out, "--out", tmp_path / "report.html")
    assert page.code == 0, page.stderr
    html = (tmp_path / "report.html").read_text()
    assert "2 rounds of accuracy search" in html and "round0" in html and "round1" in html
    exported = promptopt("export", out, "--out", tmp_path / "card.yaml")
    assert exported.code == 0, exported.stderr
    assert yaml.safe_load((tmp_path / "card.yaml").read_text())["search"]["study"] == "sst2-accuracy-round1"
    before = (out / "round1" / "space.yaml").read_bytes()
    again = promptopt(*args, "--resume")
    assert again.code == 0, again.stderr
    assert (out / "round1" / "space.yaml").read_bytes() == before  # proposals came back from the cache
    same = ["round", "number", "state", *params]
    assert pd.read_parquet(out / "trials.parquet")[same].equals(trials[same])


@pytest.mark.long
def test_compare_searches_one_grown_space_for_every_strategy(tiny_llama_dir, tmp_path):
    out = tmp_path / "cmp"
    args = [
        "compare",
        "--task",
        "sst2",
        "--model",
        tiny_llama_dir,
        "--strategies",
        "accuracy,ppl",
        "--trials",
        "2",
        "--dev-limit",
        "8",
        "--test-limit",
        "8",
        "--top-n",
        "1",
        "--suite",
        "none",
        "--propose",
        "1",
        "--propose-mode",
        "induce",
        "--out",
        out,
    ]
    result = promptopt(*args)
    assert result.code == 0, result.stderr
    assert "proposals:" in result.stdout
    space = load_space(str(out / "space.yaml"))
    assert space.proposals and set(load_space("sst2").instructions) < set(space.instructions)
    for strategy in ("accuracy", "ppl"):
        assert json.loads((out / strategy / "config.json").read_text())["study"]["space"] == str(out / "space.yaml")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["proposals"]["accepted"] == len(space.proposals) and not summary["proposals"]["reused"]
    again = promptopt(*args, "--resume")
    assert again.code == 0, again.stderr
    assert json.loads((out / "summary.json").read_text())["proposals"]["reused"]
    # refused runs leave the space file as it was: a rerun without --resume, a resume whose proposals would differ
    before = (out / "space.yaml").read_bytes()
    rerun = promptopt(*args)
    assert rerun.code == 2 and "already" in rerun.stderr and "--resume" in rerun.stderr, rerun.stderr
    changed = promptopt(*[a if a != "8" else "6" for a in args], "--resume")  # --dev-limit 6: other dev items
    assert changed.code == 2 and "dev_limit=8 but this run has dev_limit=6" in changed.stderr, changed.stderr
    reseeded = promptopt(
        *args, "--seed", "99", "--resume"
    )  # other proposals, so another space: its studies would differ
    assert reseeded.code == 2 and "space_file_sha256=" in reseeded.stderr, reseeded.stderr
    assert (out / "space.yaml").read_bytes() == before and not (out / "space.yaml.pending").exists()


def test_a_proposed_winner_carries_its_provenance_into_both_cards(tiny_llama_dir, tmp_path):
    raw = yaml.safe_load(Path("search_spaces/sst2.yaml").read_text())
    provenance = {
        "mode": "grounded",
        "proposer": "smollm2-135m-instruct",
        "proposer_sha256": None,
        "seed": 0,
        "attempt": 2,
        "round": 0,
        "parents": [],
        "tip": "concise",
        "rows": ["sst2-1", "sst2-2", "sst2-3"],
    }
    raw["instructions"] = {"grounded_0a1b2c3d": "Decide whether each review is negative or positive."}
    raw["proposals"] = {"grounded_0a1b2c3d": provenance}
    space = tmp_path / "proposed.yaml"
    space.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    result = promptopt(
        "search",
        "--task",
        "sst2",
        "--model",
        tiny_llama_dir,
        "--strategy",
        "accuracy",
        "--trials",
        "2",
        "--dev-limit",
        "6",
        "--test-limit",
        "4",
        "--space",
        space,
        "--out",
        out,
        "--device",
        "cpu",
        "--incumbent",  # the proposed instruction is the space's only one: its trial ships
        "none",
    )
    assert result.code == 0, result.stderr
    best = yaml.safe_load((out / "best_card.yaml").read_text())
    assert best["provenance"]["instruction_provenance"] == {"name": "grounded_0a1b2c3d", **provenance}
    exported = promptopt("export", out, "--out", tmp_path / "card.yaml")
    assert exported.code == 0, exported.stderr
    card = yaml.safe_load((tmp_path / "card.yaml").read_text())
    assert card["search"]["instruction_provenance"] == {"name": "grounded_0a1b2c3d", **provenance}
    verified = promptopt("verify", tmp_path / "card.yaml", "--device", "cpu")
    assert verified.code == 0, verified.stderr


@pytest.mark.long
def test_history_proposals_start_from_the_spaces_own_instructions_scored_on_dev(sst2_session, tmp_path):
    import dataclasses

    from promptopt.workflows.propose import scored_instructions

    space = load_space("sst2")
    three = dataclasses.replace(space, instructions=dict(list(space.instructions.items())[:3]))
    history = scored_instructions(sst2_session, three)
    assert [name for name, _, _ in history] == list(three.instructions)
    base = sst2_session.data.default_prompt()
    by_hand = sst2_session.scorer.score(
        dataclasses.replace(base, instruction=history[2][1]), sst2_session.items("dev")
    ).table
    assert history[2][2] == by_hand["correct"].mean()
    made = propose_space(
        sst2_session,
        ProposeRequest(n=1, mode="history", seed=1, screen_items=0),
        space=None,
        out=tmp_path / "h.yaml",
        cache_dir=tmp_path / "cache",
        history=history,
    )
    value = {name: v for name, _, v in history}
    attempts = [p.provenance for p in made.proposals.accepted] + [r["provenance"] for r in made.proposals.rejected]
    assert attempts
    for provenance in attempts:  # every scored instruction shown (fewer than 8), worst first, as OPRO lists them
        assert sorted(provenance["parents"]) == sorted(three.instructions)
        shown = [value[name] for name in provenance["parents"]]
        assert shown == sorted(shown)


# --- screening --------------------------------------------------------------------------------------------------------
class _Scorer:
    """A stand-in scorer: each instruction's answers on the dev items, as (correct, log-probs of the two labels)."""

    def __init__(self, answers: dict):
        self.answers, self.calls = answers, []

    def score(self, prompt, items):
        import types

        self.calls.append((prompt.instruction, len(items)))
        rows = [self.answers[prompt.instruction][int(item.id[1:])] for item in items]
        table = pd.DataFrame(
            {
                "item_id": [i.id for i in items],
                "gold": [0] * len(items),
                "correct": [c for c, _ in rows],
                "choice_logprobs": [list(lp) for _, lp in rows],
            }
        )
        return types.SimpleNamespace(table=table)


def _fake_session(answers: dict, n: int):
    import types

    from promptopt.prompts import Prompt

    items = [types.SimpleNamespace(id=f"d{i}") for i in range(n)]
    data = types.SimpleNamespace(
        default_prompt=lambda: Prompt(task="t", instruction=""), spec=types.SimpleNamespace(metric="acc")
    )
    return types.SimpleNamespace(items=lambda split: items, data=data, scorer=_Scorer(answers))


def test_screening_keeps_what_is_not_worse_beyond_noise_and_says_why():
    """The control is the best hand-written instruction on the first half of the minibatch; a candidate as accurate
    there with no sign of being worse is kept at once; any other is judged on the whole minibatch and rejected only
    when it is less accurate and the one-sided paired test on log p(gold) says worse at 0.05 (equally accurate but
    less confident is kept); the minibatch is the first `items` dev items."""
    from promptopt.workflows.propose import Proposal
    from promptopt.workflows.propose.screen import apply, screen

    n = 20
    sure, unsure, wrong = (True, (-0.1, -3.0)), (True, (-0.6, -0.9)), (False, (-2.0, -0.2))
    answers = {
        "hand a": [sure] * 14 + [wrong] * 6,  # 0.70: the control
        "hand b": [sure] * 10 + [wrong] * 10,
        "junk": [sure] * 8 + [wrong] * 12,  # 0.40, lower log p(gold) on 6 items: rejected
        "timid": [unsure] * 14 + [wrong] * 6,  # as accurate, less sure everywhere: kept
        "noise": [sure] * 13 + [wrong] * 7,  # one item worse: not beyond noise
        "better": [sure] * 16 + [wrong] * 4,
        "unused": [wrong] * 4 + [sure] * 16,  # the items after the minibatch would have changed the verdict
    }
    session = _fake_session(answers, n + 10)
    proposals = [Proposal(name, name, {"attempt": k}) for k, name in enumerate(("junk", "timid", "noise", "better"))]
    result = screen(session, {"a": "hand a", "b": "hand b"}, proposals, items=n)
    assert result.control == "a" and result.control_accuracy == 1.0 and result.items == n and result.first_items == 10
    verdict = {r["name"]: r for r in result.results}
    assert [name for name in verdict if not verdict[name]["passed"]] == ["junk"]
    assert {name: v["stage"] for name, v in verdict.items()} == {"junk": 2, "timid": 2, "noise": 1, "better": 1}
    assert verdict["junk"]["p"] < 0.05 and verdict["timid"]["p"] < 0.05  # the test alone would reject timid too
    assert 'minibatch accuracy 0.400 vs 0.700 for "hand a" on 20 dev items' in verdict["junk"]["why"]
    assert result.control_text == "hand a" and result.control_label == '"hand a"'  # messages name the text, not the key
    long = dataclasses.replace(result, control_text="Read\nthe review " + "very " * 20 + "carefully.")
    assert long.control_label == '"Read the review ' + ("very " * 9)[:41] + '..."'  # one line, 60 characters
    assert dataclasses.replace(result, control_text=" ").control_label == "the empty instruction"
    scored: dict = {}
    for text, count in session.scorer.calls:  # halves of the first 20 dev items; the control's second half once
        assert count == n // 2
        scored[text] = scored.get(text, 0) + count
    assert scored == {"hand a": 20, "hand b": 10, "junk": 20, "timid": 20, "noise": 10, "better": 10}
    assert result.scored_items == sum(scored.values())
    from promptopt.workflows.propose.proposer import Proposals

    before = Proposals(proposals, [{"text": "x", "reason": "too_short"}], {"too_short": 1}, 5, "k")
    after = apply(before, result)
    assert [p.name for p in after.accepted] == ["timid", "noise", "better"]
    assert (
        after.drops == {"too_short": 1, "worse_than_control": 1}
        and after.rejected[-1]["reason"] == "worse_than_control"
    )
    assert after.attempts == len(after.accepted) + len(after.rejected)


def test_a_proposer_that_yields_nothing_useful_says_so():
    from promptopt.cli.render_propose import proposals_lines
    from promptopt.workflows.propose import Proposal
    from promptopt.workflows.propose.proposer import Proposals
    from promptopt.workflows.propose.screen import Screening, apply

    texts = [Proposal(f"p{k}", f"Write a short story number {k}.", {"attempt": k}) for k in range(3)]
    screening = Screening(32, "none", 0.8, "wilcoxon log p(gold)", control_text="")
    screening.results = [
        {
            "name": p.name,
            "text": p.text,
            "accuracy": 0.5,
            "p": 0.001,
            "passed": False,
            "why": "minibatch accuracy 0.500 vs 0.800",
        }
        for p in texts
    ]
    made = apply(Proposals(texts, [{"text": "Be.", "reason": "too_short"}], {"too_short": 1}, 4, "k"), screening)
    lines = proposals_lines(made, show_rejected=True)
    assert "0 of 3 proposals passed screening: the space is unchanged" in lines
    assert any(
        x.startswith("screening: 0 of 3 proposals passed screening against the empty instruction (") for x in lines
    )
    assert "  - [worse_than_control] Write a short story number 0. (minibatch accuracy 0.500 vs 0.800)" in lines
    assert "  - [too_short] Be." in lines
    hidden = proposals_lines(made, show_rejected=False)
    assert "4 rejected texts: --show-rejected prints them" in hidden and not any("[too_short]" in x for x in hidden)
    nothing = proposals_lines(
        Proposals([], [{"text": "", "reason": "empty"}], {"empty": 1}, 1, "k"), show_rejected=True
    )
    assert "0 of 1 proposals passed the filters: the space is unchanged" in nothing


def test_screening_items_is_checked():
    with pytest.raises(ConfigError, match="--screen-items"):
        ProposeRequest(n=2, screen_items=-1)
    result = promptopt("search", "--task", "sst2", "--screen-items", "8", "--out", "/nonexistent/s")
    assert result.code == 2 and "--screen-items: give --propose N" in result.stderr
