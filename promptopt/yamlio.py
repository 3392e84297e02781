"""Safe YAML reading (within the limits of yaml_bounds.py) with errors that name the file and key, and atomic file
writing."""

from __future__ import annotations

import math
import os
import re
import reprlib
import tempfile
from pathlib import Path
from typing import Any

import yaml

from promptopt.errors import ConfigError, UserError
from promptopt.yaml_bounds import MAX_YAML_BYTES, BoundedSafeLoader, YAMLLimit

try:
    import fcntl
except ImportError:  # not POSIX: temporaries are not locked, and none is ever taken for an orphan
    fcntl = None


def read_yaml_text(path: Path) -> str:
    """A YAML file's text, refused in one line before it is read when it is larger than MAX_YAML_BYTES."""
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise ConfigError(
            f"{path}: {size / (1 << 20):.1f} MiB: larger than the {MAX_YAML_BYTES >> 20} MiB a card or task file "
            "may be (an exported card of 14,000 test items is under 1 MiB): not read"
        )
    return path.read_text(encoding="utf-8")


def yaml_problem(path: Path, exc: yaml.YAMLError, *, functions: bool = False) -> ConfigError:
    """One line for a YAML error: the file, the line and column, and the problem (never the document's values).
    `functions`: the loader reads `!function` (task_code.py), so an unknown tag gets no hint about it."""
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, YAMLLimit):
        return ConfigError(f"{path}: {problem}{where}: more than promptopt reads in a card or task file")
    if "!function" in problem and not functions:  # lm-eval's Python hooks: task files here hold no code
        problem += (
            ' (YAML files hold no code here: write the function as a Jinja template, e.g. doc_to_text: "{{ premise }}")'
        )
    return ConfigError(f"{path}: invalid YAML{where}: {shorten(problem, 200)}")


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping as yaml.safe_load does, within MAX_YAML_BYTES, MAX_YAML_DEPTH and MAX_YAML_NODES; any
    problem becomes one ConfigError line naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        data = yaml.load(read_yaml_text(path), Loader=BoundedSafeLoader)  # noqa: S506 (a SafeLoader's constructor)
    except yaml.YAMLError as exc:
        raise yaml_problem(path, exc) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {shorten(str(exc), 200)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, 80, 80
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 4


def shown(value: Any) -> str:
    """A value as an error message shows it: its repr, cut short (80 characters of a string, 4 items of a list, 2
    levels), so that no value, however large or aliased, is ever expanded into a message."""
    return _SHOWN.repr(value)


def shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Fields:
    """Typed access to one YAML mapping; errors read `file: key: expected ..., got ...`."""

    def __init__(self, data: Any, where: str, key_path: str = "") -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: {key_path or 'top level'}: expected a mapping, got {type(data).__name__}")
        self.data, self.where, self.key_path = data, where, key_path

    def _name(self, key: str) -> str:
        return f"{self.key_path}.{key}" if self.key_path else key

    def fail(self, key: str, expected: str, got: Any = ...) -> ConfigError:
        tail = "" if got is ... else f", got {shown(got)}"
        return ConfigError(f"{self.where}: {self._name(key)}: expected {expected}{tail}")

    def get(self, key: str, types: type | tuple, default: Any = ..., expected: str | None = None) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise self.fail(key, expected or _describe(types), "nothing")
            return default
        value = self.data[key]
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise self.fail(key, expected or _describe(types), value)
        if not isinstance(value, types):
            raise self.fail(key, expected or _describe(types), value)
        return value

    def number(
        self, key: str, default: Any, low: float, high: float, *, integer: bool = False, above: bool = False
    ) -> Any:
        """A finite number from `low` (excluded when `above`) to `high`: every number a file may hold is bounded (no
        inf, nan, negative timeout or 10**12 tokens reaches the code that uses it)."""
        kind = "an integer" if integer else "a number"
        low_text, high_text = (f"{x:,}" if isinstance(x, int) else f"{x:g}" for x in (low, high))
        expected = f"{kind} {'above' if above else 'from'} {low_text}{' and at most' if above else ' to'} {high_text}"
        value = self.get(key, int if integer else (int, float), default, expected=expected)
        if value is default:
            return value
        if not math.isfinite(value) or value < low or (above and value == low) or value > high:
            raise self.fail(key, expected, value)
        return value

    def choice(self, key: str, options: tuple[str, ...], default: Any = ...) -> str:
        value = self.get(key, str, default, expected="one of " + ", ".join(options))
        if value not in options and value is not default:
            raise self.fail(key, "one of " + ", ".join(options), value)
        return value

    def sub(self, key: str, default: Any = ...) -> Fields:
        return Fields(self.get(key, dict, {} if default is ... else default), self.where, self._name(key))

    def reject_unknown(self, allowed: set[str]) -> None:
        unknown = sorted(set(self.data) - allowed)
        if unknown:
            raise ConfigError(
                f"{self.where}: {self._name(unknown[0])}: unknown key (allowed: {', '.join(sorted(allowed))})"
            )


def _describe(types: type | tuple) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true/false",
        list: "a list",
        dict: "a mapping",
    }
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(names.get(t, t.__name__) for t in types)


