"""Quantized models on the CPU (bitsandbytes): what the load quantized, δ_TCB on a quantized head, the error where
bitsandbytes cannot quantize on the device, and a 4-bit card from a 4-bit search that verifies, serves as the scorer
answers, and fails verify in one line naming the precision when loaded in float32."""

from __future__ import annotations

import pytest
import torch

from tests.clirun import assert_one_line_error, promptopt

pytest.importorskip("bitsandbytes")


def _tiny(tmp_path_factory, embedded_dir, **extra):
    """A 2-layer random Llama with SmolLM2's tokenizer, 64 wide: bitsandbytes' CPU kernels quantize in blocks of
    64 inputs (conftest's tiny Llama is 32 wide)."""
    from transformers import LlamaConfig

    from tests.conftest import _save_tiny

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=2,
        pad_token_id=2,
        **{"tie_word_embeddings": False, **extra},
    )
    return _save_tiny(tmp_path_factory.mktemp("tiny-llama-64"), config, embedded_dir)


@pytest.fixture(scope="module")
def tiny64_dir(tmp_path_factory, embedded_dir):
    return _tiny(tmp_path_factory, embedded_dir)


def _quantized(folder, **config) -> object:
    """The tiny model loaded through bitsandbytes with `config` (a BitsAndBytesConfig's keywords), as promptopt
    wraps a loaded model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    from promptopt.models.load import LoadedModel, bitsandbytes_for

    bitsandbytes_for("4bit" if config.get("load_in_4bit") else "8bit", "cpu")  # and its log notes quieted
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, quantization_config=BitsAndBytesConfig(**config), device_map="cpu"
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return LoadedModel(
        model=model, tokenizer=tokenizer, name=str(folder), device=torch.device("cpu"), context_length=512
    )


def test_a_4bit_load_on_the_cpu_says_what_it_quantized(tiny64_dir):
    from promptopt.models.load import load_model, precision_name, quantization_info

    lm = load_model(str(tiny64_dir), device="cpu", quantize="4bit")
    info = quantization_info(lm.model)
    assert info == {
        "method": "bitsandbytes",
        "bits": 4,
        "quant_type": "nf4",
        "double_quant": True,
        "compute_dtype": "float32",
        "n_quantized": 14,  # 2 layers x (q, k, v, o, gate, up, down)
        "quantized": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
        "kept": ["lm_head"],
        "head": "float",
    }
    assert precision_name("float32", info) == "4-bit nf4 (double quant, compute float32)"
    eight = quantization_info(load_model(str(tiny64_dir), device="cpu", quantize="8bit").model)
    assert (eight["bits"], eight["quant_type"], eight["outlier_threshold"], eight["n_quantized"]) == (
        8,
        "llm.int8",
        6.0,
        14,
    )
    assert quantization_info(load_model(str(tiny64_dir), device="cpu").model) is None


@pytest.mark.parametrize("bits", [4, 8])
def test_tcb_reads_a_quantized_head_de_quantized(tiny64_dir, bits):
    """lm_head quantized too (skip list emptied): δ_TCB's W is the de-quantized head, it reproduces the model's own
    logits, and δ_TCB equals the float64 explicit-Jacobian reference on that W (not on the float32 head's)."""
    from promptopt.metrics.tcb_reference import jacobian_frobenius_reference
    from promptopt.models.load import load_model, quantization_info, verify_geometry

    config = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": torch.float32}
    lm = _quantized(tiny64_dir, **(config if bits == 4 else {"load_in_8bit": True}), llm_int8_skip_modules=[])
    assert type(lm.model.lm_head.weight).__name__ == ("Params4bit" if bits == 4 else "Int8Params")
    assert quantization_info(lm.model)["head"] == f"{bits}-bit, de-quantized"
    head = lm.output_head
    full = load_model(str(tiny64_dir), device="cpu").model.lm_head.weight.detach()
    assert head.weight.dtype == torch.float32 and head.weight.shape == full.shape
    assert not torch.equal(head.weight, full) and (head.weight - full).abs().max() < 0.2 * full.abs().max()
    verify_geometry(lm)  # the de-quantized W reproduces the model's logits
    hidden = torch.randn(3, full.shape[1], generator=torch.Generator().manual_seed(0))
    ours = head(hidden, eps=1.0).tcb
    reference = 1.0 / jacobian_frobenius_reference(hidden.double(), head.weight)
    on_float = 1.0 / jacobian_frobenius_reference(hidden.double(), full)
    assert torch.allclose(ours, reference, rtol=1e-5)
    assert not torch.allclose(ours, on_float, rtol=1e-5)


def test_a_tied_head_is_the_float_input_embedding(tmp_path_factory, embedded_dir):
    from promptopt.models.load import load_model, quantization_info

    tied = _tiny(tmp_path_factory, embedded_dir, tie_word_embeddings=True)
    lm = load_model(str(tied), device="cpu", quantize="4bit")
    assert quantization_info(lm.model)["head"] == "float, tied to the input embedding"
    assert lm.output_head.weight.data_ptr() == lm.model.get_input_embeddings().weight.data_ptr()


def test_a_bitsandbytes_without_the_device_is_one_line_naming_its_version(tiny64_dir, monkeypatch, models_loaded_fresh):
    import importlib.metadata

    import bitsandbytes

    from promptopt.errors import UnsupportedError
    from promptopt.models.load import ModelConfig, load_model

    monkeypatch.setattr(bitsandbytes, "supported_torch_devices", {"cuda"})
    version = importlib.metadata.version("bitsandbytes")
    message = f"--quantize 4bit on cpu: bitsandbytes {version} quantizes on cuda only"
    with pytest.raises(UnsupportedError, match=message):
        load_model(str(tiny64_dir), device="cpu", quantize="4bit")
    with pytest.raises(UnsupportedError, match=message):  # what a search checks before it starts
        ModelConfig(spec=str(tiny64_dir), device="cpu", quantize="4bit").check()


@pytest.mark.long
def test_the_cli_names_the_version_when_bitsandbytes_cannot_quantize_here(tiny64_dir, tmp_path):
    """In a fresh process: a sitecustomize hides the CPU from bitsandbytes' devices."""
    (tmp_path / "sitecustomize.py").write_text(
        "import logging\nlogging.getLogger('bitsandbytes').setLevel(logging.ERROR)\n"  # as promptopt imports it
        "import bitsandbytes\nbitsandbytes.supported_torch_devices = {'cuda'}\n",
        encoding="utf-8",
    )
    import os

    result = promptopt(
        "score", "--task", "sst2", "--model", tiny64_dir, "--device", "cpu", "--quantize", "8bit", "--limit", "2",
        subprocess=True,
        env={"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])},
    )  # fmt: skip
    assert_one_line_error(result, "--quantize 8bit on cpu: bitsandbytes", "quantizes on cuda only")


# --- a 4-bit card, end to end -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def card_4bit(tiny64_dir, tmp_path_factory):
    """A 4-bit search (2 trials, 100 test items) and the card exported from it."""
    from promptopt.study import SearchConfig, run_search
    from promptopt.workflows.export import export_run

    root = tmp_path_factory.mktemp("quantized")
    config = SearchConfig.build(
        task="sst2",
        trials=2,
        model=str(tiny64_dir),
        out=str(root / "run"),
        dev_limit=8,
        test_limit=100,
        minibatch=4,
        device="cpu",
        quantize="4bit",
    )
    run_search(config, show_progress=False)
    path = root / "card.yaml"
    export_run(config.out, out=path)
    return path


@pytest.mark.slow
@pytest.mark.long
def test_a_4bit_card_verifies_serves_as_the_scorer_and_fails_verify_in_float32(card_4bit, tmp_path):
    import yaml

    from promptopt.card import edited_scored_fields
    from promptopt.models.load import ModelConfig, quantization_info
    from promptopt.production import Server
    from promptopt.scoring import Scorer
    from promptopt.scoring.card_answers import answer_table, card_members
    from promptopt.tasks import load_task
    from promptopt.workflows.verify import verify_card

    card = yaml.safe_load(card_4bit.read_text(encoding="utf-8"))
    recorded = card["model"]["quantization"]
    assert (recorded["bits"], recorded["quant_type"], recorded["n_quantized"]) == (4, "nf4", 14)
    assert card["versions"]["bitsandbytes"] and len(card["data"]["test_ids"]) == 100

    result = verify_card(card_4bit, device="cpu")  # in the card's precision, without being told
    assert result.ok, result.lines()
    assert "ok    precision: 4-bit nf4 (double quant, compute float32)" in result.lines()

    fp32 = verify_card(card_4bit, device="cpu", quantize="none", limit=4)
    failed = [c for c in fp32.checks if not c.ok]
    assert failed[0].name == "precision"
    assert failed[0].detail == "recorded 4-bit nf4 (double quant, compute float32), got float32"
    assert fp32.lines()[-1].startswith(f"verify failed for {card_4bit}: precision")

    server = Server(card_4bit, device="cpu")
    assert quantization_info(server.scorer.lm.model) == recorded
    by_id = {i.id: i for i in load_task("sst2").test}
    items = [by_id[i] for i in card["data"]["test_ids"]]
    served = server.answer([{"question": i.question} for i in items])
    lm = ModelConfig(spec=card["model"]["spec"], device="cpu", quantize="4bit").load()
    table = answer_table(Scorer(lm, server.scorer.data), card_members(card, "card"), items)
    assert [a["index"] for a in served] == [int(p) for p in table["pred"]]  # 100 of 100
    assert [a["tcb"] for a in served] == pytest.approx([float(t) for t in table["tcb"]], rel=1e-6)
    assert "".join("1" if c else "0" for c in table["correct"]) == card["metrics"]["test"]["correct"]

    auto = Server(card_4bit, device="cpu", batch_size="auto")  # serving with --batch-size auto, OOM above 16 rows
    from tests.models.test_batch_size import _fits_only

    seen: list[int] = []
    _fits_only(auto.scorer.runner, 16, seen)
    again = auto.answer([{"question": i.question} for i in items])
    assert auto.scorer.runner.batch_size == 16 and max(seen) > 16
    assert [a["index"] for a in again] == [a["index"] for a in served]

    card["model"]["quantization"] = None  # an edit of the recorded precision is named
    assert edited_scored_fields(card) == ["model.quantization"]


@pytest.mark.slow
def test_cli_verify_in_float32_fails_naming_the_precision_and_score_loads_the_cards(card_4bit):
    from promptopt.workflows.evaluate import card_precision

    result = promptopt("verify", card_4bit, "--device", "cpu", "--quantize", "none", "--limit", "3")
    assert result.code == 1, result.stderr
    assert "FAIL  precision: recorded 4-bit nf4 (double quant, compute float32), got float32" in result.stdout
    assert card_precision(card_4bit, None, None) == ("float32", "4bit")
    assert card_precision(card_4bit, None, "none") == ("float32", None)
    assert card_precision(None, None, "8bit") == (None, "8bit")
    bad = promptopt("verify", card_4bit, "--quantize", "3bit")
    assert_one_line_error(bad, "--quantize 3bit: expected 4bit, 8bit or none")
