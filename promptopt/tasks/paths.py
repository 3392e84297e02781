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


def check_hub_source(path: str, data_files, where: str, key: str, trusted: bool) -> None:
    """A hub dataset named by a task file must be a hub dataset: `datasets.load_dataset` reads a local folder (or a
    builder such as `text` over local data_files) by the same call, which would read outside the task's folder."""
    if trusted:
        return
    local = path.startswith(("/", ".", "~")) or path.lower() in _LOCAL_BUILDERS or Path(path).expanduser().exists()
    if local:
        raise ConfigError(
            f"{where}: {key}: {path} is not a hub dataset (datasets would read local files by that name): name the "
            f"files under the task's own folder, or pass {TRUST_FLAG} to let a task you trust read elsewhere"
        )
    files = data_files.values() if isinstance(data_files, dict) else [data_files]
    for entry in files:
        for name in entry if isinstance(entry, list) else [entry]:
            if isinstance(name, str) and (name.startswith(("/", "~")) or ".." in Path(name).parts or "://" in name):
                raise ConfigError(
                    f"{where}: {key}: data_files {name}: a hub dataset's files are named inside its repository (no "
                    f"absolute path, '..' or URL); pass {TRUST_FLAG} to let a task you trust read elsewhere"
                )
