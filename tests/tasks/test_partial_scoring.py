"""Partial evaluation (lm-eval's multiple inputs, Winogrande) scored as lm-eval scores it: log p(continuation |
context_i) for every choice i (the choices are contexts), acc = argmax, acc_norm = argmax of the log-likelihood
per character of the choice (lm-eval divides by len(choice), the context here), δ_TCB and target_nll at the
position that predicts the continuation's first token under the gold context. Every number is checked against one
plain, uncached forward of each full prompt; forms that cannot apply are refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from promptopt.errors import ConfigError
from promptopt.scoring import Scorer
from promptopt.tasks import load_task_spec
from promptopt.tasks.data import load_task_data
from tests.models.test_runner_floor import _plain

REPO = Path(__file__).resolve().parents[2]
WINOGRANDE = REPO / "examples" / "lm_eval_tasks" / "winogrande" / "default.yaml"
HELLASWAG = REPO / "examples" / "lm_eval_tasks" / "hellaswag" / "hellaswag.yaml"


@pytest.fixture
def winogrande(monkeypatch):
    monkeypatch.chdir(REPO)
    return load_task_data(load_task_spec(str(WINOGRANDE), trust_task_code=True))


def _lm_eval_pair(tok, context: str, continuation: str):
    """lm-eval's encoding: the continuation's ids are what the whole text adds to the context's."""
    ctx = tok(context)["input_ids"]
    return ctx, tok(context + continuation)["input_ids"][len(ctx) :]


def test_partial_items_score_log_p_of_the_continuation_under_each_context(tiny_lm, winogrande):
    items = winogrande.test[:6]
    prompt = winogrande.default_prompt()
    scorer = Scorer(tiny_lm, winogrande, batch_size=3)
    table = scorer.score(prompt, items).table
    tok = tiny_lm.tokenizer
    for item, row in zip(items, table.itertuples()):
        plain = [_plain(tiny_lm, *_lm_eval_pair(tok, c, " " + item.continuation)) for c in item.choices]
        lls = np.array([sum(p[0]) for p in plain])
        assert row.choice_logprobs == pytest.approx(lls.tolist(), abs=1e-5)
        norm = lls / np.array([len(c) for c in item.choices])  # lm-eval: len(choice), the context for multiple inputs
        assert row.choice_logprobs_norm == pytest.approx(norm.tolist(), abs=1e-6)
        assert (row.pred, row.pred_norm) == (int(lls.argmax()), int(norm.argmax()))
        assert row.acc == (row.pred == item.gold) and row.gold == item.gold
        gold_tokens = _lm_eval_pair(tok, item.choices[item.gold], " " + item.continuation)[1]
        assert row.gold_logprob == pytest.approx(lls[item.gold], abs=1e-5)
        assert row.ppl == pytest.approx(math.exp(-lls[item.gold] / len(gold_tokens)), rel=1e-5)
        # the critical position: the gold context's last token, predicting the continuation's first token
        assert row.target_nll == pytest.approx(-plain[item.gold][0][0], abs=1e-5)
        critical = plain[item.gold][2]
        assert row.tcb == pytest.approx(float(tiny_lm.output_head(critical[None].float()).tcb[0]), rel=1e-4)
        assert set(row.choice_first_tokens) == {gold_tokens[0]}


def test_partial_scoring_is_packed_and_matches_the_unpacked_runner(tiny_lm, winogrande):
    items, prompt = winogrande.test[:8], winogrande.default_prompt()
    packed = Scorer(tiny_lm, winogrande, batch_size=4)
    table = packed.score(prompt, items).table
    assert packed.runner.last_call_packed  # 0-shot: each item's contexts run their common head once
    whole = Scorer(tiny_lm, winogrande, batch_size=4)
    whole.runner.share_item_contexts = False
    reference = whole.score(prompt, items).table
    for a, b in zip(table.itertuples(), reference.itertuples()):
        assert a.choice_logprobs == pytest.approx(b.choice_logprobs, abs=1e-5) and a.pred == b.pred


