"""The forms an exported card is written in: the card itself (YAML), OpenAI-style chat messages (JSON)
and a plain text template, both with a `{question}` slot (and `{options}` for lettered choices), and a
task YAML for lm-evaluation-harness that renders the same prompt on the card's recorded test items.

Slots are filled with `str.replace`, not `str.format`: exemplar text may hold braces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

import yaml

from promptopt.errors import UserError
from promptopt.prompts import LETTERS, Prompt
from promptopt.yamlio import atomic_write_texts

QUESTION_SLOT, OPTIONS_SLOT = "{question}", "{options}"


class _Dumper(yaml.SafeDumper):
    """Readable YAML: multi-line strings as literal blocks (where YAML allows), short lists of scalars on
    one line (ids, intervals, label words)."""


def _str(dumper, text):
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text.strip("\n") else None)


def _list(dumper, items):
    flow = all(
        isinstance(x, (str, int, float, bool, type(None))) and (not isinstance(x, str) or "\n" not in x) for x in items
    )
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flow and bool(items))


_Dumper.add_representer(str, _str)
_Dumper.add_representer(list, _list)


def dump_yaml(data: dict) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)


def card_yaml(card: dict) -> str:
    return dump_yaml(card)


@dataclass(frozen=True)
class _SlottedPrompt(Prompt):
    """The prompt whose final query shows markers for {question} and {options}; exemplars render as they are
    (they go through query_text too, with their own question)."""

    question_slot: str = QUESTION_SLOT
    options_slot: str = OPTIONS_SLOT

    def query_text(self, question: str, choices=None) -> str:
        if question == self.question_slot:
            return self.template.query.format(question=question, options=self.options_slot, answer="")
        return super().query_text(question, choices)


def slotted(card: dict, question: str, options: str):
    """(prompt, light card) rendering the card's prompt with `question` and `options` as literal markers."""
    from promptopt.production import card_prompt

    light = card_prompt(card)
    base = light.prompt
    prompt = _SlottedPrompt(
        **{f.name: getattr(base, f.name) for f in fields(base)}, question_slot=question, options_slot=options
    )
    return prompt, replace(light, prompt=prompt)


def text_template(card: dict) -> str:
    """The exact scored text with {question} (and {options}) slots: plain or chat-rendered."""
    _, light = slotted(card, QUESTION_SLOT, OPTIONS_SLOT)
    return light.render(QUESTION_SLOT)


def messages_json(card: dict) -> dict:
    prompt, _ = slotted(card, QUESTION_SLOT, OPTIONS_SLOT)
    search = card.get("search") or {}
    return {
        "format": "promptopt-messages/1",
        "task": card["task"],
        "messages": prompt.messages(QUESTION_SLOT, None),
        "slots": {
            "question": QUESTION_SLOT,
            **({"options": OPTIONS_SLOT} if "{options}" in card["template"]["query"] else {}),
        },
        "fill": "replace each slot in the last message's content with str.replace (not str.format)",
        "scored_as": card["rendering"]["mode"],
        "answer": {
            "type": card["answer"]["type"],
            "choices": card["answer"].get("choices"),
            "label_words": card["template"].get("label_words"),
            "choice_format": card["template"].get("choice_format", "text"),
        },
        "generation": card.get("generation"),
        "model": card["model"]["spec"],
        "source": {k: search[k] for k in ("strategy", "study", "trial") if k in search},
        "test_accuracy": card["metrics"]["test"]["accuracy"],
    }


# --- lm-evaluation-harness --------------------------------------------------------------------------
_Q, _O = "\u27e6question\u27e7", "\u27e6options\u27e7"  # markers no prompt text contains


def _jinja_literal(text: str) -> str:
    if not text:
        return ""
    if "{% endraw %}" in text or "{%endraw%}" in text:
        raise UserError("the prompt's text contains '{% endraw %}': it cannot be written as an lm-eval Jinja template")
    return "{% raw %}" + text + "{% endraw %}"


def lm_eval_doc_to_text(card: dict) -> str:
    """A Jinja template over an item ({question}, {choices}) that renders the card's full prompt."""
    _, light = slotted(card, _Q, _O)
    rendered = light.render(_Q)
    options = "{% for c in choices %}{{ 'ABCDEFGHIJKLMNOPQRSTUVWXYZ'[loop.index0] }}. {{ c }}{% if not loop.last %}\n{% endif %}{% endfor %}"
    out = []
    for i, chunk in enumerate(rendered.split(_Q)):
        if i:
            out.append("{{ question }}")
        for j, piece in enumerate(chunk.split(_O)):
            if j:
                out.append(options)
            out.append(_jinja_literal(piece))
    return "".join(out)


