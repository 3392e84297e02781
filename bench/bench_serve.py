"""`promptopt serve` against the scorer, on the same inputs, in one run (the embedded model, SST-2 test items, CPU).

[1] The scorer: the card's answers for N inputs in one call (scoring/card_answers.py's answer_table, what export
    measured and verify re-scores), items per second; measured before and after the server runs, both printed.
[2] The server: the same N inputs sent as N single-input HTTP requests (httpx against uvicorn on a loopback port,
    the real app: batching, limits, JSON) by C concurrent clients, C = 1, 8, 32: requests per second and the p50 /
    p95 latency of a request. The target: at C = 32, at least 0.8x the scorer's items per second.

Both share one loaded model and one runner (its prefix cache warm for both after a warm-up call).

    .venv/bin/python bench/bench_serve.py        # BENCH_ITEMS=64, BENCH_CARD=<a card> (default: SST-2's own prompt)
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/serve_helpers.py: uvicorn in a thread

ITEMS = int(os.environ.get("BENCH_ITEMS", "64"))
CONCURRENCY = (1, 8, 32)


def _card(lm, folder: Path) -> Path:
    """SST-2's default prompt as a card (export's own builder on a few items), unless BENCH_CARD names one."""
    if os.environ.get("BENCH_CARD"):
        return Path(os.environ["BENCH_CARD"])
    from promptopt.experiments import Session
    from promptopt.experiments.export import build_card
    from promptopt.experiments.formats import card_yaml
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig

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


def _scorer_rate(server, items) -> float:
    from promptopt.scoring.card_answers import answer_table

    start = time.perf_counter()
    answer_table(server.scorer, server.members, items)
    return len(items) / (time.perf_counter() - start)


async def _load(url: str, questions: list[str], concurrency: int) -> tuple[float, list[float]]:
    import httpx

    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(question: str) -> None:
            async with gate:
                start = time.perf_counter()
                response = await client.post("/v1/answer", json={"question": question})
                latencies.append(time.perf_counter() - start)
                response.raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(one(q) for q in questions))
        return time.perf_counter() - start, latencies


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> None:
    import torch

    from promptopt.models import load_model
    from promptopt.production import Server
    from promptopt.serving.app import ServeSettings, create_app
    from promptopt.tasks import load_task
    from tests.serve_helpers import running

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 2))))
    lm = load_model("smollm2-135m-instruct", device="cpu")
    items = load_task("sst2").test[:ITEMS]
    with tempfile.TemporaryDirectory() as folder:
        server = Server(_card(lm, Path(folder)), lm=lm)
    settings = ServeSettings(max_batch=32, max_wait_ms=5, rate=1e6, burst=10**6)
    _scorer_rate(server, items[:8])  # warm-up: the output head's one-time statistics, the prefix cache
    before = _scorer_rate(server, items)
    rows = []
    app = create_app(server, settings)
    with running(app) as url:
        asyncio.run(_load(url, [i.question for i in items[:4]], 1))  # warm-up over HTTP
        for concurrency in CONCURRENCY:
            wall, latencies = asyncio.run(_load(url, [i.question for i in items], concurrency))
            rows.append((concurrency, len(items) / wall, _p(latencies, 0.5), _p(latencies, 0.95)))
    after = _scorer_rate(server, items)
    scorer = statistics.mean([before, after])
    print(
        f"{ITEMS} SST-2 test items, card {server.identity['decision']} on {server.identity['model']}, CPU threads "
        f"{torch.get_num_threads()}"
    )
    print(
        f"scorer (answer_table, one call): {before:.2f} items/s before the server runs, {after:.2f} after; mean {scorer:.2f}"
    )
    print(f"{'concurrency':>11}  {'requests/s':>10}  {'x scorer':>8}  {'p50 s':>7}  {'p95 s':>7}")
    for concurrency, rate, p50, p95 in rows:
        print(f"{concurrency:>11}  {rate:>10.2f}  {rate / scorer:>8.2f}  {p50:>7.3f}  {p95:>7.3f}")
    at32 = rows[-1][1] / scorer
    print(
        f"target: >= 0.8x the scorer's items/s at concurrency 32: {at32:.2f}x ({'met' if at32 >= 0.8 else 'NOT met'})"
    )
    print(f"batches (requests answered per pass over the model: how many passes): {app.state.batcher.stats.as_dict()}")


if __name__ == "__main__":
    main()
