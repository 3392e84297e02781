"""A card cannot be edited unnoticed: every field that decides its score or that `verify` reads is hashed at export
(check.prompt_sha256 for the prompt, check.fields_sha256 for the rest), and an edit of any of them fails `verify`
with a line naming the field, and is refused by `load_prompt`. A card without its field hashes fails `verify`, saying
what it cannot check. A hostile card (aliases, nesting, size) is one line in seconds from every reader.

Cards are real exports (`build_card` on the tiny random model, written as `export` writes them): a plain card, a
chat card, a batch-calibrated card (fitted bias, the dev items it came from) and a two-member ensemble card."""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tests.clirun import assert_one_line_error
from tests.clirun import promptopt as run_cli


@pytest.fixture(scope="module")
def session(tiny_llama_dir):
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig
    from promptopt.workflows.session import Session

    return Session(
        model=ModelConfig(spec=str(tiny_llama_dir), device="cpu"),
        data=DataConfig(task="sst2", dev_limit=4, test_limit=5),
    )


@pytest.fixture(scope="module")
def cards(session, tmp_path_factory) -> dict[str, Path]:
    """kind -> the card file, as `promptopt export` writes it."""
    from promptopt.workflows.export import build_card
    from promptopt.workflows.formats import card_yaml

    base = session.data.default_prompt()
    chat = base.with_(template=replace(base.template, chat=True))
    calibrated = base.with_(decision="batch", instruction="Decide the sentiment.")
    dev, test = session.items("dev"), session.items("test")
    built = {
        "plain": build_card(session, base, dev_items=dev, test_items=test),
        "chat": build_card(session, chat, dev_items=dev, test_items=test),
        "batch": build_card(session, calibrated, dev_items=dev, test_items=test),
        "ensemble": build_card(
            session,
            base,
            dev_items=dev,
            test_items=test,
            ensemble={
                "members": [(base, {"trial": 0, "dev_accuracy": 0.5}), (calibrated, {"trial": 1, "dev_accuracy": 0.5})],
                "selection": "two members, by hand",
            },
        ),
    }
    folder = tmp_path_factory.mktemp("integrity")
    paths = {}
    for kind, card in built.items():
        paths[kind] = folder / f"{kind}.yaml"
        paths[kind].write_text(card_yaml(card), encoding="utf-8")
    return paths


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def write(card: dict, path: Path) -> Path:
    from promptopt.workflows.formats import card_yaml

    path.write_text(card_yaml(card), encoding="utf-8")
    return path


# --- one edit per field ------------------------------------------------------------------------------------
SWAPS = {  # a value of an enumerated field -> another value the schema allows
    "plain": "chat",
    "chat": "plain",
    "acc": "acc_norm",
    "acc_norm": "acc",
    "multiple_choice": "multiple_choice_gen",
    "argmax": "contextual",
    "batch": "argmax",
    "stored": "adaptive",
    "dir": "hub",
    "folder-files": "folder-index",
    "gsm8k": "plain",
    "mean_normalized_scores": "mean",
}
FILLS = {  # fields that are null in these cards -> a value of the right type
    "generation": {"max_new_tokens": 8, "stop": ["\n"]},
    "data.subsets": ["negative"],
    "rendering.chat_template": "{{ messages[0]['content'] }}",
    "data.carving_sha256": "0" * 64,
    "answer.choices": ["bad", "good"],
}


def changed(value, name: str = ""):
    """`value` edited the way a hand would: another allowed value, one more character, a number nudged."""
    if value is None:
        return copy.deepcopy(FILLS.get(name, "x"))
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1 if isinstance(value, int) else value + 1e-3
    if isinstance(value, str):
        if value in SWAPS:
            return SWAPS[value]
        if re.fullmatch(r"[01]+", value):  # metrics.test.correct: one item flipped
            return ("1" if value[0] == "0" else "0") + value[1:]
        if re.fullmatch(r"[0-9a-f]{64}", value):
            return ("1" if value[0] == "0" else "0") + value[1:]
        return value + " x"
    if isinstance(value, list):
        if not value:
            return ["x"]
        return [changed(value[0]), *value[1:]] if value[0] is not None else [0.0, *value[1:]]
    if isinstance(value, dict):
        key = "rule" if "rule" in value else "query" if "query" in value else next(iter(value))
        return {**value, key: changed(value[key])}
    raise AssertionError(f"no edit for {name}: {value!r}")


