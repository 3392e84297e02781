"""The second embedded model, Gemma-3-270M (SentencePiece `▁`, 262k vocabulary, no chat template), end to end:
score, trace, stress and a diagnose through the CLI, and δ_TCB on its real head against float64."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from tests.clirun import promptopt as run

pytestmark = [pytest.mark.slow, pytest.mark.long]
GEMMA = "gemma3-270m"


@pytest.fixture(scope="module", autouse=True)
def gemma_loaded_once(models_loaded_once_per_test_process):
    """Every CLI call here runs in this process (tests/clirun.py) and the session's loads are shared
    (conftest): score, trace, stress, diagnose and propose run on one load of the 262k-vocab model."""
    yield
    gemma = [key for key in models_loaded_once_per_test_process.loaded if key[0] == GEMMA]
    assert len(gemma) == 1, gemma


def _ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_gemma_is_a_named_model_with_its_own_tokenizer_family():
    from promptopt.models import load_model

    lm = load_model(GEMMA, device="cpu")
    assert lm.output_head.vocab_size == 262144 and not lm.has_chat_template
    assert (
        lm.tokenizer.convert_ids_to_tokens(lm.tokenizer(" answer", add_special_tokens=False)["input_ids"])[0]
        == "▁answer"
    )
    # a batch tokenized on threads (scoring/tokens.py) gives the one call's ids, its BOS included
    from promptopt.scoring.tokens import encode_texts

    texts = [f"Review: film {i} was {'a delight' if i % 3 else 'dull'}\nSentiment:" for i in range(200)]
    assert encode_texts(lm.tokenizer, texts, add_special_tokens=True, threads=3) == lm.tokenizer(texts)["input_ids"]
    # δ_TCB on the real 262k head matches the explicit float64 Jacobian at a real position
    from promptopt.metrics.tcb import jacobian_frobenius_reference

    head = lm.output_head
    ids = lm.tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        hidden = lm.base(input_ids=ids).last_hidden_state[0, -1].float()
    ours = head(hidden[None]).tcb[0].item()
    norm = jacobian_frobenius_reference(
        hidden[None], head.weight, bias=head.bias, logit_scale=head.logit_scale, logit_softcap=head.logit_softcap
    )[0].item()
    assert ours == pytest.approx(1.0 / norm, rel=1e-6)


def test_scores_past_the_sliding_window_as_before():
    """A shared prefix longer than Gemma-3's 512-token sliding window: reused prefix buffers give a copied prefix's
    numbers bit for bit, the last MLP where read the reference's within float rounding, both the plain forward's."""
    from promptopt.models import load_model
    from tests.models.test_prefix_cache import assert_buffers_match_copies, assert_matches_reference
    from tests.models.test_runner_floor import _plain

    lm = load_model(GEMMA, device="cpu")
    tok = lm.tokenizer
    shots = "Review: the critics argued about it for weeks and never agreed.\nSentiment: negative\n\n" * 30
    requests = []
    text = shots + "Review: a dull, plodding mess of a movie\nSentiment:"
    ctx = tok(text)["input_ids"]
    for cont in [" negative", " rather good, I think"]:
        requests.append((ctx, tok(text + cont)["input_ids"][len(ctx) :]))
    assert len(ctx) > 512  # past the window: the sliding layers keep its last 511 keys and an offset
    ours, runner = assert_buffers_match_copies(lm, requests)
    assert_matches_reference(lm, requests)
    (template,) = runner._prefixes.values()
    assert any(getattr(layer, "is_sliding", False) and layer.keys.shape[-2] == 511 for layer in template.layers)
    # float32 noise of this model on ~560 tokens: on an AMD EPYC (2026-12-02) the runner was 1.05e-4 nats from the
    # plain forward with its prefix cache and 1.01e-4 without it (the two 4.2e-6 apart), and a float64 forward was
    # 1.0e-4 from both; 1e-4 passed on another CPU and failed on this one
    for (ctx, cont), res in zip(requests, ours):
        assert res.token_logprobs == pytest.approx(_plain(lm, ctx, cont)[0], abs=3e-4)


def test_score_trace_stress_and_diagnose_on_gemma(tmp_path):
    scores = tmp_path / "scores.parquet"
    _ok(
        run(
            "score",
            "--task",
            "sst2",
            "--model",
            GEMMA,
            "--split",
            "test",
            "--limit",
            "6",
            "--device",
            "cpu",
            "--out",
            str(scores),
        )
    )
    table = pd.read_parquet(scores)
    assert len(table) == 6 and table["tcb"].gt(0).all() and table["v_eff"].ge(1).all()

    trace_csv = tmp_path / "trace.csv"
    _ok(
        run(
            "trace",
            "The three primary colours are",
            "--model",
            GEMMA,
            "--max-new-tokens",
            "6",
            "--device",
            "cpu",
            "--out",
            str(trace_csv),
            "--plot",
            str(tmp_path / "trace.png"),
        )
    )
    trace = pd.read_csv(trace_csv)
    assert len(trace) == 6 and {"tcb", "p_second", "running_ppl"} <= set(trace.columns)
    assert (tmp_path / "trace.png").stat().st_size > 0

    stress = tmp_path / "stress"
    out = _ok(
        run(
            "stress",
            "--task",
            "triviaqa",
            "--model",
            GEMMA,
            "--ranks",
            "1",
            "--limit",
            "3",
            "--device",
            "cpu",
            "--out",
            str(stress),
        )
    )
    assert "taboo stress · triviaqa" in out
    items = pd.read_parquet(stress.with_suffix(".parquet"))
    taboo = items[items["rank"] == 1]
    assert taboo["interventions"].sum() > 0  # word-initial `▁` steps were found and masked on the real vocabulary
    baseline = items[items["rank"] == 0].set_index("item_id")["output"]
    assert any(o != baseline[i] for i, o in zip(taboo["item_id"], taboo["output"]))  # masking changed what was written

    folder = tmp_path / "diagnose"
    out = _ok(
        run(
            "diagnose",
            "regimes",
            "--model",
            GEMMA,
            "--tasks",
            "sst2",
            "--limit",
            "6",
            "--text-per-task",
            "6",
            "--trace-tokens",
            "6",
            "--device",
            "cpu",
            "--out",
            str(folder),
        )
    )
    regimes = pd.read_parquet(folder / "regimes.parquet")
    assert set(regimes["subset"]) >= {"all"} and regimes.loc[regimes["subset"] == "all", "n"].iloc[0] >= 12
    assert (folder / "regimes.png").stat().st_size > 0


def test_induce_proposals_from_the_base_model(tmp_path):
    """APE-style induction needs no chat template: Gemma-3-270M (a base model) proposes through `promptopt propose`."""
    import yaml

    out = tmp_path / "space.yaml"
    stdout = _ok(
        run(
            "propose",
            "--task",
            "sst2",
            "--model",
            GEMMA,
            "--mode",
            "induce",
            "--n",
            "1",
            "--dev-limit",
            "8",
            "--test-limit",
            "8",
            "--out",
            out,
            "--cache",
            tmp_path / "cache",
            "--device",
            "cpu",
        )
    )
    assert "proposals:" in stdout and "dropped:" in stdout
    space = yaml.safe_load(out.read_text())
    for name, provenance in space["proposals"].items():
        assert provenance["mode"] == "induce" and provenance["proposer"] == GEMMA and len(provenance["rows"]) == 5
        assert space["instructions"][name].endswith((".", "!", "?"))
    assert set(yaml.safe_load(open("search_spaces/sst2.yaml"))["instructions"]) <= set(space["instructions"])
