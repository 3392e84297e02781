"""The Typer app, the session every command starts from, and the entry point that turns user mistakes
(UserError) into one line on stderr and exit status 2; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import os
import sys

import typer

from promptopt.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find prompts that are accurate and stable.",
)
diagnose_app = typer.Typer(no_args_is_help=True, help="Analyses of a run or a model (see README: Diagnose).")


def quiet_libraries() -> None:
    """Libraries' own warnings and progress bars off: the CLI shows its own progress and one-line errors."""
    import warnings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    import huggingface_hub

    huggingface_hub.utils.logging.set_verbosity_error()


def huge_pages_for_large_tensors() -> bool:
    """Ask torch to back CPU tensors of 2 MB and more with transparent huge pages, unless the user has set
    THP_MEM_ALLOC_ENABLE. Torch reads it once, at its first allocation, so it is set before torch is imported
    (the CLI's processes; a worker process inherits it); returns whether it applies to this process.

    A process's first scoring call touches hundreds of MB for the first time: the output head's logits and
    δ_TCB's (positions × vocabulary) buffers, ~40 MB each for 200 SmolLM2 positions and 5x that on Gemma-3's
    262k head. In 4 KB pages that is one fault (and one zeroed page) per 4 KB. Measured on SmolLM2, 200 SST-2
    items, fresh processes alternating (2026-12-02): 90,000-140,000 minor faults in the first call without it,
    48,000-50,000 with it, the output head and δ_TCB 0.64-0.87 s -> 0.54 s, the first call 12.1 -> 11.3 s
    (medians of 5; this machine's floor drifted 8.6-11.9 s over the same processes). Huge pages cost memory
    in 2 MB steps and, under memory fragmentation, the kernel's compaction on a fault: THP_MEM_ALLOC_ENABLE=0
    turns it off. It takes effect where the kernel's /sys/kernel/mm/transparent_hugepage/enabled is `madvise`
    (as here) and changes nothing under `always` or `never`. It changes where tensors live, never their values.
    """
    if "torch" in sys.modules:
        return os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return os.environ["THP_MEM_ALLOC_ENABLE"] == "1"


def split_subsets(subsets: str | None) -> tuple[str, ...] | None:
    return tuple(x.strip() for x in subsets.split(",") if x.strip()) if subsets else None


def session(
    task: str,
    model: str,
    device: str,
    dtype,
    quantize,
    subsets,
    batch_size: int | str = 16,
    out=None,
    *,
    trust_task_code: bool = False,
    order: str | None = None,
):
    """The experiment session every command starts from (task checked now, model loaded on first use)."""
    from promptopt.experiments import Session
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig

    quiet_libraries()
    return Session(
        model=ModelConfig(spec=model, device=device, dtype=dtype, quantize=quantize),
        data=DataConfig(task=task, subsets=split_subsets(subsets), trust_task_code=trust_task_code, order=order),
        out=out,
        batch_size=batch_size,
    )  # the runner's own bars show on a terminal, under `promptopt.progress` (Session.scorer)


def main() -> None:
    huge_pages_for_large_tensors()
    try:
        app()  # typer reports its own usage errors (exit 2); ours arrive as UserError
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)  # one line, never wrapped
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit as exc:
        if exc.code == 130:  # typer turns Ctrl-C into a silent exit 130
            print("interrupted", file=sys.stderr)
        raise
