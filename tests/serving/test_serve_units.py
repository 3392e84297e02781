"""The serving pieces that need no model: request parsing and its one-line errors, the fragility signals and the
flag, the API key and bind checks, the rate limit, the batcher (batches form under concurrency, each request gets
its own answers in order, a failing batch is a 500 and the server goes on), the fragility threshold placed on dev
answers, and the risk–coverage numbers on a table whose answers are known. The HTTP app runs under uvicorn with a
stand-in runtime (tests/serving/test_serve.py drives the real one on the embedded model)."""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pandas as pd
import pytest

from promptopt.errors import UserError
from promptopt.serving.inputs import Input, InputError, Limits, parse_request
from promptopt.serving.security import KeyCheck, RateLimit, check_bind, is_loopback, read_api_key
from promptopt.serving.signals import BY_NAME, Flag, flag_from_card, threshold_between


# --- requests --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body, status, fragment",
    [
        ({}, 400, "request.question: missing"),
        ({"question": 3}, 400, "request.question: expected a string, got number"),
        ({"question": "  "}, 400, "non-empty"),
        ({"question": "x", "extra": 1}, 400, "request.extra: unknown field"),
        ({"question": "x" * 101}, 413, "101 characters, over this server's limit of 100"),
        ({"inputs": "x"}, 400, "inputs: expected an array"),
        ({"inputs": []}, 400, "at least one input"),
        ({"inputs": [{"question": "a"}] * 5}, 413, "5 inputs, over this server's limit of 4"),
        ({"inputs": [{"question": "a"}, {"question": None}]}, 400, "inputs[1].question: expected a string, got null"),
        ({"inputs": [{"question": "a"}], "x": 1}, 400, "x: unknown field beside inputs"),
        ([1], 400, "expected a JSON object, got array"),
        ({"question": "a", "choices": ["only"]}, 400, "at least 2 choices"),
        ({"question": "a", "choices": ["a", 2]}, 400, "expected an array of strings"),
    ],
)
def test_a_bad_request_is_one_error_naming_the_field(body, status, fragment):
    with pytest.raises(InputError) as caught:
        parse_request(body, Limits(max_inputs=4, max_chars=100), needs_choices=False)
    assert caught.value.status == status and fragment in str(caught.value)


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b'{"question": "good \\ud800 film"}', "request.question: a lone surrogate (\\ud800) at character 5"),
        (b'{"inputs": [{"question": "a"}, {"question": "b", "choices": ["x", "\\udfff"]}]}', "inputs[1].choices[1]:"),
        (b'{"question": "a", "\\ud83d": 1}', "request body: a lone surrogate"),  # a key
        (b'{"question": "a", "n": ' + b"7" * 100_000 + b"}", "a number of 100,000 characters (at most 100)"),
        (b'{"question": "a", "n": 0.' + b"5" * 200 + b"}", "a number of 202 characters"),
        (b'{"question": "a gorgeous, witty film", "question": "dull and lifeless"}', "'question' appears twice"),
        (b'{"inputs": [{"question": "a", "choices": ["x", "y"], "choices": ["y", "x"]}]}', "'choices' appears twice"),
        (b'{"question": "a", "n": NaN}', "NaN is not JSON"),
        (b'{"question": "a", "n": Infinity}', "Infinity is not JSON"),
        (b'{"question": "a", "n": -Infinity}', "-Infinity is not JSON"),
        (b'{"question": "a", "n": 1e999}', "the number '1e999' is out of range"),
        (b'{"question": "\xff"}', "not UTF-8"),
        ('{"question": "a"}'.encode("utf-16"), "not UTF-8"),  # json.loads(bytes) would take it
        (b"  ", "empty"),
    ],
)
def test_every_json_oddity_is_one_400_naming_it(body, fragment):
    from promptopt.serving.inputs import parse_json_body

    with pytest.raises(InputError) as caught:
        parse_json_body(body)
    assert caught.value.status == 400 and fragment in str(caught.value), str(caught.value)
    str(caught.value).encode("utf-8")  # the message itself is sendable (the surrogate quoted, not copied)


