"""No silent minutes: every long command the docs show prints progress on stderr before it ends — a bar on a
terminal, one line per step otherwise (`<command>: <step>`), nothing with `--quiet` — and its results on stdout
only after that. Each command runs here on a tiny workload (a tiny random model: the feature is plumbing) through
the real entry point, with stdout and stderr recorded write by write with the time of each write.

`promptopt.progress` itself: lines when stderr is not a terminal, tqdm bars when it is, silence outside a command
(library use) and with quiet."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from promptopt import progress

REPO = Path(__file__).resolve().parents[2]


class _Stream(io.TextIOBase):
    """A write-by-write recorder: (time, stream name, text) into a shared list."""

    def __init__(self, events: list, name: str, tty: bool = False) -> None:
        self.events, self.name, self.tty = events, name, tty

    def write(self, text: str) -> int:
        if text:
            self.events.append((time.perf_counter(), self.name, text))
        return len(text)

    def isatty(self) -> bool:
        return self.tty

    def flush(self) -> None:
        pass


def run(*args) -> tuple[int, list]:
    """`promptopt ARGS` in this process; every write to stdout and stderr with its time, and the end as
    (time, 'end', '')."""
    from promptopt.cli import main

    events: list = []
    argv = ["promptopt", *(str(a) for a in args)]
    with (
        mock.patch.object(sys, "argv", argv),
        contextlib.redirect_stdout(_Stream(events, "stdout")),
        contextlib.redirect_stderr(_Stream(events, "stderr")),
    ):
        previous = os.getcwd()
        os.chdir(REPO)
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            os.chdir(previous)
    events.append((time.perf_counter(), "end", ""))
    return code, events


def progress_before_results(events: list, prefix: str) -> list[str]:
    """The progress lines (stderr writes that start with `prefix`, a bar's carriage return aside), after checking
    that the first came before anything on stdout and before the command ended."""
    lines = [
        (t, text.lstrip("\r")) for t, name, text in events if name == "stderr" and text.lstrip("\r").startswith(prefix)
    ]
    assert lines, f"nothing on stderr starts with {prefix!r}: {[e[1:] for e in events][:20]}"
    first = lines[0][0]
    results = [t for t, name, text in events if name == "stdout" and text.strip()]
    assert results, "the command printed no result"
    assert first < results[0], "the first progress line came after the results"
    assert first < events[-1][0]
    return [text for _, text in lines]


# --- the runs the commands read ---------------------------------------------------------------------------------------
SUITE = """name: tiny
seed: 7
similarity_threshold: 0.5
variants_per_item: 1
distractors: {distractors}
families:
  typo: {{operator: keyboard_typos, max_chars: 1, max_words: 2}}
  distractor: {{operator: distractor}}
"""
PROTOCOL = (
    'name: tiny\nn: 2\nseed: 3\nranks: [1]\nmax_new_tokens: 3\nstop: ["\\nQuestion:"]\ntasks:\n'
    '  triviaqa:\n    template: {query: "Question: {question}\\nAnswer:"}\n'
    '    exemplars: [{question: "Which planet is red?", answer: "Mars"}]\n'
)


@pytest.fixture(scope="module")
def files(tiny_llama_dir, tmp_path_factory) -> dict:
    """A finished tiny search (export, verify, report and diagnose proxy read it), its exported card, a two-family
    suite and a stress protocol."""
    from promptopt.study import SearchConfig, run_search
    from promptopt.workflows.export import export_run

    folder = tmp_path_factory.mktemp("progress")
    config = SearchConfig.build(
        model=str(tiny_llama_dir),
        out=str(folder / "run"),
        device="cpu",
        task="sst2",
        strategy="accuracy",
        trials=5,
        dev_limit=6,
        test_limit=6,
        pruning=False,
    )
    run_search(config, show_progress=False)
    export_run(folder / "run", out=folder / "card.yaml")
    (folder / "suite.yaml").write_text(SUITE.format(distractors=REPO / "perturbations" / "distractors.txt"))
    (folder / "protocol.yaml").write_text(PROTOCOL)
    return {"run": folder / "run", "card": folder / "card.yaml", "suite": folder / "suite.yaml", "folder": folder}


def _commands(model: Path, f: dict, out: Path) -> dict[str, tuple[str, list]]:
    """command -> (its progress prefix, its arguments): each long command of the docs on a tiny workload."""
    tiny = ["--model", model, "--device", "cpu"]
    positions = ["--tasks", "sst2", "--limit", "3", "--text-per-task", "2", "--trace-tokens", "2"]
    return {
        "propose": ("propose:", ["propose", "--task", "sst2", *tiny, "--mode", "induce", "--n", "1", "--dev-limit", "8",
                                 "--test-limit", "8", "--screen-items", "4", "--out", out / "space.yaml", "--cache", out / "cache"]),
        "search": ("search", ["search", "--task", "sst2", *tiny, "--strategy", "accuracy", "--trials", "2", "--dev-limit",
                              "4", "--test-limit", "4", "--out", out / "search"]),
        "compare": ("compare:", ["compare", "--task", "sst2", *tiny, "--strategies", "accuracy", "--trials", "1",
                               "--dev-limit", "4", "--test-limit", "4", "--top-n", "1", "--suite", "none", "--out", out / "cmp"]),
        "export": ("export:", ["export", f["run"], "--out", out / "card.yaml"]),
        "verify": ("verify:", ["verify", f["card"], "--device", "cpu", "--limit", "3"]),
        "report": ("report:", ["report", f["run"], "--out", out / "report.html"]),
        "evaluate": ("evaluate:", ["evaluate", "--task", "sst2", *tiny, "--suite", f["suite"], "--limit", "3"]),
        "score": ("score:", ["score", "--task", "sst2", *tiny, "--limit", "3"]),
        "stress": ("stress:", ["stress", "--task", "triviaqa", *tiny, "--protocol", f["folder"] / "protocol.yaml"]),
        "trace": ("trace:", ["trace", "The sky is", *tiny, "--max-new-tokens", "3"]),
        "diagnose geometry": ("diagnose geometry:", ["diagnose", "geometry", *tiny, *positions, "--out", out / "g"]),
        "diagnose regimes": ("diagnose regimes:", ["diagnose", "regimes", *tiny, *positions, "--out", out / "r"]),
        "diagnose approx": ("diagnose approx:", ["diagnose", "approx", *tiny, *positions, "--out", out / "a"]),
        "diagnose taboo": ("diagnose taboo:", ["diagnose", "taboo", "--task", "triviaqa", *tiny, "--limit", "2",
                                               "--ranks", "1", "--mid-word-ranks", "", "--seeds", "1", "--out", out / "t"]),
        "diagnose conflicts": ("diagnose conflicts:", ["diagnose", "conflicts", "--task", "sst2", *tiny, "--seeds", "2",
                                                       "--limit", "12", "--trials", "3", "--out", out / "c"]),
        "diagnose proxy": ("diagnose proxy:", ["diagnose", "proxy", f["run"], "--trials", "3", "--limit", "3",
                                               "--suite", f["suite"], "--out", out / "p"]),
    }  # fmt: skip


COMMANDS = [
    "propose",
    "search",
    "compare",
    "export",
    "verify",
    "report",
    "evaluate",
    "score",
    "stress",
    "trace",
    "diagnose geometry",
    "diagnose regimes",
    "diagnose approx",
    "diagnose taboo",
    "diagnose conflicts",
    "diagnose proxy",
]
QUIET = {"propose", "search", "compare", "export", "verify", "report", "evaluate", "diagnose regimes"}  # checked


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.long
def test_a_long_command_prints_progress_before_it_ends(command, tiny_llama_dir, files, tmp_path):
    prefix, args = _commands(tiny_llama_dir, files, tmp_path)[command]
    code, events = run(*args)
    assert code == 0, "".join(text for _, name, text in events if name == "stderr")[-3000:]
    lines = progress_before_results(events, prefix)
    if prefix.endswith(":"):  # ours: one whole line per step when stderr is not a terminal, and no bar redraws
        assert all(line.endswith("\n") and "\r" not in line for line in lines), lines
        redraws = [text for _, name, text in events if name == "stderr" and "\r" in text]
        assert not redraws, redraws[:3]
    if command in ("search", "compare"):  # a line per finished trial of each search, with the best so far
        # trial 0 is the incumbent (scored before the trials, and said so); the first sampled trial is 1
        assert any("scoring the incumbent" in line for line in lines), lines
        assert any(
            re.search(r": trial 1 (finished|pruned after \d+ of \d+ dev items) \(1/", line) and "; best " in line
            for line in lines
        ), lines
    if command in QUIET:
        out = tmp_path / "quiet"
        out.mkdir()
        _, quiet_args = _commands(tiny_llama_dir, files, out)[command]
        code, events = run(*quiet_args, "--quiet")
        assert code == 0
        said = [text for _, name, text in events if name == "stderr" and text.startswith(prefix)]
        assert not said, said
        assert any(name == "stdout" and text.strip() for _, name, text in events)  # results all the same


def test_the_check_can_fail():
    """A command that prints its results before any progress, or none at all, is caught."""
    now = time.perf_counter()
    with pytest.raises(AssertionError, match="after the results"):
        progress_before_results(
            [(now, "stdout", "result\n"), (now + 1, "stderr", "x: step\n"), (now + 2, "end", "")], "x:"
        )
    with pytest.raises(AssertionError, match="nothing on stderr"):
        progress_before_results([(now, "stdout", "result\n"), (now + 1, "end", "")], "x:")


def test_propose_prints_rejected_texts_and_the_record_names_them(tiny_llama_dir, tmp_path):
    """Every rejected text is printed with its reason and named in the JSON beside the space; a proposer whose
    texts all fail says that the space is unchanged."""
    import json

    code, events = run("propose", "--task", "sst2", "--model", tiny_llama_dir, "--device", "cpu", "--mode", "induce",
                       "--n", "2", "--dev-limit", "8", "--test-limit", "8", "--screen-items", "4",
                       "--out", tmp_path / "space.yaml", "--cache", tmp_path / "cache")  # fmt: skip
    assert code == 0
    stdout = "".join(text for _, name, text in events if name == "stdout")
    record = json.loads((tmp_path / "space.proposals.json").read_text())
    assert record["attempts"] == len(record["accepted"]) + len(record["rejected"])
    for rejected in record["rejected"]:
        assert f"[{rejected['reason']}]" in stdout and " ".join(rejected["text"].split())[:60] in stdout
    assert "passed the filters" in stdout and "space.proposals.json" in stdout


# --- the module ------------------------------------------------------------------------------------------------------
def test_lines_bars_quiet_and_silence_outside_a_command():
    events: list = []
    with contextlib.redirect_stderr(_Stream(events, "stderr")):
        progress.step("nobody asked")  # library use: silent
        assert list(progress.iterate([1, 2], "x")) == [1, 2]
        with progress.reporting("export"):
            progress.step("measuring the card")
            assert list(progress.iterate(["a", "b"], "family", label=str)) == ["a", "b"]
            with progress.reporting("inner", quiet=True):
                progress.step("silenced")
            progress.step("back")
        with progress.reporting("export", quiet=True):
            progress.step("quiet")
    assert [text for _, _, text in events] == [
        "export: measuring the card\n",
        "export: family 1/2 a\n",
        "export: family 2/2 b\n",
        "export: back\n",
    ]
    bars: list = []
    with contextlib.redirect_stderr(_Stream(bars, "stderr", tty=True)):
        with progress.reporting("evaluate"):
            assert progress.bars()
            assert list(progress.iterate(range(3), "families")) == [0, 1, 2]
    drawn = "".join(text for _, _, text in bars)
    assert "evaluate: families" in drawn and "\r" in drawn and "0/3" in drawn  # a tqdm bar, drawn in place


# --- inside one long step: a meter ------------------------------------------------------------------------------------
def test_a_meter_says_where_it_is_every_few_seconds_with_what_remains(monkeypatch):
    """Lines at most every METER_SECONDS (none before: a short loop says nothing), each with the count, the time so
    far and the time left at the pace so far; the stage names the part of the command."""
    clock = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    events: list = []
    with contextlib.redirect_stderr(_Stream(events, "stderr")), progress.reporting("stress"):
        meter = progress.meter("generating", 4, "items")
        for done, at in ((0, 101.0), (1, 104.0), (1, 106.0), (2, 107.0), (3, 112.0), (4, 120.0)):
            clock[0] = at
            with progress.stage("rank 2 (3/5)"):
                meter.update(done, note=" (step 9/512)")
    assert [text for _, _, text in events] == [
        "stress: rank 2 (3/5): generating 1/4 items (step 9/512), 6 s so far, about 18 s left\n",
        "stress: rank 2 (3/5): generating 3/4 items (step 9/512), 12 s so far, about 4 s left\n",
    ]
    assert progress.duration(185) == "3 min 05 s" and progress.duration(3725) == "1 h 02 min"
    events.clear()  # with a warm-up (a prompt's 10 s prefill before the first step), the pace is read after it
    clock[0] = 100.0
    with contextlib.redirect_stderr(_Stream(events, "stderr")), progress.reporting("stress"):
        meter = progress.meter("generating", 2, "items", warmup=True)
        for fraction, at in ((0.01, 110.0), (0.21, 116.0)):
            clock[0] = at
            meter.update(0, fraction=fraction)
    assert [text for _, _, text in events] == [
        "stress: generating 0/2 items, 10 s so far\n",  # no pace yet: nothing said of what is left
        "stress: generating 0/2 items, 16 s so far, about 24 s left\n",  # 6 s for 0.2 of the job; 0.79 to go
    ]


def test_taboo_stress_reports_each_rank_and_its_items_as_it_decodes(tiny_llama_dir, files, monkeypatch):
    """`stress` announces each condition (the baseline, then each rank) with the time left for the rest, and inside
    one, its items and decoding steps with an estimate (a line every step here; every METER_SECONDS in use)."""
    import re

    monkeypatch.setattr(progress, "METER_SECONDS", 0.0)
    protocol = files["folder"] / "protocol-two-ranks.yaml"
    protocol.write_text(PROTOCOL.replace("ranks: [1]", "ranks: [1, 2]"))
    code, events = run("stress", "--task", "triviaqa", "--model", tiny_llama_dir, "--device", "cpu",
                       "--protocol", protocol)  # fmt: skip
    assert code == 0, "".join(text for _, name, text in events if name == "stderr")[-3000:]
    lines = progress_before_results(events, "stress:")
    starts = [line for line in lines if re.match(r"stress: (baseline|rank \d) \(\d/3\): decoding 2 items", line)]
    assert [line.split(" (")[0] for line in starts] == ["stress: baseline", "stress: rank 1", "stress: rank 2"], lines
    assert "left for 2 conditions" in starts[1] and "left for 1 condition at" in starts[2], starts
    for name, number in (("baseline", 1), ("rank 1", 2), ("rank 2", 3)):
        inside = [line for line in lines if line.startswith(f"stress: {name} ({number}/3): generating ")]
        assert inside, (name, lines)
        assert all(re.search(r"generating \d/2 items \(step \d/3\), \d+ s so far", line) for line in inside), inside
        assert any("left" in line for line in inside), inside
        assert any(line.startswith(f"stress: {name} ({number}/3) done in ") for line in lines), lines


def test_verify_reports_its_scoring_as_it_goes(files, monkeypatch):
    """verify re-scores the recorded items (minutes on a real card): a line per scoring batch with what is left
    (batches of 2 rows here, so that the card's 6 items take several)."""
    from promptopt.models.runner import Runner

    monkeypatch.setattr(progress, "METER_SECONDS", 0.0)
    init = Runner.__init__
    monkeypatch.setattr(Runner, "__init__", lambda self, lm, **kw: init(self, lm, **{**kw, "batch_size": 2}))
    code, events = run("verify", files["card"], "--device", "cpu")
    assert code == 0, "".join(text for _, name, text in events if name == "stderr")[-3000:]
    lines = progress_before_results(events, "verify:")
    scoring = [line for line in lines if line.startswith("verify: scoring ")]
    assert any("left" in line for line in scoring), lines
