"""`--batch-size auto`: a runner starts at 64 rows and halves while a call runs out of memory (accelerate's
find_executable_batch_size), keeps the size that fitted, and returns what a runner at that size returns. The
out-of-memory failures are forced: the model's forward raises CUDA's message above a row count."""

from __future__ import annotations

import pytest

from tests.clirun import assert_one_line_error, promptopt

SENTENCES = [f"Review {i}: the film was {'good' if i % 2 else 'bad'} in {i} ways." for i in range(40)]


def _requests(lm):
    ids = [lm.tokenizer(s)["input_ids"] for s in SENTENCES]
    return [(seq[:-1], seq[-1:]) for seq in ids]


def _fits_only(runner, rows: int, seen: list[int]):
    """Make `runner`'s forward fail as CUDA does above `rows` rows, recording every batch's row count."""
    real = runner._forward

    def forward(ids, mask, positions, cache):
        seen.append(ids.shape[0])
        if ids.shape[0] > rows:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.65 GiB total capacity)")
        return real(ids, mask, positions, cache)

    runner._forward = forward


def test_auto_halves_on_out_of_memory_until_a_batch_fits_and_keeps_that_size(tiny_lm):
    from promptopt.models.batch_size import AUTO_START
    from promptopt.models.runner import Runner

    runner, seen = Runner(tiny_lm, batch_size="auto"), []
    runner.use_prefix_cache = False  # every input a row of its own
    runner.forward_overhead_tokens = None  # fixed chunks of the batch size: the rows asked are the cap's
    _fits_only(runner, 8, seen)
    assert runner.batch_size == AUTO_START == 64
    got = runner.loglikelihood(_requests(tiny_lm))
    assert runner.batch_size == 8
    assert seen[:3] == [40, 32, 16] and set(seen[3:]) == {8}  # 64 rows asked: 40 inputs; 32; 16; then 8 at a time
    fixed = Runner(tiny_lm, batch_size=8)
    fixed.use_prefix_cache = False
    want = fixed.loglikelihood(_requests(tiny_lm))
    assert [r.logprob for r in got] == pytest.approx([r.logprob for r in want], abs=1e-5)
    seen.clear()
    runner.loglikelihood(_requests(tiny_lm)[:20])  # the next call starts at the size that fitted: no failure
    assert seen == [8, 8, 4]


def test_auto_halves_with_batches_cut_by_cost_too(tiny_lm):
    """A CPU runner cuts its batches where padding costs least (models/length_batches.py): a batch that does not
    fit may come after smaller ones; the call still halves until every batch fits, and returns a fixed runner's
    numbers at that size."""
    from promptopt.models.runner import Runner

    runner, seen = Runner(tiny_lm, batch_size="auto"), []
    runner.use_prefix_cache = False
    assert runner.forward_overhead_tokens is not None  # cuts by cost, as a CPU runner does
    _fits_only(runner, 8, seen)
    got = runner.loglikelihood(_requests(tiny_lm))
    last_failure = max(k for k, rows in enumerate(seen) if rows > 8)
    assert runner.batch_size == 8 and seen[last_failure + 1 :] and max(seen[last_failure + 1 :]) <= 8
    assert sum(seen[last_failure + 1 :]) == len(SENTENCES)  # the call that fitted ran every input once
    fixed = Runner(tiny_lm, batch_size=8)
    fixed.use_prefix_cache, fixed.forward_overhead_tokens = False, None
    want = fixed.loglikelihood(_requests(tiny_lm))
    assert [r.logprob for r in got] == pytest.approx([r.logprob for r in want], abs=1e-5)


def test_auto_generation_halves_too(tiny_lm):
    from promptopt.models.runner import Runner

    runner, seen = Runner(tiny_lm, batch_size="auto"), []
    _fits_only(runner, 4, seen)
    contexts = [tiny_lm.tokenizer(s)["input_ids"] for s in SENTENCES[:10]]
    got = runner.generate(contexts, max_new_tokens=3)
    assert runner.batch_size == 4 and max(seen[-3:]) <= 4
    want = Runner(tiny_lm, batch_size=4).generate(contexts, max_new_tokens=3)
    assert [g.tokens for g in got] == [w.tokens for w in want]


@pytest.mark.long
def test_out_of_memory_at_one_row_is_one_error_and_other_errors_pass_through(tiny_lm):
    from promptopt.errors import UserError
    from promptopt.models.runner import Runner

    runner, seen = Runner(tiny_lm, batch_size="auto"), []
    runner.forward_overhead_tokens = None  # fixed chunks of the batch size: the rows asked are the cap's
    _fits_only(runner, 0, seen)
    with pytest.raises(UserError, match="--batch-size auto: out of memory even one row at a time"):
        runner.loglikelihood(_requests(tiny_lm)[:3])
    assert seen == [3, 3, 3, 3, 3, 2, 1]  # 64, 32, 16, 8 and 4 rows asked (3 inputs), 2, then 1
    broken = Runner(tiny_lm, batch_size="auto")

    def fails(*args):
        raise RuntimeError("shape mismatch")

    broken._forward = fails
    with pytest.raises(RuntimeError, match="shape mismatch"):  # not out of memory: no retry, its own traceback
        broken.loglikelihood(_requests(tiny_lm)[:3])
    assert broken.batch_size == 64


@pytest.mark.parametrize("value", ["0", "-2", "big", "1.5"])
def test_a_bad_batch_size_is_one_error_line(value):
    assert_one_line_error(
        promptopt("score", "--task", "sst2", "--batch-size", value),
        f"--batch-size '{value}': expected a positive integer or auto",
    )


def test_score_and_the_search_config_take_auto(tiny_llama_dir):
    from promptopt.study import SearchConfig

    assert SearchConfig.build(task="sst2", batch_size="auto").batch_size == "auto"
    result = promptopt(
        "score", "--task", "sst2", "--model", tiny_llama_dir, "--device", "cpu", "--limit", "3", "--batch-size", "auto"
    )
    assert result.code == 0, result.stderr


def test_auto_says_once_which_size_it_chose_and_again_only_when_it_halves(tiny_lm, capfd):
    """`--batch-size auto` never said what it chose: one note line when a size settles, none while it holds."""
    from promptopt.models.runner import Runner

    runner, seen = Runner(tiny_lm, batch_size="auto"), []
    runner.use_prefix_cache = False
    runner.forward_overhead_tokens = None
    _fits_only(runner, 8, seen)
    capfd.readouterr()
    runner.loglikelihood(_requests(tiny_lm))
    runner.loglikelihood(_requests(tiny_lm)[:20])
    notes = [line for line in capfd.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == ["note: --batch-size auto: 8 rows per forward pass (halved from 64 on out-of-memory)"]
    _fits_only(runner, 2, seen)  # memory got tighter: a later call halves again and says so
    runner.loglikelihood(_requests(tiny_lm)[:10])
    notes = [line for line in capfd.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == ["note: --batch-size auto: 2 rows per forward pass (halved from 64 on out-of-memory)"]
    fitting = Runner(tiny_lm, batch_size="auto")
    fitting.loglikelihood(_requests(tiny_lm)[:4])
    assert capfd.readouterr().err.count("note: --batch-size auto: 64 rows per forward pass\n") == 1
