"""`promptopt serve` against the scorer, on the same inputs, in one run (the embedded model, SST-2 test items, CPU).

[1] The scorer: the card's answers for N inputs in one call (scoring/card_answers.py's answer_table, what export
    measured and verify re-scores), items per second; measured just before and just after each server run (the
    machine's speed drifts by ±10% within a minute), and each server rate is divided by the geometric mean of the
    two: the paired ratio, its median over rounds and the median's interval printed.
[2] The server: the same N inputs sent as N single-input HTTP requests by C keep-alive connections (`_load`: a lean
    client in its own process, as clients are, against uvicorn on a loopback port: the real app, batching, limits,
    JSON), C = 1, 8, 32: requests per second and the p50 / p95 latency of a request, how the requests were grouped
    into passes over the model, and the client's share of the CPU. The target: at C = 32, at least 0.9x the
    scorer's items per second. Beside it, the ceiling at C clients: the scorer given the same inputs C at a time
    (all that C clients keep in flight), paired the same way.
[3] One request's latency: for L inputs, each answered by a direct `Server.answer` call (the runtime, no HTTP) and
    by one HTTP request (httpx, in this process: an ordinary client, its cost counted), alternating; the ratio of
    the HTTP time to the direct time per input, its median printed. The target: at most 1.5x.

Both share one loaded model and one runner (its prefix cache warm for both after a warm-up call).

    .venv/bin/python bench/bench_serve.py   # BENCH_ITEMS=64 BENCH_ROUNDS=2 BENCH_SINGLE=8, BENCH_CARD=<a card>
                                            # (default: SST-2's own)
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/serve_helpers.py: uvicorn in a thread

from verdict import verdict  # noqa: E402  (bench/verdict.py: the script's own folder is on the path)

ITEMS = int(os.environ.get("BENCH_ITEMS", "64"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
SINGLE = int(os.environ.get("BENCH_SINGLE", "8"))
CONCURRENCY = (1, 8, 32)


def _card(lm, folder: Path) -> Path:
    """SST-2's default prompt as a card (export's own builder on a few items), unless BENCH_CARD names one."""
    if os.environ.get("BENCH_CARD"):
        return Path(os.environ["BENCH_CARD"])
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig
    from promptopt.workflows.export import build_card
    from promptopt.workflows.formats import card_yaml
    from promptopt.workflows.session import Session

    session = Session(
        model=ModelConfig(spec="smollm2-135m-instruct", device="cpu"),
        data=DataConfig(task="sst2", dev_limit=2, test_limit=2),
    )
    from promptopt.scoring import Scorer

    session.__dict__["scorer"] = Scorer(lm, session.data)  # the session's scorer on the loaded model: one model
    card = build_card(
        session, session.data.default_prompt(), dev_items=session.items("dev"), test_items=session.items("test")
    )
    path = folder / "card.yaml"
    path.write_text(card_yaml(card))
    return path


def _scorer_rate(server, items, window: int | None = None) -> float:
    """The scorer's items/s on `items` in one call, or in calls of `window` items (what a server whose clients keep
    `window` requests in flight can batch at most: its ceiling)."""
    from promptopt.scoring.card_answers import answer_table

    window = window or len(items)
    start = time.perf_counter()
    for at in range(0, len(items), window):
        answer_table(server.scorer, server.members, items[at : at + window])
    return len(items) / (time.perf_counter() - start)


def _load_elsewhere(url: str, questions: list[str], concurrency: int) -> tuple[float, list[float], float]:
    """`_load` run in its own process, as a server's clients are: their work then competes with the server for
    the machine's cores (its CPU seconds are reported) but not for the server's interpreter lock."""
    import json
    import subprocess

    done = subprocess.run(
        [sys.executable, __file__, "--load", url, str(concurrency)],
        input=json.dumps(questions),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the load client failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    wall, latencies, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    return wall, latencies, cpu


async def _load(url: str, questions: list[str], concurrency: int) -> tuple[float, list[float], float]:
    """Wall seconds, each request's latency, and the client's own CPU seconds, for `questions` sent one per
    request over `concurrency` keep-alive connections, each sending its next request when its answer is read.

    A lean HTTP/1.1 client on asyncio streams (a load generator, like wrk): on this 2-core machine the clients
    share the server's cores, and httpx spends ~4 ms of CPU a request (0.08 ms here; measured against the server
    with a model-free runtime), which at 32 clients took ~5% of the machine from the model. The connections are
    opened before the clock starts: what is timed is answering, not TCP set-up."""
    import json

    host, port = url.removeprefix("http://").rsplit(":", 1)
    waiting = list(reversed(questions))
    latencies: list[float] = []
    connections = [await asyncio.open_connection(host, int(port)) for _ in range(concurrency)]

    async def client(reader, writer) -> None:
        while waiting:
            body = json.dumps({"question": waiting.pop()}).encode()
            head = f"POST /v1/answer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            start = time.perf_counter()
            writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            status, length = await reader.readline(), None
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                length = int(value) if name.strip().lower() == "content-length" else length
            if length is None:  # the server's answers always carry one; without it the connection cannot go on
                raise RuntimeError(f"{status.decode().strip()}: an answer without Content-Length")
            answer = await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            if status.split()[1:2] != [b"200"]:
                raise RuntimeError(f"{status.decode().strip()}: {answer.decode()[:300]}")

    cpu, start = time.process_time(), time.perf_counter()
    try:
        await asyncio.gather(*(client(reader, writer) for reader, writer in connections))
    finally:
        for _, writer in connections:
            writer.close()
    return time.perf_counter() - start, latencies, time.process_time() - cpu


def _single_latency(url: str, server, questions: list[str]) -> list[tuple[float, float]]:
    """(direct Server.answer seconds, HTTP request seconds) per question, the two alternating in order."""
    import httpx

    from promptopt.serving.inputs import Input

    pairs = []
    with httpx.Client(base_url=url, timeout=600) as client:
        client.post("/v1/answer", json={"question": questions[0]}).raise_for_status()  # the connection, warm
        for k, question in enumerate(questions):
            times = {}
            for how in ("direct", "http") if k % 2 == 0 else ("http", "direct"):
                start = time.perf_counter()
                if how == "direct":
                    server.answer([Input(question)])
                else:
                    client.post("/v1/answer", json={"question": question}).raise_for_status()
                times[how] = time.perf_counter() - start
            pairs.append((times["direct"], times["http"]))
    return pairs


def _passes(before: dict, after: dict) -> str:
    """Requests per pass over the model between two snapshots of the batcher's stats, as 'size x count'."""
    counts = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    return " ".join(f"{k}x{v}" for k, v in sorted(counts.items(), key=lambda kv: int(kv[0])))


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> None:
    import torch

    from promptopt.models import load_model
    from promptopt.serving import Server
    from promptopt.serving.app import ServeSettings, create_app
    from promptopt.tasks import load_task
    from tests.serve_helpers import running

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 2))))
    lm = load_model("smollm2-135m-instruct", device="cpu")
    items = load_task("sst2").test[:ITEMS]
    with tempfile.TemporaryDirectory() as folder:
        server = Server(_card(lm, Path(folder)), lm=lm)
    settings = ServeSettings(max_batch=32, max_wait_ms=5, rate=1e6, burst=10**6)
    server.warm()  # as `promptopt serve` does
    _scorer_rate(server, items[:8])  # warm-up: the output head's one-time statistics, the prefix cache
    app = create_app(server, settings)
    questions = [i.question for i in items]
    scorer_rates, windowed, server_rows = [], [], {c: [] for c in CONCURRENCY}
    passes = {c: [] for c in CONCURRENCY}
    singles: list[tuple[float, float]] = []
    stats = app.state.batcher.stats
    with running(app) as url:
        _load_elsewhere(url, questions[:4], 1)  # warm-up over HTTP
        for r in range(ROUNDS):  # the machine's speed drifts: each level is paired with the scorer around it
            for concurrency in CONCURRENCY if r % 2 == 0 else CONCURRENCY[::-1]:
                one_call = _scorer_rate(server, items)
                if concurrency == 32:  # the ceiling at 32 clients: the scorer in windows of 32, paired the same way
                    in_windows = _scorer_rate(server, items, 32)
                before, busy = dict(stats.as_dict()["requests_per_call"]), stats.busy_seconds
                wall, latencies, client_cpu = _load_elsewhere(url, questions, concurrency)
                shapes = _passes(before, stats.as_dict()["requests_per_call"])
                passes[concurrency].append(
                    f"{shapes} (worker busy {(stats.busy_seconds - busy) / wall:.0%} of the wall, client CPU "
                    f"{client_cpu / wall:.0%})"
                )
                if concurrency == 32:  # after the server too, in the mirrored order: the drift cancels to first order
                    in_windows = math.sqrt(in_windows * _scorer_rate(server, items, 32))
                one_call = math.sqrt(one_call * _scorer_rate(server, items))
                scorer_rates.append(one_call)
                if concurrency == 32:
                    windowed.append((one_call, in_windows))
                rate = len(items) / wall
                server_rows[concurrency].append((rate, rate / one_call, _p(latencies, 0.5), _p(latencies, 0.95)))
            singles += _single_latency(url, server, questions[r * SINGLE : (r + 1) * SINGLE] or questions[:SINGLE])
    print(
        f"{ITEMS} SST-2 test items, card {server.identity['decision']} on {server.identity['model']}, CPU threads "
        f"{torch.get_num_threads()}, {ROUNDS} rounds (medians)"
    )
    print(
        f"scorer (answer_table, one call; each the geometric mean of the runs just before and just after a server "
        f"run): {', '.join(f'{v:.2f}' for v in scorer_rates)} items/s; "
        f"median {statistics.median(scorer_rates):.2f}"
    )
    print(f"{'concurrency':>13}  {'requests/s':>10}  {'x scorer':>8}  {'p50 s':>7}  {'p95 s':>7}   (x scorer: paired)")
    for label, rows in server_rows.items():
        rate, ratio, p50, p95 = (statistics.median(column) for column in zip(*rows))
        print(f"{label!s:>13}  {rate:>10.2f}  {ratio:>8.2f}  {p50:>7.3f}  {p95:>7.3f}")
    for concurrency, shapes in passes.items():
        print(f"passes at concurrency {concurrency} (requests in a pass x passes), by round: {' | '.join(shapes)}")
    ratios = [ratio for _, ratio, _, _ in server_rows[32]]
    print(
        f"at concurrency 32, x the scorer's items/s: {statistics.median(ratios):.3f}x, rounds "
        f"{', '.join(f'{v:.2f}' for v in ratios)} ({verdict(ratios, 0.9)})"
    )
    of_windowed = [row[0] / w for row, (_, w) in zip(server_rows[32], windowed)]
    print(
        f"at concurrency 32 against the scorer in windows of 32 inputs (at most 32 are in flight): "
        f"{statistics.median(of_windowed):.2f}x, rounds {', '.join(f'{v:.2f}' for v in of_windowed)}; the scorer in "
        f"windows of 32 ran at {statistics.median(w / one for one, w in windowed):.2f}x its one-call rate"
    )
    direct, http = (statistics.median(column) for column in zip(*singles))
    per_input = [h / d for d, h in singles]
    print(
        f"one request: direct Server.answer p50 {direct:.3f} s, over HTTP p50 {http:.3f} s ({len(singles)} inputs, "
        f"alternating); HTTP / direct {statistics.median(per_input):.2f}x, median of per-input ratios, range "
        f"{min(per_input):.2f}-{max(per_input):.2f} ({verdict(per_input, 1.5, at_most=True)})"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--load"]:  # the client process of `_load_elsewhere`
        import json

        print(json.dumps(asyncio.run(_load(sys.argv[2], json.loads(sys.stdin.read()), int(sys.argv[3])))))
    else:
        main()