def current_umask() -> int:
    """The process umask. mkstemp creates 0600 files whatever the umask, so atomic writes chmod to
    0666 & ~umask, like open() would. Read from /proc (Linux) without changing it; elsewhere set and
    restore it, which races with threads creating files at that instant."""
    try:
        with open("/proc/self/status", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def cannot_write(path: str | Path, exc: OSError) -> UserError:
    """A full disk, a quota, a read-only or forbidden folder while writing: the user's to fix, in one line."""
    reason = os.strerror(exc.errno) if exc.errno else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return UserError(f"cannot write {path}: {reason}")


# The atomic writers' temporaries: `<name>.<8 characters of mkstemp>.tmp` beside the file they become. The
# writer holds an exclusive flock on its temporary until it is renamed or removed, so a temporary that nobody
# holds was left by a process that died (kill -9, power cut): `remove_orphaned_temporaries` removes those.
TEMP_PATTERN = re.compile(r"^(?P<name>.+)\.[A-Za-z0-9_]{8}\.tmp$")


def _temp_beside(path: Path, made: list[Path], held: list[int]) -> str:
    """A temp file in `path`'s folder, locked for as long as its descriptor (appended to `held`) stays open;
    creates the folder (the folders created are appended to `made`)."""
    missing = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    made.extend(missing)
    while True:
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        if fcntl is None:
            os.close(fd)
            return tmp
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks: no cleaner can lock (and so remove) it either
            held.append(fd)
            return tmp
        try:
            if os.stat(tmp).st_ino == os.fstat(fd).st_ino:  # not taken for an orphan before it was locked
                held.append(fd)
                return tmp
        except FileNotFoundError:
            pass
        os.close(fd)


def _release(held: list[int]) -> None:
    for fd in held:
        os.close(fd)


def remove_orphaned_temporaries(folder: str | Path, *, recursive: bool = False) -> list[Path]:
    """Remove the atomic writers' temporaries in `folder` (and below, if `recursive`) that no live writer holds:
    what a process killed while writing left. A writer at work keeps its own. -> the files removed."""
    folder = Path(folder)
    if fcntl is None or not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.rglob("*.tmp") if recursive else folder.glob("*.tmp")):
        if not TEMP_PATTERN.match(path.name) or not path.is_file() or path.is_symlink():
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink()
            removed.append(path)
        except OSError:  # held by a writer at work (BlockingIOError), or not ours to remove
            pass
        finally:
            os.close(fd)
    return removed


