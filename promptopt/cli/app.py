"""The Typer app, the session every command starts from, and the entry point that turns user mistakes
(UserError) into one line on stderr and exit status 2; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import os
import sys

import typer
from typer.core import TyperGroup

from promptopt import extras
from promptopt.errors import UserError

# `promptopt --help` groups the commands by what a user does, panels in this order (each command names its panel
# with `rich_help_panel=` where it is registered); within a panel, in COMMAND_ORDER (one not named there comes last).
SEARCH = "Search and compare"
EVALUATE = "Evaluate and stress"
SHIP = "Ship: export, verify, serve"
ANALYSE = "Analyse"
OTHER = "Other"
PANELS = (SEARCH, EVALUATE, SHIP, ANALYSE, OTHER)
COMMAND_ORDER = (
    "search", "compare", "propose", "pair",
    "score", "evaluate", "stress",
    "export", "verify", "serve",
    "diagnose", "report", "trace",
    "tasks", "model-folder", "check-lmeval",
)  # fmt: skip
# `promptopt diagnose --help`: what a run's tables can tell, then the papers' analyses of a model
DIAGNOSE_RUN = "Of your runs"
DIAGNOSE_MODEL = "Of a model: the papers' analyses"
DIAGNOSE_PANELS = (DIAGNOSE_RUN, DIAGNOSE_MODEL)
DIAGNOSE_ORDER = ("proxy", "risk-coverage", "regimes", "geometry", "approx", "conflicts", "taboo")
# The pip extra each command needs (promptopt/extras.py), checked before the command parses its options; a command
# not named here loads models or runs through the optimizer's code: the `search` extra. lm-eval (the `lmeval`
# extra) is checked where it is needed, after the arguments (check-lmeval, --task lmeval:NAME), in the same words.
COMMAND_EXTRAS = {"serve": "serve", "report": "report"}
_invoked: list[str] = []  # the command this process runs, for the line that names a missing extra (main)


class _ByPanel(TyperGroup):
    """A command group that lists its commands (sub-groups too) panel by panel, in `panels`' order, and within a
    panel in `order`'s, instead of in the order their modules happened to be imported."""

    panels: tuple[str, ...] = ()
    order: tuple[str, ...] = ()

    def list_commands(self, ctx) -> list[str]:
        def place(name: str) -> tuple[int, int]:
            panel = getattr(self.commands[name], "rich_help_panel", None)
            return (
                self.panels.index(panel) if panel in self.panels else len(self.panels),
                self.order.index(name) if name in self.order else len(self.order),
            )

        return sorted(super().list_commands(ctx), key=place)


class _Commands(_ByPanel):
    panels, order = PANELS, COMMAND_ORDER


class _DiagnoseCommands(_ByPanel):
    panels, order = DIAGNOSE_PANELS, DIAGNOSE_ORDER


app = typer.Typer(
    cls=_Commands,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find prompts that are accurate and stable.",
)
diagnose_app = typer.Typer(
    cls=_DiagnoseCommands,
    no_args_is_help=True,
    help="Analyses of a run or a model: the papers' tables, and signals on your runs (docs/diagnose.md).",
)


@app.callback()
def root(
    ctx: typer.Context,
    unsafe_sandbox: str | None = typer.Option(
        None,
        "--unsafe-sandbox",
        metavar="rlimit",
        help="run code answers (HumanEval) with rlimits only, without bubblewrap's isolation: files, network and "
        "processes stay reachable; warned on every run (docs/guarantees.md#generated-code)",
    ),
) -> None:
    """Find prompts that are accurate and stable."""
    command = ctx.invoked_subcommand
    if command:
        _invoked.append(command)
        extras.require(COMMAND_EXTRAS.get(command, "search"), f"promptopt {command}")
    if unsafe_sandbox is not None:
        from promptopt.tasks.sandbox import allow_unsafe

        print(allow_unsafe(unsafe_sandbox), file=sys.stderr)


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
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig
    from promptopt.workflows.session import Session

    quiet_libraries()
    return Session(
        model=ModelConfig(spec=model, device=device, dtype=dtype, quantize=quantize),
        data=DataConfig(task=task, subsets=split_subsets(subsets), trust_task_code=trust_task_code, order=order),
        out=out,
        batch_size=batch_size,
    )  # the runner's own bars show on a terminal, under `promptopt.progress` (Session.scorer)


def main() -> None:
    huge_pages_for_large_tensors()
    if {"--help", "-h"} & set(sys.argv[1:]):
        from promptopt.cli.options import fill_registry_help

        fill_registry_help()  # lists what the registries hold, installed packages' entries included
    try:
        app()  # typer reports its own usage errors (exit 2); ours arrive as UserError
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)  # one line, never wrapped
        sys.exit(2)
    except ModuleNotFoundError as exc:  # a module of an extra that the command's own check did not name
        extra = extras.extra_of(exc.name)
        if extra is None:
            raise
        command = f"promptopt {_invoked[-1]}" if _invoked else "promptopt"
        print(f"error: {extras.message(extra, command, exc.name)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit as exc:
        if exc.code == 130:  # typer turns Ctrl-C into a silent exit 130
            print("interrupted", file=sys.stderr)
        raise
