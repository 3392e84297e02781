"""`tasks` and `model-folder`: what is built in, and where a model's files are."""

from __future__ import annotations

from promptopt.cli.app import OTHER, app, quiet_libraries
from promptopt.cli.options import ModelOpt
from promptopt.cli.render import console


@app.command("model-folder", rich_help_panel=OTHER)
def model_folder_command(model: str = ModelOpt) -> None:
    """Print the folder (or hub id) transformers loads the model from: use it to score a card with plain
    `AutoModelForCausalLM.from_pretrained` code (see examples/score_card_with_transformers.py)."""
    from promptopt.models.load import model_folder

    quiet_libraries()
    print(model_folder(model))


@app.command(rich_help_panel=OTHER)
def tasks() -> None:
    """List the built-in tasks."""
    from promptopt.tasks import builtin_task_names, load_task_spec

    for name in builtin_task_names():
        spec = load_task_spec(name)
        console.print(f"[bold]{name}[/bold] ({spec.answer_type}): {spec.description}")
