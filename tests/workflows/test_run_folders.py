"""Run folders and studies checked as cards are (issue 58, item 3): a storage URL masked whatever its shape, a run
folder whose files are garbage or forged refused in one line before any card is written, `--resume` after a kill
at any moment, and a killed worker's trial re-run at once.

Runs go through the CLI on the tiny random model (tests/conftest.py) with small limits."""

from __future__ import annotations

import pytest

from tests.clirun import promptopt
from tests.workflows.test_faults import LIMITS, assert_one_error_line

PASSWORD = "Hunter2-s3cr3t"
MALFORMED = [
    f"postgresql+psycopg2//optu:{PASSWORD}@127.0.0.1:55432/studies",  # no ':' after the scheme
    f"postgresql+psycopg2:/optu:{PASSWORD}@127.0.0.1:55432/studies",  # one '/'
    f"postgresql+psycopg2:optu:{PASSWORD}@127.0.0.1:55432/studies",  # no '/'
    f"optu:{PASSWORD}@127.0.0.1:55432/studies",  # no scheme
    f"postgresql+psycopg2://optu:{PASSWORD}/x@127.0.0.1:55432/studies",  # a '/' in the password
    f"postgresql+psycopg2://optu:{PASSWORD}@127.0.0.1:notaport/studies",  # a bad port
    f"postgresql+psycopg2:///studies?user=optu&password={PASSWORD}",  # in the query, nothing listening
]


@pytest.fixture(scope="module")
def model(tiny_llama_dir) -> str:
    return str(tiny_llama_dir)


# --- a storage URL, whatever its shape ------------------------------------------------------------------
@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_storage_url_never_prints_its_password(url, model, tmp_path):
    """Given with --storage or in $PROMPTOPT_STORAGE: one line naming the storage, the password masked (also in
    the message SQLAlchemy or the driver adds, which may quote the URL)."""
    search = ["search", *LIMITS, "--model", model, "--trials", "1"]
    for how, run in (
        ("flag", promptopt(*search, "--out", tmp_path / "a", "--storage", url)),
        ("env", promptopt(*search, "--out", tmp_path / "b", env={"PROMPTOPT_STORAGE": url})),
    ):
        assert_one_error_line(run, "error: cannot open storage ")
        assert PASSWORD not in run.stdout + run.stderr, (how, run.stderr)
        assert "***" in run.stderr, (how, run.stderr)


def test_redact_text_masks_a_quoted_url_and_keeps_what_is_not_a_password():
    from promptopt.study.config import redact, redact_text

    url = f"postgresql+psycopg2//optu:{PASSWORD} x@h/db"  # a space in the password: only `url` itself shows where
    message = f"Could not parse SQLAlchemy URL from string '{url}'"
    assert PASSWORD not in redact_text(message, url) and PASSWORD not in redact(url)
    assert redact_text(f"at 'postgresql://u:{PASSWORD}@h/db' and 'u2:{PASSWORD}@h'") == (
        "at 'postgresql://u:***@h/db' and 'u2:***@h'"
    )
    for kept in ("sqlite:////tmp/a@b/study.db", "postgresql://optu@h/db", "mail me at a@b.c", "no url here"):
        assert redact(kept) == kept and redact_text(kept) == kept
