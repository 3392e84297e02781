"""Production use of a prompt card: load it, render prompts, and reproduce its recorded score.

.venv/bin/python examples/use_a_card.py runs/demo/tcb/best_card.yaml
"""

import sys

from promptopt.models import load_model
from promptopt.prompts import load_card
from promptopt.scoring import Scorer
from promptopt.tasks import load_task

card = sys.argv[1] if len(sys.argv) > 1 else "runs/demo/tcb/best_card.yaml"
prompt, provenance = load_card(card)
print(prompt.context("an instant classic, funny and warm", ("negative", "positive")))

lm = load_model(provenance.get("model", "smollm2-135m-instruct"))
task = load_task(prompt.task)
test = task.test[: provenance["test"]["n"]]
summary = Scorer(lm, task).score(prompt, test).summary
print(f"recorded test accuracy {provenance['test']['accuracy']:.4f}, reproduced {summary['accuracy']:.4f}")
