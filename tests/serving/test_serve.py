"""The real server on the embedded model, driven over HTTP by a real client (httpx against uvicorn on a free
loopback port): its answers equal the scorer's on 50 SST-2 test items (the card's answers as export measured them,
scoring/card_answers.py), concurrent requests are batched and each is answered in its own order, bad requests get
one JSON 4xx line each and the server keeps serving, a key-protected server answers 401 without the key; an adaptive
batch rule decides each request on its own batch (a single input on the stored bias); the fragility flag reads the
card's threshold; a generative card is generated and read as the scorer does."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import yaml

from tests.serve_helpers import running

pytestmark = pytest.mark.slow
N = 50
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def card_path(tmp_path_factory, embedded_lm):
    """SST-2's default prompt with one shot as a card (argmax), built by export's own builder, with a fragility
    section (δ_TCB below 3.0) written in by hand: the flag's mechanics, not its choice, are tested here."""
    from promptopt.card import field_hashes
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig
    from promptopt.workflows.export import build_card
    from promptopt.workflows.formats import card_yaml
    from promptopt.workflows.session import Session

    session = Session(
        model=ModelConfig(spec="smollm2-135m-instruct", device="cpu"),
        data=DataConfig(task="sst2", dev_limit=4, test_limit=4),
    )
    prompt = session.data.default_prompt()
    prompt = prompt.with_(exemplars=prompt.exemplars[:1])
    card = build_card(session, prompt, dev_items=session.items("dev"), test_items=session.items("test"))
    card["fragility"] = _fragility_section(3.0)
    card["check"]["fields_sha256"] = field_hashes(card)  # sealed again, as export seals what it writes
    path = tmp_path_factory.mktemp("serve") / "card.yaml"
    path.write_text(card_yaml(card))
    return path


def _fragility_section(threshold: float) -> dict:
    side = {"n": 4, "flipped": 1, "flip_rate": 0.25, "flip_rate_ci95": [0.05, 0.7]}
    stats = {"flagged_share": 0.5, "flagged": side, "unflagged": side, "gap": 0.0, "auroc": 0.5}
    signals = {
        name: {"direction": "above" if name == "entropy" else "below", "threshold": threshold, **stats}
        for name in ("tcb", "margin", "top_prob", "entropy")
    }
    dev = {"n": 8, "n_with_variants": 8, "suite": "cheap", "suite_sha256": "0" * 64, "flip": "x", "basis": "x"}
    return {
        "signal": "tcb",
        "direction": "below",
        "threshold": threshold,
        "flag_rate": 0.5,
        "chosen_by": "by hand (test)",
        "dev": dev,
        "signals": signals,
    }


@pytest.fixture(scope="module")
def server(card_path, embedded_lm):
    from promptopt.serving import Server  # the lazy export

    return Server(card_path, lm=embedded_lm)


@pytest.fixture(scope="module")
def items():
    from promptopt.tasks import load_task

    return load_task("sst2").test[:N]


@pytest.fixture(scope="module")
def reference(server, items):
    """The card's answers as export measured them and verify re-scores them: one call of answer_table."""
    from promptopt.scoring.card_answers import answer_table

    return answer_table(server.scorer, server.members, items)


def _same(answer: dict, row) -> None:
    assert answer["index"] == int(row["pred"])
    assert answer["answer"] == ("negative", "positive")[int(row["pred"])]
    np.testing.assert_allclose(list(answer["label_logprobs"].values()), row["choice_logprobs"], atol=2e-4)
    np.testing.assert_allclose(answer["tcb"], row["tcb"], rtol=2e-3)
    assert answer["flagged"] == (row["tcb"] < 3.0)
    assert answer["flag"] == {"signal": "tcb", "value": answer["tcb"], "threshold": 3.0, "direction": "below"}


@pytest.mark.long
def test_the_server_answers_as_the_scorer_on_50_items_batched_and_in_order(server, items, reference):
    import httpx

    from promptopt.serving.app import ServeSettings, create_app
    from promptopt.serving.inputs import Limits

    app = create_app(
        server, ServeSettings(max_batch=16, max_wait_ms=200, rate=1000, burst=1000, limits=Limits(max_inputs=8))
    )
    singles, batches = items[:25], [items[25 + 5 * k : 30 + 5 * k] for k in range(5)]

    async def ask(url):
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            one = [client.post("/v1/answer", json={"question": i.question}) for i in singles]
            many = [client.post("/v1/answer", json={"inputs": [{"question": i.question} for i in b]}) for b in batches]
            responses = await asyncio.gather(*one, *many)
            health = await client.get("/healthz")
        return responses, health

    with running(app) as url:
        responses, health = asyncio.run(ask(url))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    rows = reference.set_index("item_id")
    answered = 0
    for item, response in zip(singles, responses[:25]):
        body = response.json()
        assert body["card"] == server.identity and body["card"]["task"] == "sst2"
        _same(body, rows.loc[item.id])
        assert "batch_adaptive" not in body  # an argmax card re-estimates nothing
        answered += 1
    for batch, response in zip(batches, responses[25:]):
        answers = response.json()["answers"]
        assert len(answers) == len(batch)
        for item, answer in zip(batch, answers):  # each request's answers in its own order
            _same(answer, rows.loc[item.id])
            answered += 1
    assert answered == N
    stats = health.json()["batching"]
    assert max(int(k) for k in stats["requests_per_call"]) > 1, stats  # concurrent requests shared a pass
    assert all(int(k) <= 16 for k in stats["inputs_per_call"]), stats
    assert sum(int(k) * v for k, v in stats["inputs_per_call"].items()) == N


