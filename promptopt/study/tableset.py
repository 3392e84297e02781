"""The tables of one run are written as a set, and read only as a complete one.

A writer (a search's outputs, a compare's tables) first removes the set's manifest `tables.json`, writes each file
atomically, then writes the manifest last, atomically: each file's name, size and SHA-256. From the first file to
the manifest the folder holds no manifest, so a run killed or interrupted in between (kill -9, Ctrl-C, a full disk)
leaves a set that every reader refuses in one line saying the run was interrupted and to `--resume` it; a resume
removes the temporaries its killed predecessor left (yamlio.remove_orphaned_temporaries) and writes the set again.
A file that does not match the manifest (changed or replaced since) is refused the same way.

Fault points (tests, recovery.fault_point): `<kind>-table-write` with a file's temporary made and nothing written
in it yet, `<kind>-tables` after each file is in place (kind: search or compare).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from promptopt.card import sha256_file
from promptopt.errors import UserError
from promptopt.study.recovery import fault_point
from promptopt.yamlio import (
    atomic_write_bytes_via,
    atomic_write_text,
    cannot_write,
    json_cells,
    remove_orphaned_temporaries,
)

MANIFEST = "tables.json"
KINDS = ("search", "compare")


def _hint(kind: str) -> str:
    return f"finish it with `promptopt {kind} ... --resume`"


class TableSet:
    """The files of one run's set in `folder`, written by `promptopt <kind>`: begin(), each file, then seal()."""

    def __init__(self, folder: str | Path, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
        self.folder, self.kind, self.names = Path(folder), kind, []

    def begin(self) -> TableSet:
        """From now on the folder holds an incomplete set: its manifest goes first, and the temporaries a killed
        writer left in the folder go too."""
        try:
            (self.folder / MANIFEST).unlink(missing_ok=True)
        except OSError as exc:
            raise cannot_write(self.folder / MANIFEST, exc) from None
        remove_orphaned_temporaries(self.folder)
        return self

    def file(self, name: str, writer) -> Path:
        """`writer(path)` writes the file at a temporary path, which is then renamed to `name`."""

        def write(tmp) -> None:
            fault_point(f"{self.kind}-table-write")
            writer(tmp)

        path = self.folder / name
        atomic_write_bytes_via(path, write)
        self.add(name)
        return path

    def frame(self, name: str, frame) -> Path:
        """A DataFrame as Parquet or CSV (by the name's suffix), object cells as JSON text."""
        table = json_cells(frame)
        if name.endswith(".parquet"):
            return self.file(name, lambda p: table.to_parquet(p, index=False))
        return self.file(name, lambda p: table.to_csv(p, index=False))

    def text(self, name: str, text: str) -> Path:
        return self.file(name, lambda p: Path(p).write_text(text, encoding="utf-8"))

    def add(self, name: str) -> None:
        """A file of the set already in place (written atomically by its own writer, e.g. a card)."""
        self.names.append(name)
        fault_point(f"{self.kind}-tables")

    def seal(self) -> Path:
        """The manifest, last: the set is complete."""
        return seal(self.folder, self.names, self.kind)


def seal(folder: str | Path, names: list[str], kind: str) -> Path:
    """Write `folder`/tables.json for the files `names` as they are now."""
    folder = Path(folder)
    files = [{"name": n, "bytes": (folder / n).stat().st_size, "sha256": sha256_file(folder / n)} for n in names]
    manifest = {
        "format": 1,
        "kind": kind,
        "files": files,
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return folder / MANIFEST


def check_table_set(folder: str | Path, kind: str, *, resume_with: str | None = None) -> dict:
    """The manifest of `folder`'s complete set (written by `promptopt <kind>`), its files checked (sizes, then
    SHA-256), or one UserError that says the run was interrupted and to resume it (`promptopt <resume_with>
    ... --resume`: a compare resumes the searches in its folders)."""
    folder, hint = Path(folder), _hint(resume_with or kind)
    path = folder / MANIFEST
    interrupted = f"the {kind} was interrupted while writing them, or wrote them before promptopt kept table sets"
    if not path.is_file():
        raise UserError(f"{folder}: its tables are not a complete set (no {MANIFEST}): {interrupted}; {hint}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = [(str(f["name"]), int(f["bytes"]), str(f["sha256"])) for f in manifest["files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: unreadable ({exc}): {interrupted}; {hint}") from None
    if manifest.get("kind") != kind:
        raise UserError(f"{path}: the tables of a {manifest.get('kind')} run, not of a {kind}")
    for name, size, digest in files:
        file = folder / name
        now = file.stat().st_size if file.is_file() else None
        why = (
            "missing"
            if now is None
            else f"{now} bytes, {size} recorded"
            if now != size
            else "its SHA-256 differs"
            if sha256_file(file) != digest
            else ""
        )
        if why:
            raise UserError(
                f"{folder}: {name} does not match {MANIFEST} ({why}): the {kind} was interrupted while rewriting "
                f"its tables, or the file was changed since; {hint}"
            )
    return manifest


__all__ = ["MANIFEST", "TableSet", "check_table_set", "seal"]
