"""Options shared by several commands, and the parsers of list-valued options."""

from __future__ import annotations

from pathlib import Path

import typer

from promptopt.errors import UserError

# Options whose help lists what a registry holds (promptopt/registry.py): the names are filled in when help is shown
# (`fill_registry_help`, from main), installed packages' entries included, so the list is never a hand-written copy
# and a command that is not asked for help does not import the registry's module.
REGISTRY_HELP: list[tuple[object, str, str]] = []


def listing_option(default, *flags: str, help: str, registry: str | dict[str, str]):  # noqa: A002 - typer's name
    """A typer option whose `help` has a `{names}` slot for the registry at "module:attribute" `registry`; or, with
    `registry` a mapping of slot -> reference, one slot per list (a reference to a function lists what it returns)."""
    slots = {"names": registry} if isinstance(registry, str) else dict(registry)
    option = typer.Option(default, *flags, help=help.format(**dict.fromkeys(slots, "the registered names: see --help")))
    REGISTRY_HELP.append((option, help, slots))
    return option


def fill_registry_help() -> None:
    """A registry whose module needs an extra that is not installed keeps its placeholder: `promptopt --help` works
    on the base install, and the command itself names the extra (promptopt/extras.py)."""
    from promptopt.extras import extra_of
    from promptopt.registry import load_reference

    for option, template, slots in REGISTRY_HELP:
        listed = {}
        for slot, reference in slots.items():
            try:
                source = load_reference(reference)
            except ModuleNotFoundError as exc:
                if extra_of(exc.name) is None:
                    raise
                break
            listed[slot] = ", ".join(source.names() if hasattr(source, "names") else source())
        else:
            option.help = template.format(**listed)


ModelOpt = listing_option(
    "smollm2-135m-instruct",
    "--model",
    help="hub id, local HF folder, .gguf file, or a model by name: {names}",
    registry="promptopt.models.load:MODELS",
)
DeviceOpt = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto")
DtypeOpt = typer.Option(None, "--dtype", help="float32, bfloat16, float16 (default: float32 on CPU, bf16 on GPU)")
QuantizeOpt = typer.Option(
    None,
    "--quantize",
    help="4bit (NF4) or 8bit (LLM.int8) through bitsandbytes, on CUDA or, with bitsandbytes 0.46.1 or later, the CPU",
)
CardQuantizeOpt = typer.Option(
    None,
    "--quantize",
    help="4bit, 8bit or none (full precision); default: the card's precision (model.quantization)",
)
TaskOpt = typer.Option(
    ..., "--task", help="built-in task name, a task YAML (promptopt's schema or lm-eval's as it is), or lmeval:NAME"
)
TrustTaskCodeOpt = typer.Option(
    False,
    "--trust-task-code",
    help="run the task file's own Python (lm-eval's !function hooks: process_docs, doc_to_*), in this process, and "
    "let it read includes and data outside its own folder; off by default (docs/guarantees.md#task-code)",
)
CardOpt = typer.Option(None, "--prompt", help="prompt card (YAML); default: the task's own prompt")
SubsetsOpt = typer.Option(None, "--subsets", help="comma-separated subsets (e.g. MMLU subjects), or 'all'")


def _batch_size(value: str) -> int | str:
    from promptopt.models.batch_size import parse_batch_size

    return parse_batch_size(value)


BatchOpt = typer.Option(
    "16",
    "--batch-size",
    callback=_batch_size,
    help="rows per forward pass, or auto: the largest that fits, halving on out-of-memory",
)
SearchSuiteOpt = typer.Option(
    "cheap",
    "--search-suite",
    help="the families a search may look at (the robust strategy and --select robust use them); "
    "judged families with their name or operator are reported as seen, the others as unseen; 'none': nothing is seen",
)
ProposeModeOpt = typer.Option(
    "grounded",
    "--propose-mode",
    help="induce (APE), grounded (MIPROv2-style), reflect (on answers perturbation changed); history comes with search --rounds",
)
ProposerOpt = typer.Option(
    None, "--proposer", help="model spec that writes the proposals (default: the task's --model)"
)
# search and compare share these
StorageOpt = typer.Option(
    None,
    "--storage",
    envvar="PROMPTOPT_STORAGE",
    show_envvar=True,
    help="Optuna storage URL (default: SQLite in --out); a URL with a password is best given in $PROMPTOPT_STORAGE (or PGPASSWORD / ~/.pgpass), and is never written with its password",
)
SeedOpt = typer.Option(1234, "--seed")
SpaceOpt = typer.Option(None, "--space", help="search space YAML (default: the task's built-in space)")
ResumeOpt = typer.Option(False, "--resume", help="continue (or join) an existing study")
WorkersOpt = typer.Option(1, "--n-workers", help="worker processes sharing the study")
MinibatchOpt = typer.Option(16, "--minibatch", help="dev items per pruning step")
PruningOpt = typer.Option(True, "--pruning/--no-pruning", help="Wilcoxon paired pruning on dev items")
DecisionOpt = listing_option(
    None,
    "--decision",
    help="decide every trial's answers by one rule: {names}, or batch-adaptive (pmi for per-item choices: ARC, "
    "COPA; optionally :acc or :acc_norm); default: the space's decision: dimension, else argmax "
    "(docs/decisions.md#the-rules)",
    registry="promptopt.decision:DECISION_RULES",
)
TieBreakOpt = typer.Option(
    None,
    "--tie-break",
    help="how the winner is chosen among the trials dev cannot tell apart (paired tie set): stability, cost, "
    "calibrated, argmax, robust or value; default: the strategy's own (accuracy: stability), and for export's choice "
    "among a compare's winners argmax (docs/search.md#choosing-the-winner)",
)
DevLimitOpt = typer.Option(None, "--dev-limit", min=1, help="use only the first N dev items")
TestLimitOpt = typer.Option(None, "--test-limit", min=1, help="use only the first N test items")

DiagnoseOutOpt = typer.Option(
    Path("runs/diagnose"), "--out", help="folder for tables (Parquet + CSV), figures and the position cache"
)
DiagnoseTasksOpt = typer.Option(
    "sst2,arc_easy,arc_challenge,mmlu",
    "--tasks",
    help="log-likelihood tasks whose critical points (and question texts) give positions",
)
DiagnoseLimitOpt = typer.Option(40, "--limit", min=0, help="test items per task (critical points)")
DiagnoseTextOpt = typer.Option(24, "--text-per-task", min=0, help="positions inside each task's question texts")
DiagnoseTraceOpt = typer.Option(
    32, "--trace-tokens", min=0, help="generated tokens per trace prompt (0: no trace positions)"
)


def int_list(text: str, option: str, *, allow_empty: bool = False) -> tuple[int, ...]:
    """`1,2,4` -> (1, 2, 4); anything but comma-separated positive integers is one clear error."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserError(f"{option} {text!r}: expected comma-separated positive integers") from None
    if (not values and not allow_empty) or any(v < 1 for v in values):
        raise UserError(f"{option} {text!r}: expected comma-separated positive integers")
    return values


def names(text: str | None) -> list[str]:
    """`a, b,c` -> ["a", "b", "c"] (empty entries dropped)."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


QuietOpt = typer.Option(False, "--quiet", "-q", help="no progress lines on stderr (results are printed all the same)")
ScreenItemsOpt = typer.Option(
    None,
    "--screen-items",
    min=0,
    help="proposals: dev items each filtered proposal is screened on against the space's best hand-written "
    "instruction (default 32; 0: no screening; docs/search.md#screening)",
)