def put(card: dict, name: str, value) -> None:
    """Set the field `name` (`data.test_ids`, `metrics.test.n`, `ensemble.members[1].decision`) of `card`."""
    node, parts = card, re.findall(r"[^.\[\]]+|\[\d+\]", name)
    for part in parts[:-1]:
        node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    last = parts[-1]
    if last.startswith("["):
        node[int(last[1:-1])] = value
    else:
        node[last] = value


def step_one(path: Path, monkeypatch) -> tuple[bool, str]:
    """`verify` up to what the card itself holds: the model and the items are not needed to see an edit."""
    from promptopt.errors import UserError
    from promptopt.workflows import verify

    monkeypatch.setattr(verify, "_verify", lambda *args, **kwargs: None)
    try:
        result = verify.verify_card(path, device="cpu")
    except UserError as exc:
        return False, f"error: {exc}"
    return result.ok, "\n".join(result.lines())


@pytest.mark.parametrize("kind", ["plain", "chat", "batch", "ensemble"])
def test_every_scored_field_of_a_card_is_hashed_and_an_edit_of_it_is_named(kind, cards, tmp_path, monkeypatch):
    """Each field, edited alone in the exported file, fails verify with a line that names it; the fresh card
    passes. The fields are the card's own: a calibrated card's fitted bias and the dev items it came from, each
    ensemble member's prompt and rule."""
    from promptopt.card import HASHED_SECTIONS, field_values

    card = load(cards[kind])
    names = list(field_values(card))
    assert {"task", "data.test_ids", "data.dev_ids", "data.task_sha256", "data.items_sha256", "answer.metric"} <= set(
        names
    )
    assert {"rendering.mode", "model.weights_sha256", "metrics.test.correct", "metrics.test.accuracy_ci95"} <= set(
        names
    )
    assert set(card["check"]["fields_sha256"]) == set(names)
    if kind == "batch":
        assert {"decision.bias", "decision.fitted_on", "decision.labels"} <= set(names)
    if kind == "ensemble":
        assert {f"ensemble.members[{i}].{f}" for i in (0, 1) for f in ("instruction", "exemplars", "decision")} <= set(
            names
        )
    assert all(n.split(".")[0] in ("task", "ensemble", *(s.split(".")[0] for s in HASHED_SECTIONS)) for n in names)
    ok, out = step_one(cards[kind], monkeypatch)
    assert ok and f"ok    card fields: as exported ({len(names)} fields)" in out, out
    for name in names:
        edited = copy.deepcopy(card)
        before = field_values(card)[name]
        put(edited, name, changed(before, name))
        ok, out = step_one(write(edited, tmp_path / "edited.yaml"), monkeypatch)
        assert not ok and f"{name} edited after export" in out, (name, out)
        if out.startswith("error: "):  # an edit that breaks the card itself: one error naming the file too
            assert str(tmp_path / "edited.yaml") in out, out
        else:
            assert f"FAIL  card fields: {name} edited after export" in out, out


def test_a_section_or_member_added_or_removed_is_named_whole(cards, tmp_path, monkeypatch):
    card = load(cards["ensemble"])
    cases = {
        "ensemble.members[2]": lambda c: c["ensemble"]["members"].append(copy.deepcopy(c["ensemble"]["members"][0])),
        "decision": lambda c: c.pop("decision"),
        "generation": lambda c: c.update(generation={"max_new_tokens": 8, "stop": ["\n"]}),
        "ensemble": lambda c: c.pop("ensemble"),
    }
    for name, edit in cases.items():
        edited = copy.deepcopy(card)
        edit(edited)
        ok, out = step_one(write(edited, tmp_path / "edited.yaml"), monkeypatch)
        assert not ok and f"FAIL  card fields: {name} edited after export" in out, (name, out)
    edited = copy.deepcopy(card)
    edited["ensemble"]["members"].pop()  # one member left: no longer an ensemble the schema allows
    ok, out = step_one(write(edited, tmp_path / "edited.yaml"), monkeypatch)
    assert out == (
        f"error: {tmp_path / 'edited.yaml'}: ensemble.members: expected at least 2 items, got 1 "
        "(ensemble.members[1] edited after export)"
    ), out


