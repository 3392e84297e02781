"""The meta-prompts a proposer model reads, one per mode, and how its reply becomes an instruction.

- `induce` (APE, Zhou et al. 2022): input → output pairs, then "The instruction was to"; a plain completion,
  so it works with base models.
- `grounded` (DSPy MIPROv2's grounded proposer): a short task summary written first from pool rows, then per
  proposal the summary, 3 rows with their gold answers and one random tip.
- `history` (OPRO, Yang et al. 2023): earlier instructions with their dev accuracy, worst first, and rows.
- `reflect` (ours): dev items whose answer changed under a harmless perturbation, original vs perturbed text
  and answer vs answer, and a request for an instruction under which such rewording does not matter.

Instruct models get the request as a chat turn (their chat template); models without one get a completion
prompt that ends where the instruction starts, read up to the end of its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from promptopt.tasks.item import Item

MODES = ("induce", "grounded", "history", "reflect")

# MIPROv2's tips (dspy/propose/grounded_proposer.py), one sampled per proposal; the key goes to provenance.
TIPS = {
    "concise": "Keep the instruction short and direct.",
    "persona": "Begin the instruction with a persona that suits the task.",
    "step_by_step": "Ask for careful, step-by-step thinking before the answer.",
    "read_carefully": "Tell the reader to read every input carefully before answering.",
    "describe": "Describe the task and the possible answers precisely.",
    "high_stakes": "Say that every answer matters a great deal.",
}
_OUTPUT_CHARS = 300  # a long gold solution (GSM8K) is shown cut: the instruction is about the task, not one answer


@dataclass(frozen=True)
class Flip:
    """A dev item whose answer changed under a perturbation (what `reflect` shows)."""

    item: Item
    perturbed: Item
    family: str
    answer: str
    perturbed_answer: str


def answer_text(item: Item) -> str:
    """The gold answer as a reader sees it: the gold choice's text, else the target, cut."""
    if item.choices is not None and isinstance(item.gold, int) and 0 <= item.gold < len(item.choices):
        text = item.choices[item.gold]
    else:
        text = str(item.target)
    text = " ".join(text.split())
    return text if len(text) <= _OUTPUT_CHARS else text[:_OUTPUT_CHARS] + " …"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def rows_text(items: list[Item]) -> str:
    return "\n\n".join(f"Input: {_one_line(i.question)}\nOutput: {answer_text(i)}" for i in items)


@dataclass(frozen=True)
class Request:
    """One generation request: `chat` text goes through the chat template, `completion` text does not."""

    chat: str
    completion: str


def induce(rows: list[Item]) -> Request:
    text = (
        "I gave a friend an instruction and some inputs. The friend read the instruction and wrote an output for "
        f"every one of the inputs. Here are the input-output pairs:\n\n{rows_text(rows)}\n\nThe instruction was to"
    )
    return Request(chat=text, completion=text)


def summary(rows: list[Item]) -> Request:
    ask = "Describe in two sentences what task these examples come from and what a correct output looks like."
    return Request(
        chat=f"Here are examples of a task, each an input and its correct output.\n\n{rows_text(rows)}\n\n{ask}",
        completion=f"Examples of a task, each an input and its correct output.\n\n{rows_text(rows)}\n\n"
        "What the task is, in two sentences:",
    )


def grounded(task_summary: str, rows: list[Item], tip: str) -> Request:
    return Request(
        chat=(
            f"Task: {task_summary}\n\nExamples:\n\n{rows_text(rows)}\n\nWrite one instruction that tells an assistant how to "
            f"do this task. {TIPS[tip]} Reply with the instruction only, in one or two sentences."
        ),
        completion=(
            f"Task: {task_summary}\n\nExamples:\n\n{rows_text(rows)}\n\nAdvice: {TIPS[tip]}\n"
            "An instruction for this task, in one or two sentences:"
        ),
    )


def history(scored: list[tuple[str, float]], rows: list[Item]) -> Request:
    """`scored`: (instruction, dev accuracy), listed worst first as OPRO does (the best sits nearest the ask)."""
    listed = "\n\n".join(f"Instruction: {text or '(none)'}\nAccuracy: {value:.2f}" for text, value in scored)
    return Request(
        chat=(
            f"Here are instructions for a task, each with its accuracy on held-out examples, from worst to best:\n\n{listed}\n\n"
            f"Examples of the task:\n\n{rows_text(rows)}\n\nWrite a new instruction that differs from all of the above and "
            "reaches a higher accuracy. Reply with the instruction only, in one or two sentences."
        ),
        completion=(
            f"Instructions for a task with their accuracy on held-out examples, from worst to best:\n\n{listed}\n\n"
            f"Examples of the task:\n\n{rows_text(rows)}\n\nA new instruction with a higher accuracy:"
        ),
    )


def reflect(flips: list[Flip]) -> Request:
    shown = "\n\n".join(
        f"Original: {_one_line(f.item.question)}\nAnswer: {f.answer}\nReworded ({f.family}): {_one_line(f.perturbed.question)}\n"
        f"Answer: {f.perturbed_answer}"
        for f in flips
    )
    return Request(
        chat=(
            f"A model answered these examples differently after a harmless change of wording:\n\n{shown}\n\nThe correct answer "
            "does not depend on the wording. Write one instruction for this task under which such rewording does not change "
            "the answer. Reply with the instruction only, in one or two sentences."
        ),
        completion=(
            f"Examples answered differently after a harmless change of wording:\n\n{shown}\n\n"
            "An instruction for this task under which rewording does not change the answer:"
        ),
    )


_LEAD = re.compile(r"^(?:new |improved |the )?(?:instruction|task|summary)(?: was)?\s*[:\-–]\s*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_QUOTES = "\"'`“”‘’ "


def first_sentences(reply: str, k: int = 2) -> str:
    """The first `k` sentences of a reply, on one line, without a leading "Task:" header."""
    text = _LEAD.sub("", " ".join(reply.split())).strip(_QUOTES)
    return " ".join(_SENTENCE_END.split(text)[:k]).strip()


def clean(reply: str, *, mode: str) -> str:
    """The instruction in a reply: its first paragraph, without a leading "Instruction:" or quotes; an
    induced one ("to classify ...") capitalized and ended with a full stop."""
    text = reply.strip().split("\n\n")[0]
    text = _LEAD.sub("", " ".join(text.split())).strip(_QUOTES)
    text = _LEAD.sub("", text).strip(_QUOTES)
    if mode == "induce" and text:
        text = text[0].upper() + text[1:]
        if text[-1] not in ".!?":
            text += "."
    return text
