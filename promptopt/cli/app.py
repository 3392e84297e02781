"""The Typer app, the session every command starts from, and the entry point that turns user mistakes
(UserError) into one line on stderr and exit status 2; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import os
import sys

import typer

from promptopt.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help="Find prompts that are accurate and stable.")
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


def split_subsets(subsets: str | None) -> tuple[str, ...] | None:
    return tuple(x.strip() for x in subsets.split(",") if x.strip()) if subsets else None


def session(task: str, model: str, device: str, dtype, quantize, subsets, batch_size: int = 16, out=None):
    """The experiment session every command starts from (task checked now, model loaded on first use)."""
    from promptopt.experiments import Session
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig

    quiet_libraries()
    return Session(model=ModelConfig(spec=model, device=device, dtype=dtype, quantize=quantize),
                   data=DataConfig(task=task, subsets=split_subsets(subsets)), out=out, batch_size=batch_size, progress=True)


def main() -> None:
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