# --- verify, whole -----------------------------------------------------------------------------------------
def test_an_edited_test_split_fails_verify_where_it_passed_before(cards, session, tmp_path):
    """The hostile case: one test id swapped for a dev item's. Re-scored, the card still lies inside its
    interval (before the field hashes, verify exited 0 with an item flipped); now it fails, naming data.test_ids."""
    card = load(cards["plain"])
    dev_only = next(i.id for i in session.items("dev") if i.id not in card["data"]["test_ids"])
    card["data"]["test_ids"][0] = dev_only
    path = write(card, tmp_path / "swapped.yaml")
    proc = run_cli("verify", path, "--device", "cpu")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL  card fields: data.test_ids edited after export" in proc.stdout
    assert f"verify failed for {path}: card fields" in proc.stdout
    assert "ok    model weights" in proc.stdout and "accuracy: " in proc.stdout  # the rest was still checked


def test_a_test_split_of_another_length_is_one_error_naming_the_edit(cards, tmp_path):
    card = load(cards["plain"])
    card["data"]["test_ids"].pop()
    path = write(card, tmp_path / "shorter.yaml")
    assert_one_line_error(
        run_cli("verify", path, "--device", "cpu"),
        str(path),
        "metrics.test.correct: expected one character per data.test_ids entry",
        "(data.test_ids edited after export)",
    )


def test_an_edited_member_rule_fails_verify(cards, tmp_path):
    from promptopt.workflows.verify import verify_card

    card = load(cards["ensemble"])
    bias = card["ensemble"]["members"][1]["decision"]["bias"]
    card["ensemble"]["members"][1]["decision"]["bias"] = [-b for b in bias]
    result = verify_card(write(card, tmp_path / "member.yaml"), device="cpu")
    lines = "\n".join(result.lines())
    assert not result.ok and "FAIL  card fields: ensemble.members[1].decision edited after export" in lines, lines


def test_an_error_met_on_an_edited_card_names_the_edit(cards, tmp_path):
    card = load(cards["plain"])
    card["data"]["task"] = str(tmp_path / "moved.yaml")
    assert_one_line_error(
        run_cli("verify", write(card, tmp_path / "task.yaml"), "--device", "cpu"),
        "data.task: cannot load the recorded task",
        "(data.task edited after export)",
    )


def test_a_card_without_its_field_hashes_fails_verify_saying_what_it_cannot_check(cards, tmp_path):
    """Deleting check.fields_sha256 once turned every field edit into a `note` with exit 0 (a fragility threshold
    0.466 -> 0.9 verified "ok"): a card without them now fails, naming what cannot be checked; the rest is checked."""
    card = load(cards["batch"])
    del card["check"]["fields_sha256"]
    card["decision"]["bias"] = [-b for b in card["decision"]["bias"]]  # the edit the missing hashes would hide
    path = write(card, tmp_path / "older.yaml")
    proc = run_cli("verify", path, "--device", "cpu", "--limit", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("FAIL  card fields: "))
    assert "check.fields_sha256 missing" in line and "export the card again" in line, line
    assert "data.{" in line and "test_ids" in line and "dev_ids" in line and "decision.{" in line, line
    assert "bias" in line and "fitted_on" in line and "metrics.test.{" in line, line
    assert "ok    prompt fields: as exported" in proc.stdout and f"verify failed for {path}: card fields" in proc.stdout
    # its prompt fields are still checked
    card["instruction"] += " Really."
    proc = run_cli("verify", write(card, tmp_path / "older-edited.yaml"), "--device", "cpu", "--limit", "1")
    assert proc.returncode == 1 and "FAIL  prompt fields: instruction edited after export" in proc.stdout


