"""What a task file may read: files inside its own folder tree, symlinks followed, and nothing else.

A task file is someone else's input. Its `include:` files and its data files are resolved (relative paths as lm-eval
and promptopt resolve them, then every symlink followed) and refused in one line when they land outside the folder
that holds the task file. `--trust-task-code` lifts the limit: a task trusted to run its own Python could read any
file anyway. Errors name the path as the task file wrote it, never anything read from the file it points at.
"""

from __future__ import annotations

import os
from pathlib import Path

from promptopt.errors import ConfigError
from promptopt.tasks.task_code import TRUST_FLAG


def task_root(where: str) -> Path:
    """The folder tree a task file may read from: the folder of the file, symlinks followed."""
    return Path(where).resolve().parent


def confined(path: Path, root: Path | None, where: str, key: str, written: str) -> Path:
    """`path` with its symlinks followed, when it lies inside `root` (None: no limit, a trusted task); else one
    ConfigError naming the task file, the key and the path as written."""
    try:
        resolved = path.expanduser().resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise ConfigError(f"{where}: {key}: {written}: cannot resolve ({type(exc).__name__})") from None
    if root is None or resolved.is_relative_to(root):
        return resolved
    link = " through a symlink" if Path(os.path.normpath(path.expanduser().absolute())).is_relative_to(root) else ""
    raise ConfigError(
        f"{where}: {key}: {written} resolves{link} outside the task file's folder {root}: not read (a task file reads "
        f"files in its own folder tree only; pass {TRUST_FLAG} to let a task you trust read elsewhere)"
    )


# datasets' own builders: `load_dataset("text", data_files=...)` reads local files by another name
_LOCAL_BUILDERS = {
    "arrow", "audiofolder", "cache", "csv", "eval", "generator", "hdf5", "imagefolder", "json", "niftifolder",
    "pandas", "parquet", "pdffolder", "spark", "sql", "text", "videofolder", "webdataset", "xml",
}  # fmt: skip


def check_hub_source(path: str, data_files, where: str, key: str, root: Path | None) -> None:
    """A hub dataset named by a task file: `datasets.load_dataset` reads a local folder by the same call (and a builder
    such as `text` reads local data_files), so a local one must lie in `root` like any data file (None: trusted)."""
    if root is None:
        return
    names = data_files.values() if isinstance(data_files, dict) else [data_files]
    names = [n for entry in names for n in (entry if isinstance(entry, list) else [entry]) if isinstance(n, str)]
    local = Path(path).expanduser()
    if path.lower() in _LOCAL_BUILDERS:
        if not names:
            raise ConfigError(f"{where}: {key}: {path} reads local data_files: name them")
        for name in names:  # relative to the working directory, as datasets reads them
            confined(Path(name), root, where, f"{key} {path} data_files", name)
        return
    if path.startswith(("/", ".", "~")) or local.exists():
        confined(local, root, where, key, path)
        for name in names:
            confined(local / name, root, where, f"{key} data_files", name)
        return
    for name in names:
        if name.startswith(("/", "~")) or ".." in Path(name).parts or "://" in name:
            raise ConfigError(
                f"{where}: {key}: data_files {name}: a hub dataset's files are named inside its repository (no "
                f"absolute path, '..' or URL); pass {TRUST_FLAG} to let a task you trust read elsewhere"
            )
