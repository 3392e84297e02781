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


# Seconds each file's tests took, summed (`-n 2` beside a one-core benchmark, 2026-12-06; busy-machine numbers, so
# about 1.6x a quiet run's): QUICK_SECONDS for the tests `make test` runs, LONG_SECONDS for its `long` ones.
# pytest-xdist hands out one file at a time (--dist loadfile, --no-loadscope-reorder): the longest first, so that the
# last file a worker takes is a short one and neither worker waits on the other at the end
# (longest-processing-time-first). A file not listed counts as 1 s. The numbers only order the files; a stale one
# costs a little wall time, nothing else.
QUICK_SECONDS = {
    "test_report": 50,
    "test_export": 42,
    "test_faults": 25,
    "test_serve": 25,
    "test_search": 25,
    "test_batch_size": 21,
    "test_sandbox": 18,
    "test_card_integrity": 17,
    "test_api_objects": 17,
    "test_seen_unseen": 16,
    "test_selection": 15,
    "test_serve_connections": 13,
    "test_run_folders": 12,
    "test_architecture": 11,
    "test_quantization": 11,
    "test_compare": 10,
    "test_diagnose": 10,
    "test_full_disk": 10,
    "test_serve_export": 10,
    "test_serve_units": 9,
    "test_incumbent": 9,
    "test_runner_floor": 9,
    "test_robustness": 8,
    "test_progress": 8,
    "test_api": 8,
    "test_yamlio": 8,
    "test_tasks": 7,
    "test_diagnose_conflicts": 7,
    "test_extras": 7,
    "test_stress_protocol": 7,
    "test_propose": 6,
    "test_scoring": 6,
    "test_taboo": 5,
    "test_cli": 5,
    "test_reliability": 5,
    "test_diagnose_math": 4,
    "test_lm_eval_tasks": 4,
    "test_multi_fidelity": 4,
    "test_stats": 4,
    "test_tcb": 3,
    "test_packing": 3,
    "test_score_out": 3,
    "test_extract_sandbox": 3,
    "test_prefix_cache": 3,
    "test_compare_records": 2,
    "test_untrusted_task_files": 2,
    "test_models": 2,
    "test_pmi": 2,
    "test_custom_tasks": 2,
    "test_docs": 2,
    "test_tasks_rte_mrpc": 1,
    "test_ensembles": 1,
    "test_dev_size_and_space_keys": 1,
}
LONG_SECONDS = {
    "test_lmeval_check": 300,  # with lm-eval installed (`make bench`): its own runs on real rows; skipped without
    "test_pmi_cards": 222,
    "test_reliability": 165,
    "test_calibrated_cards": 155,
    "test_full_disk": 148,
    "test_propose": 143,
    "test_gemma": 121,
    "test_faults": 121,
    "test_report": 72,
    "test_export": 68,
    "test_run_folders": 55,
    "test_docs": 52,
    "test_untrusted_task_files": 51,
    "test_gpu_check": 49,
    "test_compare": 45,
    "test_rule_registry": 44,
    "test_runner_floor": 40,
    "test_serve": 39,
    "test_progress": 37,
    "test_custom_tasks": 36,
    "test_scoring": 36,
    "test_robustness": 32,
    "test_stress_protocol": 31,
    "test_quantization": 27,
    "test_models": 25,
    "test_api": 24,
    "test_tcb": 16,
    "test_install": 14,
    "test_search": 14,
    "test_diagnose": 13,
    "test_ensembles": 12,
    "test_partial_scoring": 12,
    "test_serve_connections": 11,
    "test_table_sets": 11,
    "test_taboo": 11,
    "test_packing": 11,
    "test_batch_size": 9,
    "test_prefix_cache": 9,
}


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the order is for the tests that run
def pytest_collection_modifyitems(items):
    """Longest files first (see QUICK_SECONDS); within a file, the order it was written in. A file counts the
    seconds of the tiers it runs in: `-m long` counts a file's long tests only, `make test` its quick ones."""
    tiers = {(item.path.stem, item.get_closest_marker("long") is not None) for item in items}
    seconds = {
        stem: (QUICK_SECONDS.get(stem, 1) if (stem, False) in tiers else 0)
        + (LONG_SECONDS.get(stem, 1) if (stem, True) in tiers else 0)
        for stem, _ in tiers
    }
    items.sort(key=lambda item: -seconds[item.path.stem])  # sort is stable