def test_partial_few_shot_prompts_show_gold_context_and_continuation(tiny_lm, tmp_path):
    """With shots, each shot is the gold context + target delimiter + continuation (lm-eval's c[q] + target), and the
    few-shot block is the prefix every context shares (the prefix cache)."""
    rows = [json.loads(line) for line in (REPO / "examples/lm_eval_tasks/data/winogrande_validation.jsonl").open()]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[3:9]))
    text = WINOGRANDE.read_text().replace(
        "examples/lm_eval_tasks/data/winogrande_validation.jsonl",
        f"{tmp_path / 'val.jsonl'}, train: {tmp_path / 'train.jsonl'}",
    )
    text = text.replace(
        "\ntraining_split: null\n", "\ntraining_split: train\nnum_fewshot: 2\nfewshot_config: {sampler: first_n}\n"
    )
    for name in ("default.yaml", "preprocess_winogrande.py"):
        (tmp_path / name).write_text(text if name.endswith(".yaml") else (WINOGRANDE.parent / name).read_text())
    data = load_task_data(load_task_spec(str(tmp_path / "default.yaml"), trust_task_code=True))
    prompt = data.default_prompt()
    shot = data.pool[0]
    item = data.test[0]
    context = prompt.context(item.choices[0], None, tiny_lm.tokenizer)
    assert context.startswith(f"{shot.question} {shot.continuation}\n\n")
    scorer = Scorer(tiny_lm, data, batch_size=4)
    table = scorer.score(prompt, data.test[:4]).table
    assert len(scorer.runner._prefixes) == 1 and not scorer.runner.last_call_packed
    tok = tiny_lm.tokenizer
    for it, row in zip(data.test[:4], table.itertuples()):
        lls = [
            sum(_plain(tiny_lm, *_lm_eval_pair(tok, prompt.context(c, None, tok), " " + it.continuation))[0])
            for c in it.choices
        ]
        assert row.choice_logprobs == pytest.approx(lls, abs=1e-5)


def test_label_words_or_letters_cannot_apply_to_contexts(tiny_lm, winogrande):
    from promptopt.prompts import PromptTemplate

    prompt = winogrande.default_prompt()
    for template in (PromptTemplate(label_words=("one", "two")), PromptTemplate(choice_format="letter")):
        with pytest.raises(ConfigError, match=r"its choices are contexts, each followed by one continuation"):
            Scorer(tiny_lm, winogrande).score(prompt.with_(template=template), winogrande.test[:2])


def test_a_generated_answer_type_refuses_contexts_as_choices(tmp_path, monkeypatch):
    """doc_to_text giving an index makes the choices contexts: only log-likelihood scoring takes them."""
    from promptopt.errors import DataError

    monkeypatch.chdir(REPO)
    spec = load_task_spec(str(WINOGRANDE), trust_task_code=True)
    from dataclasses import replace

    with pytest.raises(DataError, match=r"doc_to_text: gives an answer index \(1\): choices that are contexts"):
        load_task_data(replace(spec, answer_type="multiple_choice_gen"))


@pytest.mark.slow
@pytest.mark.long
def test_hellaswag_rows_match_plain_forward_on_smollm2(embedded_lm, monkeypatch):
    """0-shot HellaSwag through lm-eval's own file, packed: each choice's log-likelihood, both predictions and δ_TCB
    at the shared critical state against plain forwards on the embedded model."""
    monkeypatch.chdir(REPO)
    data = load_task_data(load_task_spec(str(HELLASWAG), trust_task_code=True))
    items, prompt = data.test[:4], data.default_prompt()
    scorer = Scorer(embedded_lm, data, batch_size=4)
    table = scorer.score(prompt, items).table
    assert scorer.runner.last_call_packed
    tok = embedded_lm.tokenizer
    for item, row in zip(items, table.itertuples()):
        plain = [_plain(embedded_lm, *_lm_eval_pair(tok, item.question, " " + c)) for c in item.choices]
        lls = np.array([sum(p[0]) for p in plain])
        assert row.choice_logprobs == pytest.approx(lls.tolist(), abs=5e-5)
        assert row.pred == int(lls.argmax())
        assert row.pred_norm == int((lls / np.array([len(c) for c in item.choices])).argmax())
        head = embedded_lm.output_head(plain[0][2][None].float())
        assert row.tcb == pytest.approx(float(head.tcb[0]), rel=1e-4)
    assert torch.is_tensor(scorer.score(prompt, items).hidden)
