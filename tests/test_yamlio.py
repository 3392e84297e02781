"""Atomic writes create files with the mode the umask asks for (mkstemp alone gives 0600)."""

from __future__ import annotations

import os
import stat

import pytest

from promptopt.yamlio import atomic_write_bytes_via, atomic_write_text, current_umask


@pytest.fixture
def restore_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_honour_umask(tmp_path, restore_umask, mask, mode):
    os.umask(mask)
    assert current_umask() == mask
    atomic_write_text(tmp_path / "card.yaml", "a: 1\n")
    atomic_write_bytes_via(tmp_path / "table.csv", lambda tmp: open(tmp, "w").write("x\n"))
    for name in ("card.yaml", "table.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode
    assert (tmp_path / "card.yaml").read_text() == "a: 1\n"