def remove_empty_dirs(folders) -> None:
    """Remove those of `folders` (deepest first) that are empty: what a failed write created and left unused."""
    for folder in sorted(map(Path, folders), key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()
        except OSError:
            pass


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a temp file in the same folder and rename: readers never see half a file."""
    atomic_write_texts([(path, text)])


def atomic_write_texts(files: list[tuple[str | Path, str]]) -> None:
    """Several files, all or none: every one goes to a temp file first and is renamed only when all are
    written, so a full disk or a forbidden folder leaves neither half a file nor some of the files."""
    written: list[tuple[str, Path]] = []
    made: list[Path] = []
    held: list[int] = []
    current = None
    try:
        for path, text in files:
            current = Path(path)
            tmp = _temp_beside(current, made, held)
            written.append((tmp, current))
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
        for tmp, path in written:
            current = path
            os.chmod(tmp, 0o666 & ~current_umask())
            os.replace(tmp, path)
        made = []
    except OSError as exc:
        raise cannot_write(current, exc) from None
    finally:
        for tmp, _ in written:
            Path(tmp).unlink(missing_ok=True)
        _release(held)
        remove_empty_dirs(made)


def atomic_write_bytes_via(path: str | Path, writer) -> None:
    """Call writer(tmp_path) then rename onto `path` (for pandas to_parquet/to_csv)."""
    path = Path(path)
    tmp, made, held = None, [], []
    try:
        tmp = _temp_beside(path, made, held)
        writer(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
        made = []
    except OSError as exc:  # pyarrow's and pandas' write errors are OSErrors too
        raise cannot_write(path, exc) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        _release(held)
        remove_empty_dirs(made)


def check_output(path: str | Path, *, folder: bool, what: str) -> None:
    """Fail before any work if `path` cannot be written: a file where a folder is expected or the reverse,
    or a read-only or forbidden location (including a folder above it that may not be entered). Creates
    nothing."""
    path = Path(path)
    try:
        if path.exists() and folder != path.is_dir():
            kind = "a file" if folder else "a directory"
            raise UserError(f"{what} {path}: is {kind}; expected {'a directory' if folder else 'a file name'}")
        existing = path if path.is_dir() else path.parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
    except PermissionError:  # a folder on the way may not be entered, so even stat fails (EACCES)
        raise UserError(f"{what} {path}: cannot enter {_closed_folder(path)} (permission denied)") from None
    if not existing.is_dir():
        raise UserError(f"{what} {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path}: cannot write in {existing} (read-only file system or permission denied)")


def check_out_files(*paths: Path | None) -> None:
    """Output files are checked before any scoring, so a bad --out never costs a finished computation."""
    for path in paths:
        if path is not None:
            check_output(path, folder=False, what="--out")


def _closed_folder(path: Path) -> Path:
    """The first folder on the way to `path` that this user may not enter."""
    for folder in reversed(path.absolute().parents):
        try:
            folder.stat()
        except PermissionError:
            return folder.parent
        if not os.access(folder, os.X_OK):
            return folder
    return path.parent


def key_line(path: str | Path, dotted_key: str) -> int | None:
    """The 1-based line of `a.b` in a YAML mapping file, for messages about a value every row shares."""
    try:
        node = yaml.compose(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for part in re.sub(r"\[\d+\]$", "", dotted_key).split("."):
        if not isinstance(node, yaml.MappingNode):
            return None
        match = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
        if match is None:
            return None
        line, node = match[0].start_mark.line + 1, match[1]
    return line


def builtin_names(folder: Path) -> list[str]:
    return sorted(p.stem for p in Path(folder).glob("*.yaml"))


def load_named_yaml(name_or_path: str, folder: Path, kind: str) -> tuple[dict, str]:
    """A built-in YAML by name (from `folder`) or any YAML by path -> (mapping, where it came from)."""
    path = Path(name_or_path)
    if name_or_path.endswith((".yaml", ".yml")) or path.is_file():
        return load_yaml(path), str(path)
    builtin = Path(folder) / f"{name_or_path}.yaml"
    if not builtin.is_file():
        raise ConfigError(
            f"unknown {kind} '{name_or_path}': built-in {kind}s are {', '.join(builtin_names(folder))}, "
            f"or give the path of a {kind} YAML"
        )
    return load_yaml(builtin), str(builtin)


TABLE_SUFFIXES = (".parquet", ".csv")


def check_table_path(path: str | Path, what: str = "--out") -> None:
    """A per-row table goes to .parquet or .csv, chosen by the file name; anything else fails up front."""
    if Path(path).suffix not in TABLE_SUFFIXES:
        raise UserError(f"{what} {path}: use a .parquet or .csv file name")


def write_table(frame, path: str | Path) -> None:
    """Write a DataFrame atomically as Parquet or CSV, by the file's suffix (the one way tables are saved)."""
    path = Path(path)
    check_table_path(path, what="table")
    if path.suffix == ".parquet":
        atomic_write_bytes_via(path, lambda p: frame.to_parquet(p, index=False))
    else:
        atomic_write_bytes_via(path, lambda p: frame.to_csv(p, index=False))


def json_cells(frame):
    """A copy of `frame` whose object cells that Parquet cannot hold (lists, dicts) are JSON text."""
    import json

    table = frame.copy()
    for name in table.columns:
        if table[name].dtype == object:
            table[name] = table[name].map(
                lambda v: v if v is None or isinstance(v, str) else json.dumps(v, default=str)
            )
    return table


def write_parquet_and_csv(frame, stem: str | Path) -> list[Path]:
    """stem.parquet and stem.csv, atomically: run tables are read by programs (Parquet) and people (CSV).
    Object cells that Parquet cannot hold (lists, dicts) are written as JSON text."""
    stem = Path(stem)
    table = json_cells(frame)
    paths = [stem.with_suffix(".parquet"), stem.with_suffix(".csv")]
    write_table(table, paths[0])
    write_table(table, paths[1])
    return paths
