"""Shared fixtures: the embedded model (real), and tiny random models built in-process (plumbing)."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and not os.environ.get("OMP_NUM_THREADS"):
    # pytest-xdist workers split the cores between them (and the CLI subprocesses they start inherit it):
    # two workers of two threads each on a 2-core machine would only fight over the cores
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ["OMP_NUM_THREADS"] = str(max(1, min(2, (os.cpu_count() or 1) // workers)))
torch.set_num_threads(
    int(os.environ.get("OMP_NUM_THREADS") or max(1, min(2, os.cpu_count() or 1)))
)  # honour a caller's limit


def _folder_state(spec: str) -> tuple:
    """What a local model folder holds (names, sizes, mtimes): a folder rewritten at the same path is another model."""
    path = Path(spec)
    if not path.exists():
        return ()
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)


def _use_loader(patch: pytest.MonkeyPatch, loader) -> None:
    """Point both names the library loads through (`promptopt.models.load_model` and the module's own) at `loader`."""
    import promptopt.models as models
    from promptopt.models import load as load_module

    patch.setattr(load_module, "load_model", loader)
    patch.setattr(models, "load_model", loader)


@pytest.fixture(scope="session", autouse=True)
def models_loaded_once_per_test_process():
    """Every in-process load of one model with one set of options returns the same LoadedModel: a load of the
    embedded model costs ~5 s (weights, tokenizer, head check) and the suite's in-process CLI calls, compares
    and sessions would otherwise repeat it dozens of times. Failures are not remembered. Loading itself is
    tested on the real function (tests/models/test_models.py binds it at import); a test that changes a loaded
    model's tokenizer works on its own copy (dataclasses.replace), and one about a model's lifetime asks for
    `models_loaded_fresh`."""
    import inspect

    from promptopt.models import load as load_module

    real, loaded = load_module.load_model, {}
    signature = inspect.signature(real)

    def load_once(*args, **options):
        bound = signature.bind(*args, **options)
        bound.apply_defaults()  # load_model(s) and load_model(s, dtype=None) are one load
        spec = str(bound.arguments["spec"])
        key = (spec, _folder_state(spec), tuple(sorted((k, v) for k, v in bound.arguments.items() if k != "spec")))
        if key not in loaded:
            loaded[key] = real(*args, **options)
        return loaded[key]

    patch = pytest.MonkeyPatch()
    _use_loader(patch, load_once)
    yield types.SimpleNamespace(loaded=loaded, real=real)
    patch.undo()


@pytest.fixture
def models_loaded_fresh(monkeypatch, models_loaded_once_per_test_process):
    """For a test about a model's lifetime (one freed before the next loads): loads that are not shared."""
    _use_loader(monkeypatch, models_loaded_once_per_test_process.real)


@pytest.fixture(scope="session")
def embedded_lm():
    from promptopt.models import load_model

    return load_model("smollm2-135m-instruct", device="cpu")


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    """The de-quantized embedded model as a plain HF folder (its tokenizer is reused by tiny models)."""
    from promptopt.models.load import _dequantized_folder, _resolve

    _, folder, filename = _resolve("smollm2-135m-instruct")
    return _dequantized_folder(folder, filename)


def _save_tiny(tmp: Path, config, embedded_dir: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(embedded_dir).save_pretrained(tmp)
    return tmp


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, embedded_dir) -> Path:
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=2,
        pad_token_id=2,
    )
    return _save_tiny(tmp_path_factory.mktemp("tiny-llama"), config, embedded_dir)


@pytest.fixture(scope="session")
def tiny_gemma2_dir(tmp_path_factory, embedded_dir) -> Path:
    """A 2-layer random Gemma-2 (final logit soft-cap 30) with SmolLM2's tokenizer."""
    from transformers import Gemma2Config

    config = Gemma2Config(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        final_logit_softcapping=30.0,
        eos_token_id=2,
        pad_token_id=2,
        bos_token_id=1,
    )
    return _save_tiny(tmp_path_factory.mktemp("tiny-gemma2"), config, embedded_dir)


@pytest.fixture(scope="session")
def tiny_lm(tiny_llama_dir):
    from promptopt.models import load_model

    return load_model(str(tiny_llama_dir), device="cpu")


# Seconds each file took (summed test time, quiet, `-n 2`, 2026-12-01). pytest-xdist hands out one file at a
# time (--dist loadfile, --no-loadscope-reorder): the longest first, so that the last file a worker takes is a
# short one and neither worker waits on the other at the end (longest-processing-time-first). A file not
# listed counts as 10 s. The numbers only order the files; a stale one costs a little wall time, nothing else.
FILE_SECONDS = {
    "test_full_disk": 130,  # estimates from busy runs on 2026-12-04 (no quiet measurement yet)
    "test_calibrated_cards": 100,
    "test_pmi_cards": 200,  # a busy run on 2026-12-05 (load 10-15): 390 s; lm-eval's check (skipped in CI) 640 s more
    "test_pmi": 25,
    "test_docs": 50,
    "test_decision": 10,
    "test_card_integrity": 35,  # busy runs, 2026-12-04
    "test_table_sets": 25,
    "test_tasks_rte_mrpc": 5,
    "test_serve": 145,  # busy runs on 2026-12-04: the embedded model scores 50 + 17 items twice
    "test_gpu_check": 230,  # busy run, 2026-12-05: prepare (two cards) and the CPU dry run, in subprocesses
    "test_quantization": 150,  # busy runs, 2026-12-05
    "test_batch_size": 60,
    "test_serve_export": 50,
    "test_serve_units": 10,
    "test_propose": 128,
    "test_reliability": 110,
    "test_faults": 105,
    "test_export": 103,
    "test_search": 93,
    "test_compare": 92,
    "test_report": 64,
    "test_custom_tasks": 60,
    "test_gemma": 59,
    "test_robustness": 56,
    "test_runner_floor": 43,
    "test_scoring": 40,
    "test_models": 35,
    "test_diagnose": 31,
    "test_seen_unseen": 28,
    "test_stress_protocol": 26,
    "test_taboo": 21,
    "test_architecture": 20,
    "test_tcb": 17,
    "test_sandbox": 15,
    "test_diagnose_conflicts": 11,
    "test_multi_fidelity": 10,
    "test_tasks": 7,
    "test_cli": 6,
    "test_install": 40,  # 28-52 s on 2 busy cores, 2026-12-06: a venv, a wheel build, pip (cache warm), a search
    "test_extras": 15,  # six CLI processes with modules hidden
    "test_api_objects": 75,  # busy run, 2026-12-06: searches, an export, verifies and a served card on tiny models
    "test_diagnose_math": 4,
    "test_extract_sandbox": 3,
    "test_prefix_cache": 6,
    "test_cache": 1,
    "test_stats": 0.2,
    "test_formats": 0.2,
    "test_prompts": 0.1,
    "test_yamlio": 0.1,
}


def pytest_collection_modifyitems(items):
    """Longest files first (see FILE_SECONDS); within a file, the order it was written in."""
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.stem, 10))  # sort is stable
