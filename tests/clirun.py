"""The one way tests run the `promptopt` command (and the example scripts).

`promptopt(...)` goes through the real entry point (`promptopt.cli.main`) in this process: no interpreter
start and no re-import per call, which is most of what a short CLI call costs. `promptopt(..., subprocess=True)`
starts a real process, for what only a process shows (signals, exit codes of a fresh interpreter, an
environment of its own). Both return a `Result` with the exit code and what was printed. `script(...)` runs
an example script as `__main__` in this process, the way `python examples/x.py ARGS` would, without paying
the interpreter start and the torch / transformers imports again (one example keeps a real process:
tests/workflows/test_export.py::test_example_runs_a_generative_card).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import subprocess as sp
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def code(self) -> int:
        return self.returncode


def promptopt(
    *args, cwd: str | Path | None = None, env: dict | None = None, subprocess: bool = False, timeout: int = 600
) -> Result:
    """Run `promptopt ARGS` (arguments are str()-ed) from `cwd` (default: the repository)."""
    argv = [str(a) for a in args]
    if subprocess:
        full_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        proc = sp.run(
            [sys.executable, "-m", "promptopt", *argv],
            capture_output=True,
            text=True,
            cwd=cwd or REPO,
            env=full_env,
            timeout=timeout,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)
    from promptopt.cli import main

    out, err = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    with (
        mock.patch.object(sys, "argv", ["promptopt", *argv]),
        mock.patch.dict(os.environ, env or {}),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        os.chdir(cwd or REPO)
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            os.chdir(previous)
    return Result(code, out.getvalue(), err.getvalue())


def script(path: str | Path, *args, cwd: str | Path | None = None) -> Result:
    """Run the script `path` (relative to the repository) with ARGS as `__main__`, from `cwd` (default: the repository)."""
    target = REPO / path
    argv = [str(target), *(str(a) for a in args)]
    out, err = io.StringIO(), io.StringIO()
    previous, path_before = os.getcwd(), list(sys.path)
    with mock.patch.object(sys, "argv", argv), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        os.chdir(cwd or REPO)
        sys.path.insert(0, str(target.parent))  # as for a script: its own folder first
        try:
            runpy.run_path(str(target), run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            os.chdir(previous)
            sys.path[:] = path_before
    return Result(code, out.getvalue(), err.getvalue())


# a progress line (promptopt.progress, not a terminal): `<command>: <step>`, the command in lower-case words
PROGRESS_LINE = re.compile(r"^[a-z][a-z-]*( [a-z][a-z-]*)?: ")


def message_lines(stderr: str) -> list[str]:
    """What stderr says to a reader: its lines without ANSI codes, progress bars (`%|`), the command's progress
    lines (what it was doing) and the fault hook's announcements."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", stderr)
    return [
        line.strip()
        for line in re.split(r"[\r\n]", text)
        if line.strip()
        and "%|" not in line
        and not line.startswith("fault-point ")
        and not (PROGRESS_LINE.match(line) and not line.startswith("error:"))
    ]


def assert_one_line_error(result, *fragments: str) -> None:
    """Exit 2 and exactly one message line on stderr, starting with 'error:' and holding every fragment (before it
    only progress: what the command was doing when the input turned out bad); never a traceback. `result`: a
    Result here or a tests/workflows/test_faults.py Run (anything with `code` and `stderr`)."""
    assert result.code == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = message_lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error:"), (result.stdout, result.stderr)
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