def test_a_warmed_server_answers_one_input_behind_the_cached_prompt(server, items, reference):
    """After `warm` the card's few-shot block is cached; a lone input runs behind it (no new cache slot for its
    whole context) and is answered as the scorer answered it in a batch."""
    server.warm()
    slots = list(server.scorer.runner._prefixes)
    assert slots
    (answer,) = server.answer([{"question": items[7].question}])
    assert list(server.scorer.runner._prefixes) == slots
    _same(answer, reference.set_index("item_id").loc[items[7].id])


def test_bad_requests_get_one_json_line_each_and_the_server_keeps_serving(server, items, reference):
    import httpx

    from promptopt.serving.app import ServeSettings, create_app
    from promptopt.serving.inputs import Limits

    settings = ServeSettings(max_body_bytes=300_000, rate=1000, burst=1000, limits=Limits(max_chars=250_000))
    app = create_app(server, settings)
    overflow = " ".join(f"w{k}" for k in range(12_000))  # past the model's 8192 tokens once rendered
    cases = [
        ({"json": {"text": "hello"}}, 400, "request.text: unknown field"),
        ({"json": {}}, 400, "request.question: missing"),
        ({"json": {"question": ["a"]}}, 400, "request.question: expected a string, got array"),
        ({"json": {"inputs": [{"question": "ok"}, {"question": 7}]}}, 400, "inputs[1].question: expected a string"),
        ({"content": b'{"question": "x"', "headers": JSON}, 400, "not valid JSON"),
        ({"content": b"{" + b" " * 400_000 + b"}", "headers": JSON}, 413, "over this server's limit of 300,000 bytes"),
        ({"json": {"inputs": [{"question": "a"}] * 40}}, 413, "40 inputs, over this server's limit of 32"),
        ({"json": {"question": overflow}}, 422, "takes 8192"),
        ({"json": {"question": "fine", "choices": ["good", "bad"]}}, 400, "fixed choices"),
    ]
    with running(app) as url:
        for kwargs, status, fragment in cases:
            response = httpx.post(f"{url}/v1/answer", timeout=300, **kwargs)
            text = response.text
            assert response.status_code == status, text
            assert "\n" not in text.strip() and "Traceback" not in text and 'File "' not in text
            body = json.loads(text)
            assert body["error"]["status"] == status and fragment in body["error"]["message"], body
        good = httpx.post(f"{url}/v1/answer", json={"question": items[0].question}, timeout=300)
    assert good.status_code == 200
    _same(good.json(), reference.set_index("item_id").loc[items[0].id])


def test_an_input_too_long_in_a_pass_gets_its_422_and_the_other_requests_are_answered(server, items, reference):
    """The pass itself finds the input that does not fit (its tokenization comes before any forward); that request
    gets one 422 naming the input, and the others are answered as the scorer answered them."""
    from promptopt.serving.inputs import Input, InputError

    overflow = " ".join(f"w{k}" for k in range(12_000))  # past the model's 8192 tokens once rendered
    groups = [
        [Input(items[0].question)],
        [Input(items[1].question), Input(overflow)],
        [Input(i.question) for i in items[2:4]],
    ]
    out = server.answer_groups(groups)
    assert isinstance(out[1], InputError) and out[1].status == 422
    assert str(out[1]).startswith("inputs[1]: ") and "takes 8192" in str(out[1]), str(out[1])
    expected = reference.set_index("item_id")
    for answers, given in ((out[0], items[:1]), (out[2], items[2:4])):
        for answer, item in zip(answers, given, strict=True):
            _same(answer, expected.loc[item.id])


