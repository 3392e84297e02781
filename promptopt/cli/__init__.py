"""The `promptopt` command line: a thin shell that parses, calls one library function per command and
prints. `app` holds the commands; each module below registers one group of them:

- score.py: score, trace · search.py: search, compare · robustness.py: evaluate, stress
- diagnose.py: the `diagnose` group · cards.py: export, verify, report · info.py: tasks, model-folder
- lmeval.py: check-lmeval (promptopt and lm-evaluation-harness on the same items)
- serve.py: serve (a card over HTTP)
- options.py: options shared by several commands · render.py: every table the CLI prints

`promptopt --help` lists the commands in panels by what a user does (app.py: PANELS, COMMAND_ORDER); a new command
names its panel with `rich_help_panel=` where it is registered.
"""

from promptopt.cli import cards, diagnose, info, lmeval, robustness, score, search, serve  # noqa: E402,F401  (register commands)
from promptopt.cli.app import ANALYSE, app, diagnose_app, main

app.add_typer(diagnose_app, name="diagnose", rich_help_panel=ANALYSE)

__all__ = ["app", "main"]