# --- load_prompt: production code loads only the card that was exported ----------------------------------------
@pytest.mark.parametrize("kind", ["plain", "batch", "ensemble"])
def test_load_prompt_refuses_an_edited_card_naming_the_field(kind, cards, tmp_path):
    """`load_prompt` loaded 11 hand-edited cards silently: now each edit of a scored field is refused in one line
    naming it, and `check=False` loads it with a warning saying it was not checked."""
    import warnings

    from promptopt.card import field_values
    from promptopt.errors import ConfigError
    from promptopt.production import UncheckedCardWarning, load_prompt

    card = load(cards[kind])
    assert load_prompt(cards[kind]).card == card  # as exported: loads
    names = [n for n in field_values(card) if not n.startswith(("metrics.", "data."))]
    names += ["data.test_ids", "metrics.test.accuracy", "instruction"]
    for name in names:
        edited = copy.deepcopy(card)
        put(edited, name, changed(field_values(card).get(name, card.get(name)), name))
        path = write(edited, tmp_path / "edited.yaml")
        with pytest.raises(ConfigError) as refused:
            load_prompt(path)
        message = str(refused.value)
        assert message.startswith(str(path)) and "\n" not in message, message
        assert f"{name} edited after export" in message, (name, message)
        if "load_prompt refuses the card" in message:  # a valid card, edited: it loads only unchecked, loudly
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert load_prompt(path, check=False).card == edited
            assert [w.category for w in caught] == [UncheckedCardWarning], caught
            assert "WITHOUT checking its hashes" in str(caught[0].message)


def test_load_prompt_refuses_a_card_it_cannot_check(cards, tmp_path):
    from promptopt.errors import ConfigError
    from promptopt.production import load_prompt

    card = load(cards["plain"])
    del card["check"]["fields_sha256"]
    with pytest.raises(ConfigError, match=r"check\.fields_sha256: missing .* export it again, or load_prompt"):
        load_prompt(write(card, tmp_path / "unhashed.yaml"))
    v1 = tmp_path / "v1.yaml"
    v1.write_text("promptopt_card: 1\ntask: sst2\ninstruction: Decide.\n")
    with pytest.raises(ConfigError, match="a version-1 card records no hashes"):
        load_prompt(v1)
    with pytest.warns(UserWarning, match="WITHOUT checking"):
        assert load_prompt(v1, check=False).prompt.instruction == "Decide."


# --- hostile cards: one line, in seconds, from every reader ------------------------------------------------------
def billion_laughs() -> str:
    """689 bytes that expand to 10^9 strings (the classic XML bomb, in YAML aliases), inside a version-2 card."""
    rows = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "promptopt_card: 2\ntask: sst2\n" + "\n".join(rows) + "\ninstruction: *l8\n"


