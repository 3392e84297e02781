"""Large vocabularies: δ_TCB's share of per-item scoring time and peak memory at Gemma-3-270M's 262,144-token
vocabulary (the real model, embedded: `--model gemma3-270m`) and at 128,256 (a 1B-class random-weight Llama-3.2-1B
configuration built here, no download), plus a two-trial search, its export and one served request on the 1B config,
each as the CLI runs it, with the peak RSS of each process.

    nice -n 10 python bench/bench_large_vocab.py [--items 16] [--dtype bfloat16] [--work DIR]

Per model, in a process of its own (so each peak RSS is that model's): N SST-2 test items scored with the task's own
prompt (a warm-up call first, then `--repeats` timed calls, the median kept); then, on the same items' critical hidden
states, the δ_TCB closed form given the logits (what scoring adds to the log-probs for δ_TCB: the runner computes
W·h once for both) and the logits alone. δ_TCB's share = its time per item / the scoring call's time per item (δ_TCB
included). The 1B config's tokenizer is SmolLM2's (ids below 49,152): the head, and so δ_TCB's cost, has all
128,256 rows. The 1B weights are written once to `--work` (bfloat16 on disk) and loaded in `--dtype`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

LLAMA_1B = {  # Llama-3.2-1B's shape: 1.24B parameters, tied embeddings
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
    "eos_token_id": 2,
    "pad_token_id": 2,
}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_llama(folder: Path) -> Path:
    """The random 1B config with SmolLM2's tokenizer, saved once (bfloat16 safetensors)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from promptopt.models.load import model_folder

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**LLAMA_1B), dtype=torch.bfloat16)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_folder("smollm2-135m-instruct")).save_pretrained(folder)
    return folder


def measure(spec: str, dtype: str, n_items: int, repeats: int) -> dict:
    """In this process: δ_TCB's share of scoring time on `spec`, and the process's peak RSS."""
    import torch

    from promptopt.models.load import ModelConfig
    from promptopt.scoring import Scorer
    from promptopt.tasks import load_task

    start = time.perf_counter()
    lm = ModelConfig(spec=spec, device="cpu", dtype=dtype).load()
    load_seconds = time.perf_counter() - start
    loaded_rss = peak_rss_mib()
    task = load_task("sst2")
    items, prompt = task.test[:n_items], task.default_prompt()
    scorer = Scorer(lm, task, batch_size=8)
    scorer.score(prompt, items[:2])  # warm-up: the prefix cache, the allocator, the head's statistics
    calls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        scorer.score(prompt, items)
        calls.append(time.perf_counter() - t0)
    tok = lm.tokenizer
    contexts = [prompt.context(i.question, i.choices) for i in items]
    label = prompt.choice_texts(items[0].choices)[0]
    requests = []
    for text in contexts:
        ids = tok(text)["input_ids"]
        requests.append((ids, tok(text + label)["input_ids"][len(ids) :][:1] or [0]))
    hidden = torch.stack([r.hidden for r in scorer.runner.loglikelihood(requests)]).to(lm.output_head.weight.device)
    head = lm.output_head
    targets = torch.tensor([r[1][0] for r in requests])
    tcb_times, logit_times = [], []
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            logits = head.logits_and_gain(hidden)
            logit_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            head(hidden, eps=1.0, target=targets, logits=logits)
            tcb_times.append(time.perf_counter() - t0)
    per_item = statistics.median(calls) / len(items)
    tcb = statistics.median(tcb_times) / len(items)
    return {
        "spec": spec,
        "dtype": dtype,
        "vocab": head.vocab_size,
        "hidden": head.hidden_size,
        "parameters": sum(p.numel() for p in lm.model.parameters()),
        "items": len(items),
        "load_seconds": load_seconds,
        "scoring_ms_per_item": per_item * 1e3,
        "tcb_ms_per_item": tcb * 1e3,
        "logits_ms_per_item": statistics.median(logit_times) / len(items) * 1e3,
        "tcb_share": tcb / per_item,
        "scoring_calls_s": calls,
        "rss_after_load_mib": loaded_rss,
        "peak_rss_mib": peak_rss_mib(),
        "threads": torch.get_num_threads(),
    }


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "promptopt", *args]


def timed_child(argv: list[str], env: dict | None = None) -> dict:
    """Run `argv` to its end; its seconds and peak RSS (wait4's rusage of that child alone)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate()
    return {
        "argv": argv[2:],
        "code": proc.returncode,
        "seconds": time.perf_counter() - start,
        "peak_rss_mib": _last_child_rss(proc.pid),
        "stderr_tail": err.strip().splitlines()[-1:] if proc.returncode else [],
        "stdout": out,
    }


_CHILD_RSS: dict[int, float] = {}


def _reap_hook() -> None:
    """Make subprocess reap children through os.wait4, keeping each child's peak RSS."""
    original = subprocess.Popen._try_wait

    def try_wait(self, wait_flags):
        try:
            pid, status, usage = os.wait4(self.pid, wait_flags)
        except ChildProcessError:
            return original(self, wait_flags)
        if pid:
            _CHILD_RSS[pid] = usage.ru_maxrss / 1024
        return pid, status

    subprocess.Popen._try_wait = try_wait