def test_ordinary_json_parses_as_json_does():
    from promptopt.serving.inputs import parse_json_body

    body = b'{"question": "caf\\u00e9 \\ud83d\\ude00", "n": -12, "x": 1.5e3, "l": [true, null]}'
    assert parse_json_body(body) == json.loads(body)


def test_good_requests_parse_into_inputs():
    limits = Limits()
    assert parse_request({"question": "q"}, limits, needs_choices=False) == ([Input("q")], False)
    inputs, batch = parse_request(
        {"inputs": [{"question": "a", "choices": ["x", "y"]}, {"question": "b", "choices": ["u", "v", "w"]}]},
        limits,
        needs_choices=True,
    )
    assert batch and inputs == [Input("a", ("x", "y")), Input("b", ("u", "v", "w"))]
    with pytest.raises(InputError, match="request.choices: missing"):
        parse_request({"question": "q"}, limits, needs_choices=True)


# --- signals and the flag --------------------------------------------------------------------------------------
def test_the_flag_reads_its_direction_and_flags_missing_values():
    low = Flag(BY_NAME["tcb"], 1.0)
    assert low(0.5) and not low(1.0) and not low(math.inf) and low(float("nan")) and low(None)
    high = Flag(BY_NAME["entropy"], 2.0)
    assert high(2.5) and not high(2.0)
    assert BY_NAME["tcb"].combine([3.0, 1.0, 2.0]) == 1.0 and BY_NAME["entropy"].combine([3.0, 1.0]) == 3.0
    assert BY_NAME["tcb"].fragility(math.inf) == -math.inf and BY_NAME["tcb"].fragility(float("nan")) == math.inf
    assert threshold_between(1.0, 100.0, "tcb") == pytest.approx(10.0)  # geometric for δ_TCB
    assert threshold_between(1.0, 3.0, "margin") == 2.0


def test_a_cards_flag_section_is_checked():
    card = {"fragility": {"signal": "margin", "direction": "below", "threshold": 0.5}}
    flag = flag_from_card(card)
    assert flag.signal.name == "margin" and flag.threshold == 0.5
    assert flag_from_card({}) is None
    with pytest.raises(UserError, match="fragility.direction"):
        flag_from_card({"fragility": {"signal": "margin", "direction": "above", "threshold": 0.5}})
    with pytest.raises(UserError, match="unknown signal"):
        flag_from_card({"fragility": {"signal": "vibes", "threshold": 0.5}})


# --- who may ask -----------------------------------------------------------------------------------------------
def test_loopback_addresses_and_the_bind_check():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.4", "10.0.0.1", "example.org"))
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", "k" * 16)
    with pytest.raises(UserError, match="not a loopback address, and no API key"):
        check_bind("0.0.0.0", None)