HOSTILE = {
    "billion-laughs": (lambda path: path.write_text(billion_laughs()), "aliases are expanded"),
    "deep-nesting": (
        lambda path: path.write_text("promptopt_card: 2\ntask: sst2\ninstruction: " + "[" * 1000 + "]" * 1000 + "\n"),
        "nest",
    ),
    "duplicate-key": (
        lambda path: path.write_text("promptopt_card: 2\ntask: sst2\ninstruction: a\ninstruction: b\n"),
        "invalid YAML (line 4, column 1): duplicate key 'instruction' (first on line 3)",
    ),
    "50-MB": (
        lambda path: path.write_text("promptopt_card: 2\ntask: sst2\ninstruction: " + "x" * (50 << 20) + "\n"),
        "50.0 MiB: larger than the 4 MiB",
    ),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_card_is_one_line_in_seconds_from_load_prompt_verify_and_score(kind, tmp_path):
    """A 689-byte billion-laughs card ran load_prompt for 300 s and 3.5 GB; 1,000 levels of `[` were a bare
    RecursionError (3,000-line tracebacks from verify and score); a 50 MB card loaded in 38 s and killed verify in
    the tokenizer. Each is now one line naming the file, within seconds, from all three."""
    import time

    from promptopt.errors import ConfigError
    from promptopt.production import load_prompt

    write_card, fragment = HOSTILE[kind]
    path = tmp_path / "hostile.yaml"
    write_card(path)
    start = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        load_prompt(path)
    message = str(refused.value)
    assert message.startswith(str(path)) and fragment in message and len(message) < 400, message
    for command in (["verify", path], ["score", "--task", "sst2", "--prompt", path, "--model", "nope/none"]):
        assert_one_line_error(run_cli(*command), str(path), fragment)
    assert time.monotonic() - start < 15


def test_the_schema_takes_field_hashes_by_field_name(cards):
    from promptopt.card import validate_card
    from promptopt.errors import ConfigError

    card = load(cards["plain"])
    card["check"]["fields_sha256"]["Data Test"] = "0" * 64
    with pytest.raises(
        ConfigError, match=r"card.yaml: check\.fields_sha256: expected a value matching .*, got 'Data Test'"
    ):
        validate_card(card, "card.yaml")


def test_an_exported_card_with_its_instruction_key_twice_is_refused_naming_key_and_line(cards, tmp_path):
    """A card with a second `instruction:` line loaded and verified (PyYAML keeps the last key): now one line."""
    lines = cards["plain"].read_text(encoding="utf-8").splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("instruction:"))
    edited = tmp_path / "twice.yaml"
    edited.write_text("".join([*lines, "instruction: Say positive.\n"]), encoding="utf-8")
    assert_one_line_error(
        run_cli("verify", edited),
        str(edited),
        f"line {len(lines) + 1}, column 1): duplicate key 'instruction' (first on line {first + 1})",
    )


@pytest.mark.parametrize(
    ("quantization", "recorded", "want"),
    [({"bits": 8}, 4, 4), ({"bits": 8}, None, 16), ({"bits": 4}, 4, 16), (None, None, 16)],
    ids=["8-bit-recorded", "8-bit-older-card", "4-bit", "float"],
)
def test_verify_scores_an_8bit_card_at_the_batch_size_it_was_exported_with(
    cards, tmp_path, monkeypatch, quantization, recorded, want
):
    """LLM.int8 decides its outlier columns per batch (SST-2 8-bit accuracy 0.770 at batch 1, 0.745 at 16, 0.725 at
    64), so an 8-bit card records the batch size its test metrics were measured at and verify re-scores at it; an
    older 8-bit card is scored at 16 with a note. No GPU here: the session verify would build is caught."""
    from promptopt.errors import UserError
    from promptopt.workflows import session as session_module
    from promptopt.workflows.export.build import batch_size_record
    from promptopt.workflows.verify import verify_card

    card = load(cards["plain"])
    if quantization:
        card["model"]["quantization"] = {
            "method": "bitsandbytes",
            "quant_type": "llm.int8" if quantization["bits"] == 8 else "nf4",
            "n_quantized": 14,
            "quantized": ["q_proj"],
            "kept": ["lm_head"],
            "head": "float",
            **quantization,
        }
    if recorded:
        card["model"]["batch_size"] = recorded
    path = write(card, tmp_path / "q.yaml")
    built = []

    class Caught(session_module.Session):
        def __init__(self, *, model, data, batch_size=16, **kw):
            built.append((model.quantize, batch_size))
            raise UserError("stopped before loading (test)")

    monkeypatch.setattr(session_module, "Session", Caught)
    with pytest.raises(UserError, match="stopped before loading"):
        verify_card(path)
    assert built == [(f"{quantization['bits']}bit" if quantization else None, want)]
    # export writes the field for 8-bit weights only, from the scorer's own batch size (auto: the size it settled on)
    assert batch_size_record({"bits": 8}, 32) == {"batch_size": 32}
    assert batch_size_record({"bits": 4}, 32) == batch_size_record(None, 32) == {}