def _last_child_rss(pid: int) -> float:
    return _CHILD_RSS.get(pid, float("nan"))


def serve_once(card: Path, port: int, env: dict) -> dict:
    """`promptopt serve CARD`, one POST /v1/answer once it listens, then SIGINT; its seconds and peak RSS."""
    import signal

    import httpx

    start = time.perf_counter()
    proc = subprocess.Popen(
        cli("serve", str(card), "--device", "cpu", "--port", str(port), "--log-level", "warning"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    reply, latency = None, None
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        try:
            t0 = time.perf_counter()
            reply = httpx.post(
                f"http://127.0.0.1:{port}/v1/answer",
                json={"inputs": [{"question": "A tender, funny and wholly absorbing film."}]},
                timeout=600,
            )
            latency = time.perf_counter() - t0
            break
        except httpx.TransportError:
            time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    body = reply.json() if reply is not None else None
    return {
        "code": reply.status_code if reply is not None else None,
        "answer": (body or {}).get("answers", [{}])[0].get("answer") if body else None,
        "tcb": (body or {}).get("answers", [{}])[0].get("tcb") if body else None,
        "request_seconds": latency,
        "seconds": time.perf_counter() - start,
        "peak_rss_mib": _last_child_rss(proc.pid),
        "stderr_tail": err.strip().splitlines()[-2:] if reply is None else [],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=16, help="SST-2 test items scored per model")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16", help="the 1B config's dtype (float32 needs ~5 GB more)")
    parser.add_argument("--work", default="/tmp/promptopt-large-vocab", help="folder for the 1B weights and runs")
    parser.add_argument("--skip-search", action="store_true", help="only the δ_TCB shares")
    parser.add_argument("--out", help="write every number as JSON")
    parser.add_argument("--one", nargs=2, metavar=("SPEC", "DTYPE"), help=argparse.SUPPRESS)  # a child's job
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], args.one[1], args.items, args.repeats)))
        return
    _reap_hook()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH")])),
    }
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.perf_counter()
    llama = build_llama(work / "llama-1b-128k")
    build_seconds = time.perf_counter() - t0
    results: dict = {"started": started, "build_1b_seconds": build_seconds, "shares": [], "workflow": {}}
    for spec, dtype in (("gemma3-270m", "float32"), (str(llama), args.dtype)):
        child = timed_child(
            [
                sys.executable,
                __file__,
                "--one",
                spec,
                dtype,
                "--items",
                str(args.items),
                "--repeats",
                str(args.repeats),
            ],
            env=env,
        )
        if child["code"] != 0:
            print(f"{spec}: failed: {child['stderr_tail']}", file=sys.stderr)
            continue
        row = json.loads(child["stdout"].strip().splitlines()[-1])
        row["process_peak_rss_mib"] = child["peak_rss_mib"]
        results["shares"].append(row)
    if not args.skip_search:
        run, card = work / "search", work / "card.yaml"
        search = timed_child(
            cli(
                "search", "--task", "sst2", "--model", str(llama), "--dtype", args.dtype, "--device", "cpu",
                "--trials", "2", "--dev-limit", "4", "--test-limit", "4", "--minibatch", "4", "--out", str(run),
                "--quiet", "--search-suite", "none",
            ),
            env=env,
        )  # fmt: skip
        results["workflow"]["search"] = search
        export = timed_child(cli("export", str(run), "--out", str(card), "--quiet"), env=env)
        results["workflow"]["export"] = export
        if export["code"] == 0:
            results["workflow"]["serve"] = serve_once(card, 8791, env)
    print(
        f"large vocabularies on the CPU, started {started} ({results['shares'][0]['threads'] if results['shares'] else '?'} threads)"
    )
    print(
        "| model | V | d | params | dtype | scoring ms/item | δ_TCB ms/item | logits ms/item | δ_TCB share | peak RSS |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results["shares"]:
        print(
            f"| {Path(r['spec']).name} | {r['vocab']:,} | {r['hidden']} | {r['parameters'] / 1e9:.2f}B | {r['dtype']} | "
            f"{r['scoring_ms_per_item']:.0f} | {r['tcb_ms_per_item']:.1f} | {r['logits_ms_per_item']:.1f} | "
            f"{r['tcb_share'] * 100:.1f}% | {r['process_peak_rss_mib'] / 1024:.2f} GiB |"
        )
    for step, r in results["workflow"].items():
        extra = (
            f", answer {r.get('answer')!r}, request {r.get('request_seconds') or float('nan'):.1f} s"
            if step == "serve"
            else ""
        )
        status = "ok" if r.get("code") in (0, 200) else f"FAILED {r.get('stderr_tail')}"
        print(f"1B config, {step}: {status}, {r['seconds']:.0f} s, peak RSS {r['peak_rss_mib'] / 1024:.2f} GiB{extra}")
    if args.out:
        from promptopt.yamlio import atomic_write_text

        atomic_write_text(args.out, json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
