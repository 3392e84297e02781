"""`export --flag-rate R` end to end on a tiny model: the card's fragility threshold is placed on the dev answers
under the search suite, recorded for every signal with its flip rates, valid against the card schema, and read by
the runtime; bad flag options are one `error:` line."""

from __future__ import annotations

import pytest

from tests.clirun import promptopt

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_run(tiny_llama_dir, tmp_path_factory):
    from promptopt.study import SearchConfig, run_search

    config = SearchConfig.build(
        task="sst2",
        trials=3,
        model=str(tiny_llama_dir),
        out=str(tmp_path_factory.mktemp("flag") / "run"),
        dev_limit=8,
        test_limit=4,
        minibatch=4,
        device="cpu",
        incumbent="none",  # cards of searched trials and ensembles of them (an ensemble needs two finished trials)
        scan="off",
    )
    run_search(config, show_progress=False)
    return config.out


def test_export_records_a_threshold_chosen_on_dev_and_the_server_reads_it(tiny_run, tmp_path):
    from promptopt.production import load_prompt
    from promptopt.serving import Server
    from promptopt.serving.signals import flag_from_card
    from promptopt.tasks import load_task
    from promptopt.workflows.export import export_run

    path = tmp_path / "card.yaml"
    card = export_run(tiny_run, out=path, flag_rate=0.25).card
    section = card["fragility"]
    assert load_prompt(path).card["fragility"] == section  # schema-valid as written
    assert section["flag_rate"] == 0.25 and section["dev"]["n"] == 8 and section["dev"]["suite"] == "cheap"
    assert set(section["signals"]) == {"tcb", "margin", "top_prob", "entropy"}
    chosen = section["signals"][section["signal"]]
    assert chosen["threshold"] == section["threshold"] and chosen["direction"] == section["direction"]
    for stats in section["signals"].values():
        assert 0 < stats["flagged_share"] <= 0.25  # 2 of 8 answers, fewer where values tie at the threshold
        assert stats["flagged"]["n"] + stats["unflagged"]["n"] == section["dev"]["n_with_variants"]
    assert "test" not in section  # a search run has no compare answers to check it on
    assert "no test number was read" in section["chosen_by"] or "no dev answer flipped" in section["chosen_by"]
    server = Server(path, device="cpu")
    flag = flag_from_card(card)
    dev = load_task("sst2").dev[:8]
    for answer in server.answer([{"question": i.question} for i in dev]):
        assert answer["flagged"] == flag(answer["signals"][flag.signal.name])
        assert answer["flag"]["threshold"] == section["threshold"]
    named = export_run(tiny_run, out=tmp_path / "entropy.yaml", flag_rate=0.5, flag_signal="entropy").card
    assert named["fragility"]["signal"] == "entropy" and named["fragility"]["chosen_by"].startswith("named with")


def test_export_warns_when_no_signal_separates_flips_on_dev(tiny_run, tmp_path, monkeypatch):
    """`export --flag-rate 0.2` once chose margin although every signal's flagged answers flipped less often than
    the unflagged ones on dev, and said nothing: the card records one warning line and export returns it."""
    from promptopt.production import load_prompt
    from promptopt.workflows.export import export_run, fragility
    from tests.serving.test_serve_units import _no_signal_separates

    monkeypatch.setattr(fragility, "dev_answers", lambda *a, **k: _no_signal_separates())
    path = tmp_path / "card.yaml"
    exported = export_run(tiny_run, out=path, flag_rate=0.2)
    warning = exported.card["fragility"]["warning"]
    assert load_prompt(path).card["fragility"]["warning"] == warning  # schema-valid, and hashed with the section
    assert f"fragility flag: {warning}" in exported.warnings


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--flag-rate", "1.5"], "--flag-rate 1.5: expected a share of dev answers between 0 and 1"),
        (["--flag-signal", "margin"], "--flag-signal needs --flag-rate"),
        (["--flag-rate", "0.2", "--flag-signal", "vibes"], "unknown signal 'vibes'"),
    ],
)
def test_bad_flag_options_are_one_error(tiny_run, tmp_path, args, fragment):
    result = promptopt("export", tiny_run, "--out", tmp_path / "x.yaml", *args)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and fragment in result.stderr, result.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_an_ensemble_card_is_served_as_answer_table_combines_it(tiny_run, tmp_path):
    """Two members (the card's prompt, and the same with its exemplars reversed): the answers, δ_TCB (the minimum
    over members) and each member's label log-likelihoods are those of scoring/card_answers.py's answer_table."""
    import numpy as np
    import yaml

    from promptopt.card import field_hashes
    from promptopt.scoring.card_answers import answer_table, card_members
    from promptopt.serving import Server
    from promptopt.tasks import load_task
    from promptopt.workflows.export import export_run

    card = export_run(tiny_run, out=tmp_path / "one.yaml").card
    first = {k: card[k] for k in ("instruction", "template", "exemplars")}
    second = {**first, "exemplars": list(reversed(card["exemplars"])), "instruction": "Classify the sentiment."}
    card["ensemble"] = {"members": [first, second], "aggregation": "mean_normalized_scores"}
    card["check"]["fields_sha256"] = field_hashes(card)  # an ensemble built by hand, sealed as export seals one
    path = tmp_path / "ensemble.yaml"
    path.write_text(yaml.safe_dump(card, sort_keys=False, allow_unicode=True))
    server = Server(path, device="cpu")
    items = load_task("sst2").test[:6]
    answers = server.answer([{"question": i.question} for i in items])
    expected = answer_table(server.scorer, card_members(card), items)
    assert server.identity["decision"].startswith("ensemble of 2")
    for answer, (_, row) in zip(answers, expected.iterrows()):
        assert answer["index"] == int(row["pred"])
        np.testing.assert_allclose(answer["tcb"], row["tcb"], rtol=1e-3)
        assert isinstance(answer["label_logprobs"], list) and len(answer["label_logprobs"]) == 2
        np.testing.assert_allclose(list(answer["decision_scores"].values()), row["decision_scores"], atol=1e-4)
    # three requests answered in one pass: each as the one request above answered its inputs
    from promptopt.serving.inputs import Input

    together = server.answer_groups([[Input(i.question) for i in g] for g in (items[:2], items[2:3], items[3:])])
    flat = [a for group in together for a in group]
    assert [a["index"] for a in flat] == [a["index"] for a in answers]
    np.testing.assert_allclose([a["tcb"] for a in flat], [a["tcb"] for a in answers], rtol=1e-3)


def test_an_ensemble_cards_threshold_reads_its_most_fragile_member(tiny_run, tmp_path):
    from promptopt.serving import Server
    from promptopt.workflows.export import export_run

    card = export_run(tiny_run, out=tmp_path / "ens.yaml", ensemble=2, flag_rate=0.25).card
    section = card["fragility"]
    assert len(card["ensemble"]["members"]) == 2 and "most fragile member" in section["dev"]["basis"]
    assert section["dev"]["n"] == 8 and set(section["signals"]) == {"tcb", "margin", "top_prob", "entropy"}
    (answer,) = Server(tmp_path / "ens.yaml", device="cpu").answer([{"question": "a fine film"}])
    assert answer["flag"]["signal"] == section["signal"] and isinstance(answer["flagged"], bool)
