"""lm-eval's `generate_until` scoring as an answer type: the generation through the task's filters, then
`exact_match` against the gold (any of them, when doc_to_target gives a list), with lm-eval's options.

Filters (`filter_list`, one pipeline): `take_first` (one generation per item: nothing to do), `regex`
(`regex_pattern`, `group_select`, `fallback`: lm-eval's RegexFilter, `findall` then the selected match, stripped),
`remove_whitespace` (strip), `lowercase`, `uppercase`. Each also moves the answer's start in the generated text,
which is where δ_TCB is read (the first token of the extracted answer; none when the fallback is taken).
"""

from __future__ import annotations

import re
import string

from promptopt.tasks.answers import AnswerType
from promptopt.tasks.item import Item

FILTERS = ("take_first", "regex", "remove_whitespace", "lowercase", "uppercase")
EXACT_MATCH_OPTIONS = ("ignore_case", "ignore_punctuation", "ignore_numbers", "regexes_to_ignore")


def apply_filters(filters: tuple, text: str) -> tuple[str, int]:
    """(filtered answer, where it starts in `text`, -1 when a regex fell back) after lm-eval's filter pipeline."""
    answer, start = text, 0
    for name, options in filters:
        if name == "regex":
            pattern = re.compile(options.get("regex_pattern", r"#### (\-?[0-9\.\,]+)"))
            matches = list(pattern.finditer(answer))
            select = int(options.get("group_select", 0))
            if not matches or not -len(matches) <= select < len(matches):
                if matches:  # lm-eval indexes findall's list: out of range is an IndexError there
                    raise IndexError(f"regex filter: group_select {select} but {len(matches)} matches")
                answer, start = str(options.get("fallback", "[invalid]")), -1
                continue
            match = matches[select]
            groups = [i for i in range(1, (pattern.groups or 0) + 1) if match.group(i)]
            if pattern.groups == 0:
                piece, offset = match.group(0), match.start(0)
            elif pattern.groups == 1:
                piece, offset = match.group(1) or "", max(match.start(1), match.start(0))
            elif groups:  # findall gives a tuple: lm-eval takes its first non-empty group
                piece, offset = match.group(groups[0]), match.start(groups[0])
            else:
                answer, start = str(options.get("fallback", "[invalid]")), -1
                continue
            lead = len(piece) - len(piece.lstrip())
            answer, start = piece.strip(), (start + offset + lead if start >= 0 else -1)
        elif name == "remove_whitespace":
            lead = len(answer) - len(answer.lstrip())
            answer, start = answer.strip(), (start + lead if start >= 0 else -1)
        elif name == "lowercase":
            answer = answer.lower()
        elif name == "uppercase":
            answer = answer.upper()
    return answer, start


def exact_match(prediction: str, reference: str, options: dict) -> bool:
    """lm-eval's exact_match (HF evaluate's): regexes removed, then case, punctuation and digits as asked."""
    for pattern in options.get("regexes_to_ignore") or ():
        prediction, reference = re.sub(pattern, "", prediction), re.sub(pattern, "", reference)
    if options.get("ignore_case"):
        prediction, reference = prediction.lower(), reference.lower()
    if options.get("ignore_punctuation"):
        table = str.maketrans("", "", string.punctuation)
        prediction, reference = prediction.translate(table), reference.translate(table)
    if options.get("ignore_numbers"):
        table = str.maketrans("", "", string.digits)
        prediction, reference = prediction.translate(table), reference.translate(table)
    return prediction == reference


class ExactMatch(AnswerType):
    """A generation judged as lm-eval's generate_until task with exact_match judges it (filters, then options)."""

    name = "exact_match"
    generative = True
    required = ("question", "answer")

    def make_item(self, spec, ref, row):
        fields = spec.fields
        item_id = fields["id"].text(row, ref) if "id" in fields else ref.id
        question = fields["question"].text(row, ref)
        target = fields["answer"].target(row, ref)
        if "choices" in fields:  # lm-eval: with doc_to_choice, doc_to_target is the gold's index
            choices = fields["choices"].choices(row, ref)
            if not isinstance(target, int) or not 0 <= target < len(choices):
                raise ref.fail(
                    fields["answer"].key, f"expected an index into the {len(choices)} choices, got {target!r}"
                )
            target = choices[target]
        golds = tuple(str(t) for t in target) if isinstance(target, (list, tuple)) else (str(target),)
        if not golds:
            raise ref.fail(fields["answer"].key, "no gold answer (an empty list)")
        return Item(item_id, question, golds, golds[0], where=ref.where)

    def judge(self, spec, item, text, prompt):
        answer, start = apply_filters(spec.judge_options.get("filters", ()), text)
        options = spec.judge_options.get("exact_match", {})
        return answer, start, any(exact_match(answer, gold, options) for gold in item.gold)
