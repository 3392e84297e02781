"""Atomic writes create files with the mode the umask asks for (mkstemp alone gives 0600). YAML is read within
limits (size, nesting, nodes with aliases expanded) on both of PyYAML's parsers, as yaml.safe_load reads it, and no
error message expands a value."""

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


# --- reading YAML within limits ------------------------------------------------------------------------------
def laughs(levels: int = 9) -> str:
    rows = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("python_parser", [False, True], ids=["libyaml", "pure-python"])
def test_yaml_within_limits_reads_as_safe_load_and_beyond_them_stops_at_once(tmp_path, python_parser, monkeypatch):
    import time

    import yaml

    from promptopt import yamlio
    from promptopt.errors import ConfigError
    from promptopt.yaml_bounds import MAX_YAML_DEPTH, MAX_YAML_NODES, PythonBoundedSafeLoader
    from promptopt.yamlio import load_yaml

    if python_parser:
        monkeypatch.setattr(yamlio, "BoundedSafeLoader", PythonBoundedSafeLoader)
    ordinary = "a: &x [1, 2.5, {b: c}]\nd: *x\ne: !!str 5\nf: 2020-01-01\ng: null\nh: 'yes'\ni: yes\n" + laughs(4)
    path = tmp_path / "ordinary.yaml"
    path.write_text(ordinary)
    assert load_yaml(path) == yaml.safe_load(ordinary)  # aliases within the limit are fine (9^4 = 6,561 nodes)
    deep = MAX_YAML_DEPTH + 10
    cases = {
        "laughs.yaml": (laughs(), f"more than {MAX_YAML_NODES:,} nodes once its aliases are expanded (line 6"),
        "deep.yaml": ("a: " + "[" * deep + "]" * deep + "\n", f"nested deeper than {MAX_YAML_DEPTH} levels (line 1"),
        "flat.yaml": ("a: [" + "[]," * (MAX_YAML_NODES + 10) + "]\n", f"more than {MAX_YAML_NODES:,} nodes (line 1"),
        "itself.yaml": ("a: &a [1, *a]\n", "an alias inside the node it names"),
        "large.yaml": ("a: " + "x" * (5 << 20) + "\n", "5.0 MiB: larger than the 4 MiB"),
    }
    for name, (text, fragment) in cases.items():
        (tmp_path / name).write_text(text)
        start = time.monotonic()
        with pytest.raises(ConfigError) as refused:
            load_yaml(tmp_path / name)
        message = str(refused.value)
        assert message.startswith(str(tmp_path / name)) and fragment in message and len(message) < 300, message
        assert python_parser or time.monotonic() - start < 5, name  # PyYAML's own parser: ~3x slower


def test_a_task_file_is_read_within_the_same_limits(tmp_path):
    from promptopt.errors import ConfigError
    from promptopt.tasks.task_code import read_task_yaml

    path = tmp_path / "task.yaml"
    path.write_text("name: x\n" + laughs() + "doc_to_text: !function utils.f\n")
    with pytest.raises(ConfigError, match="nodes once its aliases are expanded"):
        read_task_yaml(path)


def test_an_error_message_never_expands_a_value():
    """Fields.fail wrote the whole value into its message: a billion-laughs value took 300 s and 3.5 GB."""
    from promptopt.errors import ConfigError
    from promptopt.yamlio import Fields

    row = ["lol"] * 9
    for _ in range(8):
        row = [row] * 9  # 9^9 strings, shared as YAML aliases share them
    for value in (row, "x" * 10_000_000, {"k": row}):
        with pytest.raises(ConfigError) as refused:
            Fields({"instruction": value}, "card.yaml").get("instruction", int)
        assert len(str(refused.value)) < 300 and str(refused.value).startswith("card.yaml: instruction: expected")


@pytest.mark.parametrize("python_parser", [False, True], ids=["libyaml", "pure-python"])
def test_a_key_named_twice_in_one_mapping_is_refused_naming_the_key_and_its_lines(tmp_path, python_parser, monkeypatch):
    """PyYAML keeps the last of two equal keys without a word; a file promptopt reads names both lines instead.
    A `<<` merge's keys may be overridden (that is what a merge means), and equal keys in two mappings are fine."""
    from promptopt import yamlio
    from promptopt.errors import ConfigError
    from promptopt.tasks.task_code import read_task_yaml
    from promptopt.yaml_bounds import PythonBoundedSafeLoader
    from promptopt.yamlio import load_yaml

    if python_parser:
        monkeypatch.setattr(yamlio, "BoundedSafeLoader", PythonBoundedSafeLoader)
    ok = tmp_path / "ok.yaml"
    ok.write_text("base: &b {k: 1, j: 2}\nother:\n  <<: *b\n  k: 3\nx: {k: 1}\ny: {k: 2}\n")
    assert load_yaml(ok)["other"] == {"k": 3, "j": 2}
    twice = tmp_path / "space.yaml"
    twice.write_text("task: sst2\ninstructions:\n  none: ''\n  cot: Think.\n  none: Be brief.\n")
    with pytest.raises(ConfigError) as refused:
        load_yaml(twice)
    assert str(refused.value) == (
        f"{twice}: invalid YAML (line 5, column 3): duplicate key 'none' (first on line 3): each key once"
    )
    with pytest.raises(ConfigError, match="duplicate key 'name' \\(first on line 1\\)"):
        task = tmp_path / "task.yaml"
        task.write_text("name: a\nname: b\n")
        read_task_yaml(task)
