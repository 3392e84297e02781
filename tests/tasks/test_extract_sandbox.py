"""Answer extraction, normalization, and the code sandbox's limits."""

from __future__ import annotations

import uuid

import pytest

from promptopt.tasks.extract import (
    alias_match,
    final_number,
    first_line,
    gsm8k_gold,
    normalize_number,
    numbers_equal,
    squad_normalize,
)
from promptopt.tasks.sandbox import MODES, bwrap_available, run_python


def test_numbers():
    assert gsm8k_gold("so 9 * 2 = 18\n#### 1,018") == "1018"
    assert final_number("He has 5 apples, then 7. #### 12") == ("12", 30)
    assert final_number("So the answer is $1,200.") == ("1200", 18)
    assert final_number("3 plus 4 makes 7.") == ("7", 15)
    assert final_number("no digits here") == (None, -1)
    assert normalize_number("$3.50") == "3.5" and normalize_number("-0") == "0"
    assert numbers_equal("18.0", "18") and not numbers_equal("18", "81") and not numbers_equal(None, "1")


def test_squad_alias_match():
    assert squad_normalize("The  Beatles!") == "beatles"
    assert alias_match("the Beatles", ("Beatles", "Fab Four"))
    assert not alias_match("", ("",))
    assert first_line("  Paris\nThe end") == ("Paris", 2)


def test_sandbox_pass_fail_timeout_memory():
    mode = "bwrap" if bwrap_available() else "rlimit"
    assert run_python("assert 1 + 1 == 2", sandbox=mode).passed
    failed = run_python("def f():\n    return 1\nassert f() == 2", sandbox=mode)
    assert failed.status == "failed" and "AssertionError" in failed.detail
    slow = run_python("while True:\n    pass", timeout=1.0, sandbox=mode)
    assert slow.status == "timeout" and not slow.passed
    hog = run_python("x = bytearray(2 * 1024 ** 3)", memory_mb=256, sandbox=mode)
    assert hog.status == "failed" and "MemoryError" in hog.detail


@pytest.mark.parametrize("mode", MODES)
def test_sandboxed_code_does_not_see_the_callers_environment(mode, monkeypatch):
    """The check means something only if the secret is set in the caller's environment (in every mode: the
    weaker ones, which the user may ask for where bwrap cannot isolate, must not leak it either)."""
    secret = "hunter2-" + uuid.uuid4().hex
    monkeypatch.setenv("PROMPTOPT_SECRET", secret)
    program = f"import os\nassert 'PROMPTOPT_SECRET' not in os.environ\nassert {secret!r} not in repr(dict(os.environ))"
    if mode == "bwrap" and not bwrap_available():
        pytest.skip(
            "bubblewrap is not available here (the default mode then runs nothing: tests/tasks/test_sandbox.py)"
        )
    env = run_python(program, timeout=5, sandbox=mode)
    assert env.passed, env.detail
