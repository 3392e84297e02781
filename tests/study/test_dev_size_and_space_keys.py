"""What a search says before it runs about inputs that cannot support its claim: a dev set too small to choose a
winner (one warning line naming the smallest difference it detects; an error below the floor) and a space file
that names one instruction twice (one error line naming the file, the key and both lines). Driven through the CLI,
on the tiny random model."""

from __future__ import annotations

from pathlib import Path

from tests.clirun import assert_one_line_error
from tests.clirun import promptopt as run_cli

SST2_SPACE = Path(__file__).resolve().parents[2] / "promptopt" / "search_spaces" / "sst2.yaml"


def _search(model, out, *extra):
    return run_cli(
        "search", "--task", "sst2", "--model", model, "--device", "cpu", "--trials", "2", "--test-limit", "4",
        "--minibatch", "4", "--out", out, *extra,
    )  # fmt: skip


def test_a_search_on_three_dev_items_runs_and_says_once_what_they_can_detect(tiny_llama_dir, tmp_path):
    from promptopt.metrics.stats.selection import minimum_detectable_effect
    from promptopt.study import context

    context._WARNED.clear()  # said once per process: an earlier search in this one may have said it
    result = _search(tiny_llama_dir, tmp_path / "run", "--dev-limit", "3")
    assert result.code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    mde = min(minimum_detectable_effect(3, 0.2), 1.0)
    assert warnings == [
        f"warning: 3 dev items choose the winner: their paired test detects only accuracy differences of {mde:.3f} "
        "or more (80% power, a fifth of items discordant); a winner chosen on them is mostly chance (raise "
        "--dev-limit: 40 items detect 0.20)"
    ]
    assert (tmp_path / "run" / "best_card.yaml").is_file()  # a warning, not a refusal: small runs are for trying


def test_enough_dev_items_get_no_warning_and_one_item_is_refused(tiny_llama_dir, tmp_path):
    from promptopt.metrics.stats.selection import dev_size_warning

    assert dev_size_warning(40) is None and dev_size_warning(39) is not None
    result = _search(tiny_llama_dir, tmp_path / "one", "--dev-limit", "1")
    assert_one_line_error(result, "--dev-limit 1: 1 dev item: a search needs at least 2 to tell prompts apart")
    assert not (tmp_path / "one").exists()


def test_a_space_file_naming_an_instruction_twice_is_one_error_line(tiny_llama_dir, tmp_path):
    text = SST2_SPACE.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("be_careful:"))
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("none:"))
    lines.insert(at + 1, '  none: "Answer at once."\n')
    space = tmp_path / "space.yaml"
    space.write_text("".join(lines), encoding="utf-8")
    result = _search(tiny_llama_dir, tmp_path / "run", "--dev-limit", "8", "--space", space)
    assert_one_line_error(
        result, str(space), f"(line {at + 2}, column 3): duplicate key 'none' (first on line {first + 1})"
    )
