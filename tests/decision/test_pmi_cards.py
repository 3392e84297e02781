"""The pmi rule on the embedded model and real per-item-choice items: a pmi card round trips (compare -> export ->
verify reproduces its score -> load_prompt, torch-free, and `promptopt serve` decide 100/100 test items as the
scorer did), and where the two forms coincide (0-shot, a bare template: the content-free prompt renders as the empty
text) its decisions are lm-eval 0.4.13's acc_mutual_info, item by item (skipped where lm-eval is not installed)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pmi_card(tmp_path_factory):
    from promptopt.study import SearchConfig
    from promptopt.workflows.compare import run_compare
    from promptopt.workflows.export import export_run

    tmp = tmp_path_factory.mktemp("pmi")
    # ARC-Easy 0-shot, its default prompt (the compare's baseline) too, and a 0-shot space with an instruction (the
    # content-free prompt is then not the empty text): the built-in 3-shot prompts made this module 200 s of the suite
    builtin = (REPO / "promptopt/tasks/builtin/arc_easy.yaml").read_text()
    assert "name: arc_easy\n" in builtin and "  k: 3\n" in builtin
    task = tmp / "arc_easy_0shot.yaml"
    task.write_text(builtin.replace("name: arc_easy\n", "name: arc_easy_0shot\n").replace("  k: 3\n", "  k: 0\n"))
    space = tmp / "space.yaml"
    space.write_text(
        "task: arc_easy_0shot\n"
        'instructions: {task_specific: "Answer the grade-school science question."}\n'
        "exemplars: {candidates: 4, k: [0, 0]}\n"
        'templates: {question_answer: {query: "Question: {question}\\nAnswer:"}}\n'
    )
    config = SearchConfig.build(
        task=str(task),
        space=str(space),
        trials=2,
        dev_limit=8,
        test_limit=100,
        out=str(tmp / "cmp"),
        seed=3,
        pruning=False,
        device="cpu",
    )
    result = run_compare(config, ["accuracy@pmi"], top_n=1, suite=None, show_progress=False)
    assert set(result.table["strategy"]) >= {"accuracy@pmi"}
    card_path = tmp / "pmi.yaml"
    exported = export_run(tmp / "cmp", out=card_path, strategy="accuracy@pmi")
    return tmp / "cmp", card_path, exported.card, task


@pytest.mark.long
def test_a_pmi_card_round_trips_to_load_prompt_and_serve(pmi_card):
    import httpx

    import promptopt
    from promptopt.models.load import ModelConfig
    from promptopt.scoring.card_answers import answer_table, card_members
    from promptopt.serving import Server
    from promptopt.serving.app import create_app
    from promptopt.tasks.data import DataConfig
    from promptopt.workflows.session import Session
    from promptopt.workflows.verify import verify_card
    from tests.serve_helpers import running

    out, card_path, card, task = pmi_card
    assert card["decision"] == {"rule": "pmi", "reading": "acc_norm", "content_free": [""]}  # ARC reads acc_norm
    assert card["metrics"]["test"]["n"] == 100
    verified = verify_card(card_path, device="cpu")
    assert verified.ok, verified.lines()
    assert verified.accuracy == card["metrics"]["test"]["accuracy"] and not verified.flipped

    # the scorer's answers, its rows from the compare's result cache (verify re-scored them uncached)
    session = Session(
        model=ModelConfig(spec=card["model"]["spec"], device="cpu"), data=DataConfig(task=str(task)), out=out
    )
    by_id = {i.id: i for role in ("dev", "test") for i in session.data.split(role)}
    items = [by_id[i] for i in card["data"]["test_ids"]]
    scorer, members = session.scorer, card_members(card)
    table = answer_table(scorer, members, items)
    expected = [int(p) for p in table["pred"]]
    assert "".join("1" if p == i.gold else "0" for p, i in zip(expected, items)) == card["metrics"]["test"]["correct"]

    # load_prompt: the caller scores render()'s continuations (the scorer's log-likelihoods stand for the caller's
    # model here, as in test_calibrated_cards) and content_free_requests() (scored here from the texts it names)
    loaded = promptopt.load_prompt(card_path)
    prompt = members[0].prompt
    logprobs = [list(r) for r in table["choice_logprobs"]]
    contexts, conts = [], []
    for item in items:
        for context, cont in loaded.content_free_requests(item.choices):
            contexts.append(context)
            conts.append(cont)
    ids = [str(i) for i in range(len(contexts))]
    inner = scorer.scorer  # the result cache's plain scorer: its encoding
    flat = [r.logprob for r in scorer.runner.loglikelihood(inner._pairs(contexts, conts, prompt, ids))]
    content_free, at = [], 0
    for item in items:
        content_free.append(flat[at : at + len(item.choices)])
        at += len(item.choices)
    choices = [item.choices for item in items]
    assert loaded.decide_batch(logprobs, choices, content_free) == expected  # 100/100

    # promptopt serve: the HTTP app under uvicorn, in requests of at most 32 inputs
    server = Server(card_path, lm=scorer.lm)
    assert server.identity["decision"] == "pmi"
    served = []
    with running(create_app(server)) as url:
        for start in range(0, len(items), 25):
            body = {"inputs": [{"question": i.question, "choices": list(i.choices)} for i in items[start : start + 25]]}
            response = httpx.post(f"{url}/v1/answer", json=body, timeout=300)
            assert response.status_code == 200, response.text
            served.extend(a["index"] for a in response.json()["answers"])
    assert served == expected  # 100/100

    # several requests in one pass, inputs of 4, 3 and 2 choices side by side (these test items all have 4): each
    # answered as that request alone, and the 4-choice ones as the scorer did
    from promptopt.serving.inputs import Input

    groups = [
        [Input(i.question, tuple(i.choices)) for i in items[:3]],
        [Input(items[3].question, tuple(items[3].choices[:3]))],
        [Input(i.question, tuple(i.choices[:2])) for i in items[4:6]],
    ]
    together = server.answer_groups(groups)
    assert [a["index"] for a in together[0]] == expected[:3]
    for group, answers in zip(groups, together):
        alone = server.answer(group)
        assert [a["index"] for a in answers] == [a["index"] for a in alone]
        for a, b in zip(answers, alone):
            assert list(a["decision_scores"]) == list(b["decision_scores"])
            assert list(a["decision_scores"].values()) == pytest.approx(list(b["decision_scores"].values()), abs=1e-4)
            assert a["tcb"] == pytest.approx(b["tcb"], rel=1e-3)


@pytest.mark.long
def test_the_production_helper_stays_torch_free_for_pmi(pmi_card):
    _, card_path, _, _ = pmi_card
    code = (
        "import sys, promptopt; c = promptopt.load_prompt(sys.argv[1]); ch = ['a b', 'cd']; "
        "r = c.content_free_requests(ch); "
        "print(len(r), c.decide([-3.0, -4.0], ch, [-1.0, -3.5]), 'torch' in sys.modules, 'numpy' in sys.modules)"
    )
    printed = subprocess.run([sys.executable, "-c", code, str(card_path)], capture_output=True, text=True, check=True)
    # acc_norm: (−3 + 1)/3 = −0.67 against (−4 + 3.5)/2 = −0.25: the second choice
    assert printed.stdout.split() == ["2", "1", "False", "False"]


needs_lm_eval = pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed (pip install 'promptopt[lmeval]')"
)


@needs_lm_eval
@pytest.mark.long
def test_pmi_is_lm_evals_acc_mutual_info_where_the_forms_coincide(embedded_lm, tmp_path):
    """HellaSwag's 100 shipped validation rows, 0-shot, lm-eval's prompt: the content-free prompt renders as the empty
    text, so pmi's reference is log P(" ending" | BOS), lm-eval's unconditional request. Every decision agrees."""
    from promptopt.analyses.lmeval_run import run_lm_eval
    from promptopt.decision import DecisionRule
    from promptopt.models.load import model_folder
    from promptopt.scoring import Scorer
    from promptopt.scoring.calibration import DecidingScorer
    from promptopt.tasks import load_task

    folder = tmp_path / "hellaswag_mi"
    shutil.copytree(REPO / "examples/lm_eval_tasks/hellaswag", folder)
    config = (folder / "hellaswag.yaml").read_text()
    config = config.replace("task: hellaswag\n", "task: hellaswag_mi\n").replace(
        "examples/lm_eval_tasks/data/hellaswag_validation.jsonl",
        str(REPO / "examples/lm_eval_tasks/data/hellaswag_validation.jsonl"),
    )
    config = config.replace("  - metric: acc_norm\n", "  - metric: acc_mutual_info\n")
    (folder / "hellaswag.yaml").write_text(config)
    assert "acc_mutual_info" in yaml.safe_load(config.replace("!function", ""))["metric_list"][1]["metric"]

    task = load_task(str(REPO / "examples/lm_eval_tasks/hellaswag_columns.yaml"))
    items, prompt = task.test[:100], task.default_prompt()
    assert prompt.context("", items[0].choices) == ""  # where the two forms coincide
    scorer = Scorer(embedded_lm, task)
    rule = DecisionRule(kind="pmi", reading="acc", content_free=("",))
    ours = DecidingScorer(scorer, rule).score(prompt, items).table

    samples, _, _ = run_lm_eval("hellaswag_mi", str(folder), model_folder("smollm2-135m-instruct"), limit=100)
    assert len(samples) == 100
    agree, ref_diff = 0, 0.0
    for sample, row in zip(samples, ours.to_dict("records")):
        lls = np.array([float(r[0]) for r in sample["filtered_resps"]])
        k = len(row["choice_logprobs"])
        assert len(lls) == 2 * k  # conditional then unconditional requests
        theirs = int(np.argmax(lls[:k] - lls[k:]))
        assert bool(sample["acc_mutual_info"]) == (theirs == row["gold"])
        agree += theirs == int(row["pred"])
        ref_diff = max(ref_diff, float(np.abs(lls[k:] - np.array(row["choice_logprobs_cf"])).max()))
    print(f"pmi vs lm-eval acc_mutual_info: {agree}/100 decisions agree; references within {ref_diff:.2e} nats")
    assert agree == 100
    assert ref_diff < 1e-3
    assert ours["correct"].mean() == pytest.approx(np.mean([s["acc_mutual_info"] for s in samples]))
