"""Production use of an exported card: `promptopt.load_prompt` renders the prompt and parses answers, and
plain transformers code — no promptopt scorer — scores it on the card's recorded test items and gets
the card's accuracy.

    .venv/bin/promptopt export runs/demo --out card.yaml
    .venv/bin/python examples/production_load_prompt.py card.yaml --limit 20

What production code needs from promptopt is only `load_prompt` (no torch import of its own):
  context  = card.render(question, choices)           # exactly the text that was scored
  encoding = tokenizer(context, add_special_tokens=card.add_special_tokens)
  multiple choice: the summed log-probability of each of card.continuations(choices) after the context
                   (lm-eval's encoding: trailing context spaces move into the continuation), then
                   card.decide_batch(rows, choices) decides as the scorer did: the card's decision rule
                   (argmax; acc_norm per character; a calibrated rule's bias; an ensemble card's members,
                   each rendered by member.render, combined); a pmi card also takes, per input, the
                   log-likelihoods of card.content_free_requests(choices) (cached here per pair)
  generative:      greedy decoding with card.generation (max_new_tokens, stop strings), then
                   card.parse(output) — the task's own answer extraction.
The model is the folder `promptopt model-folder --model SPEC` prints; the items' text comes from the task's
data (production code brings its own inputs).
"""

from __future__ import annotations

import argparse
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import promptopt


def continuation_logprob(model, tokenizer, context: str, continuation: str, add_special_tokens: bool) -> float:
    n_spaces = len(context) - len(context.rstrip(" "))
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    ctx_ids = tokenizer(context, add_special_tokens=add_special_tokens)["input_ids"]
    whole_ids = tokenizer(context + continuation, add_special_tokens=add_special_tokens)["input_ids"]
    cont_ids = whole_ids[len(ctx_ids) :]
    if not ctx_ids:  # an empty context (a pmi card's content-free one): after BOS (EOS without one), as lm-eval
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        whole_ids = [prefix, *cont_ids]
    with torch.inference_mode():
        logits = model(torch.tensor([whole_ids])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(whole_ids) - len(cont_ids) - 1 : -1], dim=-1)
    return float(logprobs.gather(1, torch.tensor(cont_ids)[:, None]).sum())


def generate(model, tokenizer, context: str, card) -> str:
    ids = torch.tensor([tokenizer(context, add_special_tokens=card.add_special_tokens)["input_ids"]])
    eos = {
        tokenizer.eos_token_id,
        *(
            [model.generation_config.eos_token_id]
            if isinstance(model.generation_config.eos_token_id, int)
            else model.generation_config.eos_token_id or []
        ),
    } - {None}
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=card.generation["max_new_tokens"],
            do_sample=False,
            eos_token_id=sorted(eos),
            pad_token_id=tokenizer.pad_token_id or sorted(eos)[0],
        )
    text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    cuts = [text.find(s) for s in card.generation["stop"] if s in text]
    return text[: min(cuts)] if cuts else text


def is_correct(card, item, output: str) -> bool:
    from promptopt.tasks.extract import alias_match, numbers_equal

    if card.answer_type == "multiple_choice_gen":
        return card.parse_index(output, item.choices) == item.gold
    if card.answer_type == "number":
        return numbers_equal(card.parse(output), item.gold)
    if card.answer_type == "alias_match":
        return alias_match(card.parse(output) or "", item.gold)
    raise SystemExit(f"this example does not run {card.answer_type} answers (code runs in promptopt's sandbox)")


def main() -> int:
    from promptopt.models.load import model_folder
    from promptopt.tasks import load_task

    parser = argparse.ArgumentParser()
    parser.add_argument("card")
    parser.add_argument("--limit", type=int, default=None, help="only the first N recorded test items")
    args = parser.parse_args()

    card = promptopt.load_prompt(args.card)
    recorded = card.card["data"]
    task = load_task(recorded["task"], subsets=recorded.get("subsets"))
    by_id = {item.id: item for role in ("pool", "dev", "test") for item in task.split(role)}
    ids = recorded["test_ids"][: args.limit]
    folder = model_folder(card.card["model"]["spec"])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    items = [by_id[item_id] for item_id in ids]
    if card.generation is None:  # log-likelihood multiple choice: every member's log-probabilities, then the rule
        rows, content_free, cache = [], [], {}

        def scored(pairs, add_special_tokens):
            """log-likelihoods of (context, continuation) pairs, each pair scored once (the content-free
            context is the same for every input)."""
            for pair in pairs:
                if (pair, add_special_tokens) not in cache:
                    cache[pair, add_special_tokens] = continuation_logprob(model, tokenizer, *pair, add_special_tokens)
            return [cache[pair, add_special_tokens] for pair in pairs]

        for item in items:
            free = [scored(m.content_free_requests(item.choices), m.add_special_tokens) for m in card.members]
            content_free.append(free[0] if len(free) == 1 else free)
            per_member = [
                [
                    continuation_logprob(
                        model, tokenizer, m.render(item.question, item.choices), cont, m.add_special_tokens
                    )
                    for cont in m.continuations(item.choices)
                ]
                for m in card.members
            ]
            rows.append(per_member[0] if len(per_member) == 1 else per_member)
        pmi = any(m.decision.per_item for m in card.members)
        decided = card.decide_batch(rows, [item.choices for item in items], content_free if pmi else None)
        correct = sum(int(d == item.gold) for d, item in zip(decided, items))
    else:
        correct = sum(
            int(is_correct(card, i, generate(model, tokenizer, card.render(i.question), card))) for i in items
        )
    plain = correct / len(ids)
    recorded_flags = card.metrics["test"]["correct"][: len(ids)]
    recorded_acc = recorded_flags.count("1") / len(ids)
    print(
        f"plain transformers + load_prompt: acc {plain:.4f} on {len(ids)} recorded test items; "
        f"the card recorded {recorded_acc:.4f} on the same items (all {len(recorded['test_ids'])}: "
        f"{card.metrics['test']['accuracy']:.4f})"
    )
    return 0 if abs(plain - recorded_acc) < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
