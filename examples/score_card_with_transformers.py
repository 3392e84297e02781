"""Score a prompt card with plain transformers code — no promptopt scorer — and check that the accuracy
is the one promptopt measures. This is the whole scoring rule for multiple-choice tasks:

  1. context  = the card's prompt rendered for the item (instruction, shots, query)       prompt.context()
  2. for each choice: continuation = answer delimiter + choice text (label word / letter / option text)
     (lm-eval's encoding: trailing spaces of the context move to the continuation; the continuation's
     tokens are those of context+continuation beyond the context's own tokens)
  3. score = sum of log p(continuation tokens | context);  prediction = argmax (acc)
  4. the model is the folder `promptopt model-folder --model SPEC` prints (a GGUF is de-quantized once
     into a plain HF folder), loaded in float32.

    .venv/bin/python examples/score_card_with_transformers.py runs/demo/tcb/best_card.yaml --limit 50
    .venv/bin/python examples/score_card_with_transformers.py sst2 --limit 20        # a task's own prompt
    .venv/bin/python examples/score_card_with_transformers.py examples/custom_task/copa.yaml --limit 20
"""

from __future__ import annotations

import argparse
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def continuation_logprob(model, tokenizer, context: str, continuation: str, add_special_tokens: bool) -> float:
    n_spaces = len(context) - len(context.rstrip(" "))
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    ctx_ids = tokenizer(context, add_special_tokens=add_special_tokens)["input_ids"]
    whole_ids = tokenizer(context + continuation, add_special_tokens=add_special_tokens)["input_ids"]
    cont_ids = whole_ids[len(ctx_ids) :]
    with torch.inference_mode():
        logits = model(torch.tensor([whole_ids])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(whole_ids) - len(cont_ids) - 1 : -1], dim=-1)
    return float(logprobs.gather(1, torch.tensor(cont_ids)[:, None]).sum())


def main() -> int:
    from promptopt.models import load_model
    from promptopt.models.load import model_folder
    from promptopt.prompts import load_card
    from promptopt.scoring import Scorer
    from promptopt.tasks import load_task
    from promptopt.yamlio import load_yaml

    parser = argparse.ArgumentParser()
    parser.add_argument("card_or_task")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--model", default=None, help="default: the card's recorded model, else the embedded one")
    args = parser.parse_args()

    if args.card_or_task.endswith((".yaml", ".yml")) and "promptopt_card" in load_yaml(args.card_or_task):
        prompt, provenance = load_card(args.card_or_task)
        task = load_task(prompt.task)
    else:
        task, provenance = load_task(args.card_or_task), {}
        prompt = task.default_prompt()
    if task.spec.generative:
        print("this example covers log-likelihood (multiple-choice) tasks", file=sys.stderr)
        return 2
    spec = args.model or provenance.get("model", "smollm2-135m-instruct")
    items = task.test[: args.limit or provenance.get("test", {}).get("n")]

    folder = model_folder(spec)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    correct = 0
    for item in items:
        context = prompt.context(item.question, item.choices, tokenizer)
        scores = [
            continuation_logprob(model, tokenizer, context, prompt.continuation(text), prompt.add_special_tokens)
            for text in prompt.choice_texts(item.choices)
        ]
        correct += int(max(range(len(scores)), key=scores.__getitem__) == item.gold)
    plain = correct / len(items)

    ours = Scorer(load_model(spec), task).score(prompt, items).table
    promptopt_acc = float(ours["acc"].mean())
    print(f"model folder: {folder}")
    print(f"plain transformers acc {plain:.4f} on {len(items)} test items; promptopt acc {promptopt_acc:.4f}")
    if "test" in provenance and args.limit is None:
        print(f"recorded in the card: {provenance['test']['accuracy']:.4f}")
    return 0 if abs(plain - promptopt_acc) < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