def lm_eval_task(card: dict, items_file: Path) -> dict:
    kind = card["answer"]["type"]
    template = card["template"]
    search = card.get("search") or {}
    name = "promptopt_" + "_".join(
        str(x)
        for x in (card["task"], search.get("strategy"), f"t{search['trial']}" if "trial" in search else None)
        if x
    )
    task = {
        "task": "".join(c if c.isalnum() or c in "_-" else "_" for c in name),
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(items_file.resolve())}},
        "test_split": "test",
        "doc_to_text": lm_eval_doc_to_text(card),
        "num_fewshot": 0,  # the shots are part of doc_to_text, in the card's order
    }
    chat = card["rendering"]["mode"] == "chat"
    if kind == "multiple_choice":
        if template.get("choice_format") == "letter":
            task["doc_to_choice"] = "{{ " + repr(list(LETTERS)) + "[:choices|length] }}"
        elif template.get("label_words"):
            task["doc_to_choice"] = list(template["label_words"])
        else:
            task["doc_to_choice"] = "choices"
        task.update(
            output_type="multiple_choice",
            doc_to_target="gold",
            target_delimiter="" if chat else template.get("answer_delimiter", " "),
            metric_list=[{"metric": card["answer"]["metric"], "aggregation": "mean", "higher_is_better": True}],
        )
        return task
    if kind == "code":
        raise UserError(
            "--format lm-eval: code tasks are judged by running tests in promptopt's sandbox; lm-eval cannot reproduce that"
        )
    generation = card["generation"]
    task.update(
        output_type="generate_until",
        doc_to_target="answer",
        generation_kwargs={
            "until": list(generation["stop"]),
            "max_gen_toks": generation["max_new_tokens"],
            "do_sample": False,
        },
        metric_list=[
            {
                "metric": "exact_match",
                "aggregation": "mean",
                "higher_is_better": True,
                "ignore_case": True,
                "ignore_punctuation": kind == "alias_match",
            }
        ],
    )
    if kind == "number":
        task["filter_list"] = [
            {
                "name": "final-number",
                "filter": [
                    {"function": "regex", "regex_pattern": r"(-?[$0-9.,]{2,})|(-?[0-9]+)", "group_select": -1},
                    {"function": "take_first"},
                ],
            }
        ]
    elif kind == "multiple_choice_gen":
        task["filter_list"] = [
            {
                "name": "letter",
                "filter": [
                    {"function": "regex", "regex_pattern": r"\b([A-Z])\b", "group_select": 0},
                    {"function": "take_first"},
                ],
            }
        ]
    return task


def lm_eval_items(card: dict, items) -> str:
    """The card's recorded test items as JSON Lines: id, question, choices, gold (index or answer)."""
    by_id = {i.id: i for i in items}
    lines = []
    for item_id in card["data"]["test_ids"]:
        item = by_id[item_id]
        row = {"id": item.id, "question": item.question}
        if item.choices is not None:
            row["choices"] = list(item.choices)
            row["gold"] = int(item.gold)
            row["answer"] = item.choices[item.gold]
        else:
            gold = item.gold
            row["answer"] = list(gold) if isinstance(gold, tuple) else str(gold)
        lines.append(json.dumps(row, ensure_ascii=False))
    return "\n".join(lines) + "\n"


_LM_EVAL_HEADER = """\
# lm-evaluation-harness task written by `promptopt export --format lm-eval`: the card's prompt (instruction,
# exemplars in order, template) on its recorded test items ({items}).
#   lm_eval --model hf --model_args pretrained=MODEL_FOLDER,dtype=float32 --include_path {folder} --tasks {task}
# MODEL_FOLDER: `promptopt model-folder --model {model}`. Plain cards are encoded with the tokenizer's own
# special tokens (add_special_tokens=True): add `,add_bos_token=True` for a model whose tokenizer adds a BOS.
"""


def write(card: dict, fmt: str, out: Path, *, items=None) -> list[Path]:
    """Render everything first, then write (each file atomically): a failure writes nothing. lm-eval's task YAML
    scores one prompt by argmax: a calibrated decision rule or an ensemble is refused, never silently dropped."""
    rule = (card.get("decision") or {}).get("rule", "argmax")
    if fmt == "lm-eval" and (card.get("ensemble") or rule != "argmax"):
        what = (
            f"an ensemble of {len(card['ensemble']['members'])} prompts"
            if card.get("ensemble")
            else f"its {rule} decision rule"
        )
        raise UserError(
            f"--format lm-eval cannot express {what} (lm-eval decides by argmax over one prompt, so its score would "
            "differ from the card's): write --format card and serve it with promptopt.load_prompt, or export an "
            "argmax search's winner"
        )
    if fmt == "card":
        files = [(out, card_yaml(card))]
    elif fmt == "messages":
        files = [(out, json.dumps(messages_json(card), indent=1, ensure_ascii=False) + "\n")]
    elif fmt == "text":
        files = [(out, text_template(card))]
    else:
        items_file = out.with_suffix(".jsonl")
        task = lm_eval_task(card, items_file)
        header = _LM_EVAL_HEADER.format(
            items=items_file.name, folder=out.parent.resolve(), task=task["task"], model=card["model"]["spec"]
        )
        files = [(items_file, lm_eval_items(card, items)), (out, header + dump_yaml(task))]
    atomic_write_texts(files)  # all or none
    return [path for path, _ in files]


__all__ = [
    "OPTIONS_SLOT",
    "QUESTION_SLOT",
    "card_yaml",
    "lm_eval_doc_to_text",
    "lm_eval_task",
    "messages_json",
    "text_template",
    "write",
]
