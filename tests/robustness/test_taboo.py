"""Taboo decoding: the mask, its trigger and ΔS on hand-built logits; word-initial masks for byte-level
BPE and SentencePiece tokenizers built in-process; model.generate and our own loop; the embedded model."""

from __future__ import annotations

import math

import pytest
import torch

from promptopt.robustness import TabooLogitsProcessor, taboo_stress, word_initial_mask

CORPUS = ["the cat sat on the mat", "a dog ran to the park", "numbers like 12 and 345 appear", "hello world again"] * 20


def _byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def _sentencepiece_tokenizer():
    from tokenizers import SentencePieceBPETokenizer
    from transformers import PreTrainedTokenizerFast

    tok = SentencePieceBPETokenizer()
    tok.train_from_iterator(CORPUS, vocab_size=200, special_tokens=["<eos>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, eos_token="<eos>")


@pytest.mark.parametrize("make, marker", [(_byte_level_tokenizer, "Ġ"), (_sentencepiece_tokenizer, "▁")])
def test_word_initial_mask_for_both_tokenizer_families(make, marker):
    tok = make()
    mask = word_initial_mask(tok)
    tokens = tok.convert_ids_to_tokens(list(range(len(tok))))
    assert mask.shape == (len(tok),)
    for i, t in enumerate(tokens):
        assert bool(mask[i]) == (t.startswith(marker) and i not in tok.all_special_ids), t
    assert mask.any() and not mask.all()
    assert not mask[tok.eos_token_id]
    ids = tok(" the cat")["input_ids"] if marker == "Ġ" else tok("the cat")["input_ids"]
    assert any(mask[i] for i in ids)


def test_decoded_string_fallback():
    class Plain:  # a tokenizer without Ġ/▁ markers: decode decides
        vocab = ["a", " b", "c", " d"]
        all_special_ids = []

        def __len__(self):
            return len(self.vocab)

        def convert_ids_to_tokens(self, ids):
            return [self.vocab[i] for i in ids]

        def decode(self, ids):
            return "".join(self.vocab[i] for i in ids)

    assert word_initial_mask(Plain()).tolist() == [False, True, False, True]


def test_mask_trigger_and_surprisal_on_hand_built_logits():
    word_initial = torch.tensor([True, True, False, True, False])
    proc = TabooLogitsProcessor(word_initial, rank=2)
    scores = torch.tensor(
        [
            [5.0, 4.0, 3.0, 2.0, 1.0],  # nominal top 0 is word-initial: mask {0, 1}
            [1.0, 2.0, 6.0, 3.0, 0.0],  # nominal top 2 is mid-word: untouched
        ]
    )
    out = proc(torch.zeros(2, 1, dtype=torch.long), scores)
    assert torch.isinf(out[0, :2]).all() and out[0, 2:].tolist() == [3.0, 2.0, 1.0]
    assert torch.equal(out[1], scores[1])
    chosen = out.argmax(-1)
    assert chosen.tolist() == [2, 2]
    logs = proc.finalize(chosen[:, None])
    logp = torch.log_softmax(scores[0].double(), -1)
    expected = float((logp[0] - logp[2]) / math.log(2))  # log2 P(x_nom) − log2 P(x*), = 2/ln 2 bits
    assert logs[0].delta_bits == [pytest.approx(expected, rel=1e-6)] and logs[0].steps == [0]
    assert logs[1].interventions == 0 and logs[1].total_bits == 0.0


def test_mid_word_mode_and_sampled_token_surprisal():
    word_initial = torch.tensor([True, False, False, True])
    proc = TabooLogitsProcessor(word_initial, rank=1, mode="mid_word", continues=~word_initial)  # all mid-word here
    scores = torch.tensor([[1.0, 3.0, 2.0, 0.0], [3.0, 1.0, 0.0, 2.0]])
    out = proc(torch.zeros(2, 1, dtype=torch.long), scores)
    assert math.isinf(out[0, 1]) and torch.equal(out[1], scores[1])  # only the mid-word nominal is masked
    # under sampling the emitted token may be any unmasked one: ΔS uses what was emitted (token 3)
    proc(torch.tensor([[0, 3], [0, 0]]), scores)
    logs = proc.finalize(torch.tensor([[3], [0]]))
    logp = torch.log_softmax(scores[0].double(), -1)
    assert logs[0].delta_bits[0] == pytest.approx(float((logp[1] - logp[3]) / math.log(2)), rel=1e-6)
    with pytest.raises(ValueError):
        TabooLogitsProcessor(word_initial, rank=0)


def test_with_model_generate_and_our_loop_agree(tiny_lm):
    from transformers import LogitsProcessorList

    from promptopt.models import Runner

    mask = word_initial_mask(tiny_lm.tokenizer, tiny_lm.output_head.vocab_size)
    ids = tiny_lm.tokenizer("The weather today is")["input_ids"]
    hf_proc = TabooLogitsProcessor(mask, rank=1)
    with torch.no_grad():
        out = tiny_lm.model.generate(
            torch.tensor([ids]),
            max_new_tokens=10,
            do_sample=False,
            logits_processor=LogitsProcessorList([hf_proc]),
            pad_token_id=2,
            eos_token_id=None,
        )
    hf_tokens = out[0, len(ids) :].tolist()
    hf_log = hf_proc.finalize(out)[0]
    ours = Runner(tiny_lm).generate(
        [ids], max_new_tokens=10, processor_factory=lambda: TabooLogitsProcessor(mask, rank=1)
    )[0]
    assert ours.tokens == hf_tokens[: len(ours.tokens)]
    log = ours.processor_logs[0]
    assert log.steps == hf_log.steps[: len(log.steps)]
    assert log.delta_bits == pytest.approx(hf_log.delta_bits[: len(log.delta_bits)], rel=1e-4)
    plain = Runner(tiny_lm).generate([ids], max_new_tokens=10)[0]
    if log.interventions:
        assert plain.tokens != ours.tokens  # the taboo path leaves the nominal one


@pytest.mark.slow
def test_stress_on_embedded_model(embedded_lm):
    from promptopt.scoring import Scorer
    from promptopt.tasks import load_task

    task = load_task("basic_arithmetic")
    scorer = Scorer(embedded_lm, task)
    result = taboo_stress(scorer, task.default_prompt(), task.dev[:8], ranks=(1, 4))
    summary = result.summary.set_index("rank")
    assert list(summary.index) == [0, 1, 4]
    assert summary.loc[0, "interventions_per_item"] == 0 and summary.loc[1, "interventions_per_item"] > 0
    assert summary.loc[1, "mean_surprisal_per_intervention"] > 0
    n_base = summary.loc[0, "n_base_correct"]
    if n_base:
        assert 0 <= summary.loc[1, "retention"] <= 1
        assert summary.loc[1, "retention_ci_low"] <= summary.loc[1, "retention"] <= summary.loc[1, "retention_ci_high"]
    assert (result.items["surprisal_bits"] >= 0).all()
    with pytest.raises(Exception, match="needs a generative task"):
        taboo_stress(
            Scorer(embedded_lm, load_task("sst2")), load_task("sst2").default_prompt(), load_task("sst2").dev[:2]
        )


@pytest.mark.slow
@pytest.mark.long
def test_finished_rows_leave_the_batch_without_changing_any_result(embedded_lm):
    """Rows that finish early are dropped from the batch (KV cache, ids, processors follow): every row's tokens,
    text, finish reason and taboo log are those of the plain loop that keeps computing finished rows."""
    from promptopt.models import Runner

    tok = embedded_lm.tokenizer
    prompts = ["Q: What is 2 + 2?\nA:", "List three colours:", "The capital of France is", "Once upon a time,"]
    contexts = [tok(p)["input_ids"] for p in prompts]
    mask = word_initial_mask(tok, embedded_lm.output_head.vocab_size)
    runs = {}
    for compact in (True, False):
        runner = Runner(embedded_lm, batch_size=4)
        runner.compact = compact
        for rank in (None, 1):
            factory = None if rank is None else (lambda: TabooLogitsProcessor(mask, rank=1))
            runs[compact, rank] = runner.generate(
                contexts, max_new_tokens=20, stop=["\n", "."], processor_factory=factory
            )
    for rank in (None, 1):
        fast, slow = runs[True, rank], runs[False, rank]
        assert len({len(g.tokens) for g in slow}) > 1  # rows did finish at different steps
        for a, b in zip(fast, slow):
            assert (a.tokens, a.text, a.finish_reason) == (b.tokens, b.text, b.finish_reason)
            if rank:
                la, lb = a.processor_logs[0], b.processor_logs[0]
                # a smaller batch changes the float32 matmul reduction order: surprisals (bits) move by up to
                # ~2e-5 (measured on CI: 2.2e-5 on 0.17 bits); tokens and steps above are exact
                assert la.steps == lb.steps and la.delta_bits == pytest.approx(lb.delta_bits, rel=1e-4, abs=1e-4)
    assert any(g.processor_logs[0].interventions for g in runs[True, 1])
