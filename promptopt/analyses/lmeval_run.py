"""lm-evaluation-harness run on one task, for side-by-side comparisons (check-lmeval, bench/bench_lmeval.py): its
HF model loaded first (outside the timed part), then one `simple_evaluate` call whose wall time is lm-eval's."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import time
from contextlib import contextmanager


def lm_eval_model(model_dir: str, *, device: str = "cpu", dtype: str = "float32", batch_size: int = 16):
    """lm-eval's HF model on a plain model folder (offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=model_dir, device=device, dtype=dtype, batch_size=batch_size)


def run_lm_eval(
    name: str,
    folder: str | None,
    model_dir: str | None = None,
    *,
    model=None,
    device: str = "cpu",
    dtype: str = "float32",
    limit: int | None = None,
    batch_size: int = 16,
):
    """(lm-eval's samples in doc order, its task object, the seconds simple_evaluate took) for task `name` (from
    lm-eval's index, `folder`'s task files first). `model`: an lm-eval model already loaded (else one is loaded
    from `model_dir` before the clock starts)."""
    quiet = [logging.getLogger(n) for n in ("lm-eval", "lm_eval", "datasets", "transformers")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    bars = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"  # lm-eval's own progress bars, where its tqdm reads this after import
    try:
        with silenced():
            return _evaluate(name, folder, model_dir, model, device, dtype, limit, batch_size)
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
        if bars is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = bars


@contextmanager
def silenced():
    """Nothing lm-eval prints reaches the user: its progress bars and those of datasets (tqdm reads TQDM_DISABLE when
    it is imported, long before this call, so the streams are what is silenced) and what the programs it starts
    write (`fatal: not a git repository` from its `git describe` outside a git checkout), at the file descriptors.
    What it raises is raised as it is."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with (
            tempfile.TemporaryFile() as sink,
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def _evaluate(name, folder, model_dir, model, device, dtype, limit, batch_size):
    import lm_eval
    from lm_eval.tasks import TaskManager

    lm = model if model is not None else lm_eval_model(model_dir, device=device, dtype=dtype, batch_size=batch_size)
    manager = TaskManager(include_path=folder) if folder else TaskManager()
    start = time.perf_counter()
    out = lm_eval.simple_evaluate(
        model=lm,
        tasks=[name],
        task_manager=manager,
        limit=limit,
        log_samples=True,
        bootstrap_iters=0,
        verbosity="ERROR",
    )
    seconds = time.perf_counter() - start
    task = manager.load([name])["tasks"][name]
    return sorted(out["samples"][name], key=lambda s: s["doc_id"]), task, seconds