def test_the_api_key_comes_from_a_file_or_the_environment(tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret-key-of-enough-length\n")
    assert read_api_key(key, environ={}) == "s3cret-key-of-enough-length"
    assert read_api_key(None, environ={"PROMPTOPT_API_KEY": "  env-key-0123456789  "}) == "env-key-0123456789"
    assert read_api_key(None, environ={}) is None
    key.write_text("short\n")
    with pytest.raises(UserError, match="5 characters; use at least 16"):
        read_api_key(key, environ={})
    with pytest.raises(UserError, match="cannot read it"):
        read_api_key(tmp_path / "missing", environ={})
    with pytest.raises(UserError, match="empty"):
        read_api_key(None, environ={"PROMPTOPT_API_KEY": " "})


def test_the_key_check_takes_either_header_and_nothing_else():
    check = KeyCheck("correct-horse-battery")
    assert check({"authorization": "Bearer correct-horse-battery"})
    assert check({"x-api-key": "correct-horse-battery"})
    assert not check({"authorization": "Bearer correct-horse-batter"})
    assert not check({"authorization": "Basic correct-horse-battery"})
    assert not check({})
    assert "correct" not in repr(check)


def test_the_rate_limit_is_a_bucket_per_client():
    now = [0.0]
    limit = RateLimit(rate=2.0, burst=3, clock=lambda: now[0])
    assert [limit.allow("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limit.allow("a") == pytest.approx(0.5)
    assert limit.allow("b") == 0.0  # another client has its own bucket
    now[0] = 0.5  # one token back
    assert limit.allow("a") == 0.0 and limit.allow("a") > 0
    # a request's inputs (spend): the balance may go below zero, down to -burst; allow then waits for it to refill
    assert limit.allow("c") == 0.0 and limit.spend("c", 4) == 0.0  # 3 - 1 - 4 = -2
    assert limit.allow("c") == pytest.approx(1.5)  # back to 1 token at 2 a second
    now[0] = 2.0  # -2 + 3 = 1
    assert limit.allow("c") == 0.0 and limit.spend("c", 3) == 0.0  # 1 - 1 - 3 = -3 = -burst
    now[0] = 4.0  # -3 + 4 = 1: two requests let in at once, before either body is read
    assert limit.allow("c") == 0.0 and limit.spend("c", 2) == 0.0  # -2
    assert limit.spend("c", 2) == pytest.approx(1.5)  # -4 is below -burst: refused, nothing taken, 1 token away
    assert limit.allow("c") == pytest.approx(1.5)


# --- batching ---------------------------------------------------------------------------------------------------
class FakeRuntime:
    """answer_groups echoes each input's question and its batch; `fail` makes the next call raise."""

    def __init__(self):
        self.calls, self.fail = [], False
        self.identity, self.limits, self.needs_choices = {"card_sha256": "f" * 64}, Limits(max_inputs=4), False

    def answer_groups(self, groups):
        import time

        self.calls.append([len(g) for g in groups])
        if self.fail:
            self.fail = False
            raise RuntimeError("boom: secret detail")
        if any(i.question == "poison" for inputs in groups for i in inputs):  # breaks any pass it is in
            raise TypeError("boom: an input the model cannot take")
        time.sleep(0.05)  # the model's time: requests queue meanwhile
        out = []
        for inputs in groups:
            if any(i.question == "bad" for i in inputs):
                out.append(InputError("inputs[0]: too long for the model", 422))
            else:
                out.append([{"answer": i.question, "group_size": len(inputs)} for i in inputs])
        return out


def test_the_batcher_batches_concurrent_requests_and_answers_each_in_order():
    from promptopt.serving.batcher import Batcher

    runtime = FakeRuntime()

    async def main():
        batcher = Batcher(runtime.answer_groups, max_batch=6, max_wait=0.05)
        await batcher.start()
        requests = [[Input(f"r{r}-{k}") for k in range(1 + r % 3)] for r in range(12)]
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
        bad = await asyncio.gather(batcher.submit([Input("bad")]), return_exceptions=True)
        runtime.fail = True
        failed = await asyncio.gather(batcher.submit([Input("x")]), return_exceptions=True)
        after = await batcher.submit([Input("still")])
        await batcher.stop()
        return requests, results, bad, failed, after, batcher.stats

    requests, results, bad, failed, after, stats = asyncio.run(main())
    for request, result in zip(requests, results):
        assert [a["answer"] for a in result] == [i.question for i in request]
        assert all(a["group_size"] == len(request) for a in result)  # each request decided as its own batch
    assert max(len(c) for c in runtime.calls[:-3]) > 1  # several requests in one call
    assert all(sum(c) <= 6 for c in runtime.calls)  # never over max_batch
    assert isinstance(bad[0], InputError) and bad[0].status == 422
    assert isinstance(failed[0], RuntimeError)
    assert after == [{"answer": "still", "group_size": 1}]
    assert max(int(k) for k in stats.as_dict()["requests_per_call"]) > 1
    assert stats.busy_seconds >= 0.05 * (len(runtime.calls) - 1) * 0.9  # every call but the failing one slept 0.05 s


# --- the app under uvicorn, with the stand-in runtime ----------------------------------------------------------
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def fake_app_url():
    from promptopt.serving.app import ServeSettings, create_app
    from tests.serve_helpers import running

    runtime = FakeRuntime()
    settings = ServeSettings(max_batch=8, max_body_bytes=2_000, rate=1000, burst=1000, limits=Limits(max_inputs=4))
    app = create_app(runtime, settings)
    with running(app) as url:
        yield url, runtime, app


def test_a_request_that_breaks_the_pass_fails_alone_and_the_others_batched_with_it_are_answered():
    """16 requests and one whose input breaks any pass it is in (the runtime cannot pin it on the input): the
    pass of 17 fails, each request is answered in a pass of its own, and only that one gets the 500."""
    import httpx

    from promptopt.serving.app import ServeSettings, create_app
    from tests.serve_helpers import running

    runtime = FakeRuntime()
    settings = ServeSettings(max_batch=32, max_wait_ms=500, rate=1000, burst=1000, limits=Limits(max_inputs=4))

    async def ask(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            ordinary = [client.post("/v1/answer", json={"question": f"q{k}"}) for k in range(16)]
            return await asyncio.gather(*ordinary, client.post("/v1/answer", json={"question": "poison"}))

    with running(create_app(runtime, settings)) as url:
        responses = asyncio.run(ask(url))
    assert runtime.calls[0] == [1] * 17  # all 17 shared the first pass
    assert [r.status_code for r in responses] == [200] * 16 + [500], [r.text for r in responses]
    assert [r.json()["answer"] for r in responses[:16]] == [f"q{k}" for k in range(16)]
    assert responses[-1].json()["error"]["message"] == "internal error (logged on the server)"


def test_the_app_answers_in_one_json_line_and_every_error_is_one_json_line(fake_app_url):
    import httpx

    url, runtime, app = fake_app_url
    ok = httpx.post(f"{url}/v1/answer", json={"question": "hello"})
    assert ok.status_code == 200 and ok.json()["answer"] == "hello" and ok.json()["card"] == runtime.identity
    batch = httpx.post(f"{url}/v1/answer", json={"inputs": [{"question": "a"}, {"question": "b"}]})
    assert [a["answer"] for a in batch.json()["answers"]] == ["a", "b"]
    cases = [
        (httpx.post, "/v1/answer", {"content": b"{not json", "headers": JSON}, 400, "not valid JSON"),
        (
            httpx.post,
            "/v1/answer",
            {"content": b"x" * 3_000, "headers": JSON},
            413,
            "over this server's limit of 2,000 bytes",
        ),
        (httpx.post, "/v1/answer", {"json": {"question": "bad"}}, 422, "request: too long for the model"),
        (httpx.post, "/v1/answer", {"json": {"text": "x"}}, 400, "request.text: unknown field"),
        (
            httpx.post,
            "/v1/answer",
            {"content": b'{"question": "good \\ud800 film"}', "headers": JSON},
            400,
            "surrogate",
        ),
        (httpx.post, "/v1/answer", {"content": b'{"question": "a", "question": "b"}', "headers": JSON}, 400, "twice"),
        (httpx.post, "/v1/answer", {"content": b'{"question": "a", "n": NaN}', "headers": JSON}, 400, "NaN"),
        (httpx.post, "/v1/answer", {"content": b'{"question": "a", "n": Infinity}', "headers": JSON}, 400, "Infinity"),
        (httpx.post, "/v1/answer", {"content": b'{"n": ' + b"9" * 1_500 + b"}", "headers": JSON}, 400, "1,500 char"),
        (httpx.get, "/v1/answer", {}, 405, "method not allowed"),
        (httpx.get, "/nothing", {}, 404, "not found"),
    ]
    runtime_fail = (httpx.post, "/v1/answer", {"json": {"question": "x"}}, 500, "internal error")
    for method, path, kwargs, status, fragment in [*cases, runtime_fail]:
        if status == 500:
            runtime.fail = True
        response = method(f"{url}{path}", **kwargs)
        text = response.text
        assert response.status_code == status, text
        assert "\n" not in text.strip() and "Traceback" not in text and "boom" not in text
        body = json.loads(text)
        assert set(body) == {"error", "card"} and body["error"]["status"] == status
        assert fragment in body["error"]["message"]
    assert httpx.post(f"{url}/v1/answer", json={"question": "after"}).json()["answer"] == "after"
    health = httpx.get(f"{url}/healthz").json()
    assert health["status"] == "ok" and health["batching"]["calls"] >= 4


def test_a_server_with_a_key_answers_401_without_it():
    import httpx

    from promptopt.serving.app import ServeSettings, create_app
    from tests.serve_helpers import running

    key = "a-long-enough-test-key"
    app = create_app(FakeRuntime(), ServeSettings(api_key=key, rate=1000, burst=1000, limits=Limits(max_inputs=4)))
    with running(app) as url:
        for headers in ({}, {"Authorization": "Bearer wrong-key-of-some-length"}, {"X-API-Key": key[:-1]}):
            for response in (
                httpx.get(f"{url}/healthz", headers=headers),
                httpx.post(f"{url}/v1/answer", json={"question": "x"}, headers=headers),
            ):
                assert response.status_code == 401 and set(response.json()) == {"error"}
        assert httpx.get(f"{url}/healthz", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        answered = httpx.post(f"{url}/v1/answer", json={"question": "x"}, headers={"X-API-Key": key})
        assert answered.status_code == 200 and answered.json()["answer"] == "x"


def test_the_rate_limit_answers_429_with_retry_after():
    import httpx

    from promptopt.serving.app import ServeSettings, create_app
    from tests.serve_helpers import running

    app = create_app(FakeRuntime(), ServeSettings(rate=0.01, burst=2, limits=Limits(max_inputs=2)))
    with running(app) as url:
        codes = [httpx.get(f"{url}/healthz").status_code for _ in range(3)]
        limited = httpx.get(f"{url}/healthz")
    assert codes == [200, 200, 429] and limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1


def test_the_rate_limit_weighs_a_request_by_its_inputs():
    """Counted in inputs (the default), a client sending batches of 4 spends 4 tokens a request: with a burst of 10
    its fourth request is 429 (its balance at -2, 3 tokens from the next), while another address sending single
    inputs is served; counted in requests the same client sends 10 batches (40 inputs) before its first 429."""
    import httpx

    from promptopt.serving.app import ServeSettings, create_app
    from tests.serve_helpers import running

    batch = {"inputs": [{"question": f"q{k}"} for k in range(4)]}

    def statuses(settings, n=11):
        with running(create_app(FakeRuntime(), settings)) as url:
            heavy = [httpx.post(f"{url}/v1/answer", json=batch) for _ in range(n)]
            other = httpx.Client(base_url=url, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
            with other:
                light = [other.post("/v1/answer", json={"question": "mine"}).status_code for _ in range(8)]
        return heavy, light

    settings = ServeSettings(rate=0.01, burst=10, limits=Limits(max_inputs=4))
    assert settings.rate_unit == "inputs"
    heavy, light = statuses(settings)
    assert [r.status_code for r in heavy] == [200] * 3 + [429] * 8
    assert light == [200] * 8  # another address has its own bucket, spent one input at a time
    assert heavy[3].json()["error"]["message"] == "rate limit: 0.01 inputs per second per client (bursts of 10)"
    assert 299 <= int(heavy[3].headers["retry-after"]) <= 301  # from -2 to 1 at 0.01 a second
    heavy, _ = statuses(ServeSettings(rate=0.01, burst=10, limits=Limits(max_inputs=4), rate_unit="requests"))
    assert [r.status_code for r in heavy] == [200] * 10 + [429]
    with pytest.raises(ValueError, match="exceeds burst"):
        ServeSettings(burst=8, limits=Limits(max_inputs=16))


def test_serve_refuses_a_public_address_without_a_key_before_loading_anything(tmp_path):
    from tests.clirun import promptopt

    card = tmp_path / "card.yaml"
    card.write_text("promptopt_card: 2\n")  # never read: the bind check comes first
    result = promptopt("serve", card, "--host", "0.0.0.0", env={"PROMPTOPT_API_KEY": ""})
    assert result.returncode == 2 and "API key is empty" in result.stderr
    result = promptopt("serve", card, "--host", "0.0.0.0")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: --host 0.0.0.0: not a loopback")
    assert "--api-key " not in promptopt("serve", "--help").stdout  # the key is never a command-line value


# --- the fragility threshold on dev answers --------------------------------------------------------------------
def _dev_answers(n=20, seed=0):
    rng = np.random.default_rng(seed)
    tcb = np.sort(rng.uniform(0.5, 50, n))
    flipped = np.zeros(n, dtype=bool)
    flipped[:4] = True  # the four smallest δ_TCB flip
    return pd.DataFrame(
        {
            "item_id": [f"i{k}" for k in range(n)],
            "n_variants": [0] + [2] * (n - 1),  # the first answer had no variant: it counts for the share only
            "flipped": pd.array([pd.NA, *flipped[1:]], dtype="boolean"),
            "tcb": tcb,
            "margin": rng.uniform(0, 5, n),
            "top_prob": rng.uniform(0.3, 1, n),
            "entropy": rng.uniform(0, 3, n),
        }
    )


def test_the_threshold_flags_the_asked_share_and_its_flip_rates_are_counted():
    from promptopt.workflows.export.fragility import place_threshold, signal_stats

    answers = _dev_answers()
    tau = place_threshold(answers["tcb"].tolist(), BY_NAME["tcb"], 0.25)
    assert (answers["tcb"] < tau).sum() == 5 and answers["tcb"][4] < tau < answers["tcb"][5]
    stats = signal_stats(answers, BY_NAME["tcb"], tau)
    assert stats["flagged_share"] == 0.25
    assert stats["flagged"]["n"] == 4 and stats["flagged"]["flipped"] == 3  # answer 0 has no variant
    assert stats["unflagged"]["flipped"] == 0 and stats["gap"] == pytest.approx(0.75)
    low, high = stats["flagged"]["flip_rate_ci95"]
    assert low < 0.75 < high
    with pytest.raises(UserError, match="at least 2"):
        place_threshold([1.0], BY_NAME["tcb"], 0.5)


def test_the_signal_with_the_largest_dev_gap_is_chosen(monkeypatch):
    from promptopt.robustness.suite import load_suite
    from promptopt.workflows.export import fragility

    answers = _dev_answers()
    monkeypatch.setattr(fragility, "dev_answers", lambda *a, **k: answers)
    suite = load_suite("cheap")
    section = fragility.fragility_section(None, [object()], [], fragility.FlagRequest(rate=0.25), suite=suite)
    assert section["signal"] == "tcb" and section["direction"] == "below"
    assert "largest dev flip-rate gap" in section["chosen_by"] and "no test number was read" in section["chosen_by"]
    assert set(section["signals"]) == {"tcb", "margin", "top_prob", "entropy"}
    named = fragility.fragility_section(
        None, [object()], [], fragility.FlagRequest(rate=0.25, signal="entropy"), suite=suite
    )
    assert named["signal"] == "entropy" and named["direction"] == "above"
    with pytest.raises(UserError, match="between 0 and 1"):
        fragility.FlagRequest(rate=1.5)


def _no_signal_separates(n=50):
    """Dev answers where every signal's most fragile fifth flips less often than the rest (the finding: margin
    chosen at 0.20 vs 0.26): the 10 most fragile answers by every signal flip 2 times, the other 40 10 times."""
    fragile = np.arange(n) < 10
    flipped = np.zeros(n, dtype=bool)
    flipped[:2] = True
    flipped[10:20] = True
    return pd.DataFrame(
        {
            "item_id": [f"i{k}" for k in range(n)],
            "n_variants": [2] * n,
            "flipped": pd.array(flipped, dtype="boolean"),
            "tcb": np.where(fragile, 1.0, 10.0) + np.arange(n) * 1e-3,
            "margin": np.where(fragile, 0.1, 3.0) + np.arange(n) * 1e-3,
            "top_prob": np.where(fragile, 0.4, 0.9) + np.arange(n) * 1e-4,
            "entropy": np.where(fragile, 2.0, 0.2) - np.arange(n) * 1e-3,
        }
    )


def test_a_flag_no_signal_separates_on_dev_is_warned_in_the_card(monkeypatch):
    from promptopt.robustness.suite import load_suite
    from promptopt.workflows.export import fragility

    monkeypatch.setattr(fragility, "dev_answers", lambda *a, **k: _no_signal_separates())
    suite = load_suite("cheap")
    section = fragility.fragility_section(None, [object()], [], fragility.FlagRequest(rate=0.2), suite=suite)
    assert all(s["gap"] < 0 for s in section["signals"].values())
    chosen = section["signals"][section["signal"]]
    assert (chosen["flagged"]["flip_rate"], chosen["unflagged"]["flip_rate"]) == (0.2, 0.25)
    warning = section["warning"]
    assert warning.startswith("no signal separates flips on dev: at a 20% flag rate under suite cheap")
    assert "20.0% vs 25.0%" in warning and "\n" not in warning
    # a separating signal: no warning; one named that does not separate while another does: said so
    monkeypatch.setattr(fragility, "dev_answers", lambda *a, **k: _dev_answers())
    assert "warning" not in fragility.fragility_section(
        None, [object()], [], fragility.FlagRequest(rate=0.25), suite=suite
    )
    named = fragility.fragility_section(None, [object()], [], fragility.FlagRequest(0.25, "entropy"), suite=suite)
    if named["signals"]["entropy"]["gap"] <= 0:
        assert named["warning"].startswith("the flag's signal entropy does not separate flips on dev")


# --- risk–coverage ---------------------------------------------------------------------------------------------
def _items(n=40, seed=1):
    """A compare-like items table: answer k's clean δ_TCB is k+1; the 8 smallest flip under an unseen family;
    margin is noise; every answer is right except the 4 smallest δ_TCB."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n):
        base = {
            "strategy": "accuracy",
            "seed": 0,
            "item_id": f"i{k}",
            "clean_prediction": "1",
            "clean_correct": k >= 4,
            "clean_tcb": float(k + 1),
            "clean_margin": float(rng.uniform(0, 5)),
            "clean_top_prob": float(rng.uniform(0.3, 1)),
            "clean_entropy": float(rng.uniform(0, 3)),
        }
        flips = k < 8
        rows.append({**base, "family": None, "seen": None, "perturbed_prediction": None, "perturbed_correct": None})
        rows.append(
            {
                **base,
                "family": "distractor",
                "seen": False,
                "perturbed_prediction": "0" if flips else "1",
                "perturbed_correct": (k >= 4) != flips,
            }
        )
    return pd.DataFrame(rows)


def test_risk_coverage_keeps_the_least_fragile_answers():
    from promptopt.analyses.risk_coverage import risk_coverage

    table = risk_coverage(_items(), n_boot=200, label="synthetic")
    tcb = table[table["signal"] == "tcb"].set_index("coverage")
    assert tcb.loc[1.0, "flip_rate"] == pytest.approx(8 / 40) and tcb.loc[1.0, "accuracy"] == pytest.approx(36 / 40)
    assert tcb.loc[0.8, "n_kept"] == 32 and tcb.loc[0.8, "flip_rate"] == 0.0 and tcb.loc[0.8, "accuracy"] == 1.0
    assert tcb.loc[0.9, "flip_rate"] == pytest.approx(4 / 36)
    margin = table[table["signal"] == "margin"].set_index("coverage")
    assert margin.loc[0.8, "flip_rate_minus_tcb"] > 0  # noise keeps flipping answers that δ_TCB drops
    assert (table["flip_rate_ci_low"] <= table["flip_rate"] + 1e-12).all()
    assert (table["flip_rate"] <= table["flip_rate_ci_high"] + 1e-12).all()


def test_the_risk_coverage_command_writes_its_table_and_plot(tmp_path):
    from tests.clirun import promptopt

    run = tmp_path / "run"
    run.mkdir()
    _items().to_parquet(run / "robustness_items.parquet")
    (run / "summary.json").write_text(json.dumps({"task": "sst2"}))
    result = promptopt("diagnose", "risk-coverage", run, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(tmp_path / "out" / "risk_coverage.csv")
    assert set(table["signal"]) == {"tcb", "margin", "top_prob", "entropy"} and set(table["source"]) == {"sst2"}
    assert (tmp_path / "out" / "risk_coverage.png").read_bytes()[:4] == b"\x89PNG"
    missing = promptopt("diagnose", "risk-coverage", tmp_path / "nothing")
    assert missing.returncode == 2 and missing.stderr.startswith("error:")


def test_the_cards_threshold_is_checked_on_the_compares_test_answers():
    from promptopt.workflows.export.fragility import check_on_test

    items = _items()  # δ_TCB k+1; the 8 smallest flip under an unseen family
    seen = items[items["family"].notna()].assign(family="synonym", seen=True, perturbed_prediction="0")
    items = pd.concat([items, seen], ignore_index=True)  # flips under a seen family do not count
    section = {
        "signal": "tcb",
        "threshold": 4.5,  # flags answers 0..3
        "signals": {"tcb": {"flagged": {"flip_rate": 1.0}, "unflagged": {"flip_rate": 0.5}}},
    }
    test = check_on_test(items, section)
    assert test["n"] == 40 and test["flagged_share"] == pytest.approx(0.1)
    assert test["flagged"]["flipped"] == 4 and test["flagged"]["n"] == 4
    assert test["unflagged"]["flipped"] == 4 and test["unflagged"]["n"] == 36
    assert test["dev_flip_rate_inside"] == {"flagged": True, "unflagged": False}


def test_the_test_check_reads_only_the_cards_own_answers():
    from promptopt.workflows.export.fragility import answers_match

    items = _items().assign(clean_scores=[[0.1, 0.9]] * 80)
    table = pd.DataFrame(
        {"item_id": [f"i{k}" for k in range(40)], "pred": [1] * 40, "decision_scores": [[0.1, 0.9]] * 40}
    )
    assert answers_match(items, table)
    assert not answers_match(items, table.assign(pred=[0] + [1] * 39))  # another prompt's answers
    assert not answers_match(items, table.assign(decision_scores=[[0.2, 0.8]] * 40))
    assert not answers_match(None, table) and not answers_match(items, table.assign(item_id="other"))


def test_the_report_shows_risk_coverage_where_answers_under_perturbation_exist():
    from types import SimpleNamespace

    from promptopt.report.risk import risk_section

    html = risk_section(SimpleNamespace(items=_items()), n_boot=100)
    assert 'id="risk-coverage-table"' in html and "data:image/png;base64," in html
    assert html.count('data-signal="tcb"') == 4 and "δ_TCB" in html
    assert "nothing to flag" in risk_section(SimpleNamespace(items=None))


def test_a_table_without_signals_is_one_error_not_an_empty_table():
    from types import SimpleNamespace

    from promptopt.analyses.risk_coverage import risk_coverage
    from promptopt.report.risk import risk_section

    bare = _items().drop(columns=["clean_tcb", "clean_margin", "clean_top_prob", "clean_entropy"])
    with pytest.raises(UserError, match="no answer carries a signal"):
        risk_coverage(bare, n_boot=10)
    assert "no answer carries a signal" in risk_section(SimpleNamespace(items=bare))


def test_the_server_is_exported_lazily_and_loading_a_card_stays_torch_free():
    import subprocess
    import sys

    code = (
        "import sys, promptopt.production as p, promptopt.serving; "
        "print('torch' in sys.modules, 'fastapi' in sys.modules); "
        "print(p.Server.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "promptopt.serving.runtime"]