def test_with_a_key_a_request_without_it_gets_401(server):
    import httpx

    from promptopt.serving.app import ServeSettings, create_app

    key = "k3y-for-the-test-0123456789"
    with running(create_app(server, ServeSettings(api_key=key, rate=1000, burst=1000))) as url:
        assert httpx.post(f"{url}/v1/answer", json={"question": "good"}).status_code == 401
        assert (
            httpx.post(f"{url}/v1/answer", json={"question": "good"}, headers={"X-API-Key": "nope"}).status_code == 401
        )
        ok = httpx.post(f"{url}/v1/answer", json={"question": "good"}, headers={"Authorization": f"Bearer {key}"})
    assert ok.status_code == 200 and ok.json()["answer"] in ("negative", "positive")


@pytest.mark.long
def test_an_adaptive_batch_rule_decides_each_request_on_its_own_batch(card_path, embedded_lm, items):
    """Two requests answered in one pass: 16 inputs (re-estimated bias) and 1 input (the stored bias), each exactly
    as the scorer decides those items alone."""
    from promptopt.card import field_hashes
    from promptopt.decision import rule_from_card
    from promptopt.scoring.calibration import DecidingScorer
    from promptopt.serving import Server
    from promptopt.serving.inputs import Input

    card = yaml.safe_load(card_path.read_text())
    card["decision"] = {
        "rule": "batch",
        "reading": "acc",
        "mode": "adaptive",
        "min_batch": 16,
        "labels": ["negative", "positive"],
        "bias": [1.5, -1.5],  # a stored bias far from any batch's: the two paths must differ
    }
    card["check"]["fields_sha256"] = field_hashes(card)
    server = Server(card, lm=embedded_lm)
    rule = rule_from_card(card["decision"])
    batch, single = items[:16], items[16]
    answers = server.answer_groups([[Input(i.question) for i in batch], [Input(single.question)]])
    prompt = server.members[0].prompt
    expect_batch = DecidingScorer(server.scorer, rule).score(prompt, batch).table
    expect_single = DecidingScorer(server.scorer, rule).score(prompt, [single]).table
    for answer, (_, row) in zip(answers[0], expect_batch.iterrows()):
        assert answer["batch_adaptive"] == {"batch_size": 16, "min_batch": 16, "bias": "batch"}  # it says so
        assert answer["index"] == int(row["pred"])
        np.testing.assert_allclose(list(answer["decision_scores"].values()), row["decision_scores"], atol=2e-4)
    (answer,) = answers[1]
    assert answer["batch_adaptive"] == {"batch_size": 1, "min_batch": 16, "bias": "stored"}
    assert answer["index"] == int(expect_single["pred"].iloc[0])
    np.testing.assert_allclose(
        list(answer["decision_scores"].values()), expect_single["decision_scores"].iloc[0], atol=2e-4
    )
    stored = rule.scores(list(answer["label_logprobs"].values()))  # the stored bias
    np.testing.assert_allclose(list(answer["decision_scores"].values()), stored, atol=1e-6)
    import httpx

    from promptopt.serving.app import ServeSettings, create_app

    with running(create_app(server, ServeSettings(rate=1000, burst=1000))) as url:  # over HTTP, as a client reads it
        many = httpx.post(f"{url}/v1/answer", json={"inputs": [{"question": i.question} for i in batch]}, timeout=600)
        one = httpx.post(f"{url}/v1/answer", json={"question": single.question}, timeout=600)
    assert [a["batch_adaptive"]["bias"] for a in many.json()["answers"]] == ["batch"] * 16
    assert [a["index"] for a in many.json()["answers"]] == [a["index"] for a in answers[0]]
    assert one.json()["batch_adaptive"] == {"batch_size": 1, "min_batch": 16, "bias": "stored"}
    assert one.json()["card"]["decision"] == "batch-adaptive"
    first = answers[0][0]  # the batch's own bias, not the stored one
    assert not np.allclose(
        list(first["decision_scores"].values()), rule.scores(list(first["label_logprobs"].values())), atol=1e-3
    )


def test_requests_decided_together_in_one_pass_equal_each_request_answered_alone(card_path, embedded_lm, items):
    """A rule that does not adapt to its batch (stored batch calibration: δ_TCB read on the shifted distribution)
    decides the whole pass at once: three requests of 5, 1 and 3 inputs answered in one pass equal each request
    answered alone and the scorer's decided table of those items, answer, scores and δ_TCB."""
    from promptopt.card import field_hashes
    from promptopt.decision import rule_from_card
    from promptopt.scoring.calibration import DecidingScorer
    from promptopt.serving import Server
    from promptopt.serving.inputs import Input

    card = yaml.safe_load(card_path.read_text())
    card["decision"] = {
        "rule": "batch",
        "reading": "acc",
        "mode": "stored",
        "labels": ["negative", "positive"],
        "bias": [0.8, -0.8],
    }
    card["check"]["fields_sha256"] = field_hashes(card)
    server = Server(card, lm=embedded_lm)
    groups = [items[20:25], items[25:26], items[26:29]]
    together = server.answer_groups([[Input(i.question) for i in g] for g in groups])
    rule = rule_from_card(card["decision"])
    expect = DecidingScorer(server.scorer, rule).score(server.members[0].prompt, items[20:29]).table
    assert set(expect["tcb_basis"]) == {"calibrated"}
    flat = [answer for answers in together for answer in answers]
    for answer, (_, row) in zip(flat, expect.iterrows(), strict=True):
        assert answer["index"] == int(row["pred"]) and "batch_adaptive" not in answer
        np.testing.assert_allclose(list(answer["decision_scores"].values()), row["decision_scores"], atol=2e-4)
        np.testing.assert_allclose(answer["tcb"], row["tcb"], rtol=1e-3)
    for group, answers in zip(groups, together):
        alone = server.answer([Input(i.question) for i in group])
        assert [a["index"] for a in alone] == [a["index"] for a in answers]
        np.testing.assert_allclose([a["tcb"] for a in alone], [a["tcb"] for a in answers], rtol=1e-3)


def test_a_generative_card_is_generated_and_read_as_the_scorer_does(tiny_llama_dir, tmp_path):
    from promptopt.models import ModelConfig
    from promptopt.serving import Server
    from promptopt.tasks import DataConfig
    from promptopt.workflows.export import build_card
    from promptopt.workflows.formats import card_yaml
    from promptopt.workflows.session import Session

    session = Session(
        model=ModelConfig(spec=str(tiny_llama_dir), device="cpu"),
        data=DataConfig(task="basic_arithmetic", dev_limit=2, test_limit=3),
    )
    card = build_card(
        session, session.data.default_prompt(), dev_items=session.items("dev"), test_items=session.items("test")
    )
    path = tmp_path / "gen.yaml"
    path.write_text(card_yaml(card))
    server = Server(path, device="cpu")
    items = session.items("test")
    answers = server.answer([{"question": i.question} for i in items])
    expected = session.scorer.score(session.data.default_prompt(), items).table
    for answer, (_, row) in zip(answers, expected.iterrows()):
        assert answer["output"] == row["output"] and answer["answer"] == (row["pred"] or None)
        assert answer["label_logprobs"] is None and answer["flagged"] is None
        np.testing.assert_allclose(answer["signals"]["tcb"], row["tcb"], rtol=1e-3)
    with pytest.raises(Exception, match="has no choices"):
        server.answer([{"question": "1+1", "choices": ["1", "2"]}])


def _sixteen_and_one(url: str, odd: bytes):
    """16 ordinary requests and one with body `odd`, sent at once (the batcher waits long enough to take all 17 in
    one pass): the responses, the odd one last, and the batching stats."""
    import httpx

    async def ask():
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            ordinary = [client.post("/v1/answer", json={"question": f"a gorgeous film, take {k}"}) for k in range(16)]
            responses = await asyncio.gather(*ordinary, client.post("/v1/answer", content=odd, headers=JSON))
            return responses, (await client.get("/healthz")).json()["batching"]

    return asyncio.run(ask())


def test_a_lone_surrogate_fails_its_own_request_never_the_16_batched_with_it(server, monkeypatch):
    """`{"question": "good \\ud800 film"}` is valid JSON, but no tokenizer takes a lone surrogate (the real one
    raises TypeError). It is a 400 naming the field before it reaches the batcher; and with that check switched
    off, the pass it shares with 16 other requests pins it on that input (422) and answers the 16."""
    from promptopt.serving import inputs
    from promptopt.serving.app import ServeSettings, create_app

    odd = b'{"question": "good \\ud800 film"}'
    settings = ServeSettings(max_batch=32, max_wait_ms=500, rate=1000, burst=1000)
    with running(create_app(server, settings)) as url:
        responses, _ = _sixteen_and_one(url, odd)
    assert [r.status_code for r in responses] == [200] * 16 + [400], [r.text for r in responses]
    assert responses[-1].json()["error"]["message"] == (
        "request.question: a lone surrogate (\\ud800) at character 5; expected Unicode text"
    )
    monkeypatch.setattr(inputs, "_unicode", lambda text, where: None)  # as if the check missed it
    with running(create_app(server, settings)) as url:
        responses, batching = _sixteen_and_one(url, odd)
    assert batching["requests_per_call"].get("17") == 1, batching  # all 17 in one pass
    assert [r.status_code for r in responses] == [200] * 16 + [422], [r.text for r in responses]
    assert responses[-1].json()["error"]["message"] == (
        "request: the model's tokenizer cannot take this input (TypeError)"
    )
    assert all(r.json()["answer"] in ("negative", "positive") for r in responses[:16])
