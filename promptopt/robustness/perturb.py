"""Perturbation operators (δ_TCB paper App. C.4.3; PromptBench-style stress).

Question-level (the item's text changes): WordNet synonym replacement of 1–2 keywords (nlpaug), LM
paraphrases by the loaded model (up to 3 styles; a chat turn, or a plain completion prompt for base
models), safe sentence reordering, distractor insertion, tautology stress, keyboard and spelling typos
(nlpaug). Prompt-level (the item stays): ICL exemplar reordering and
replacement, and the prompt in an equivalent format (prompt_formats.py).

Every variant is seeded from (suite seed, family, item, variant index), so it is reproducible; numbers
and label words are protected (passed to nlpaug as stopwords, then verified: a variant that changed
them is dropped); text-changing variants must stay within a cosine similarity of the original
(all-MiniLM-L6-v2) or they are dropped. Each drop is counted by reason.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from promptopt.prompts import Prompt
from promptopt.registry import Registry
from promptopt.tasks import Item

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'])")
_DEPENDENT_START = re.compile(
    r"^(he|she|it|they|them|his|her|its|their|this|that|these|those|then|after|afterwards|so|but|also|and|"
    r"or|however|therefore|thus|if|each|the rest|there)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Variant:
    prompt: Prompt
    item: Item


def variant_seed(seed: int, family: str, item_id: str, index: int) -> int:
    return int(hashlib.sha256(f"{seed}|{family}|{item_id}|{index}".encode()).hexdigest()[:15], 16)


def protected_words(prompt: Prompt, item: Item) -> list[str]:
    """Tokens an operator must not touch: numbers in the question, and the label/choice words."""
    words = set(_NUMBER.findall(item.question))
    for text in prompt.choice_texts(item.choices) if item.choices else []:
        words.update(text.split())
    return sorted(words)


def protection_holds(before: str, after: str, protected: list[str]) -> bool:
    """The numbers are the same multiset, and every protected word occurs as often as before."""
    if Counter(_NUMBER.findall(before)) != Counter(_NUMBER.findall(after)):
        return False
    for word in protected:
        pattern = re.compile(rf"(?<!\w){re.escape(word)}(?!\w)", re.IGNORECASE)
        if len(pattern.findall(before)) != len(pattern.findall(after)):
            return False
    return True


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))


class Operator:
    """Turns (prompt, item) into a variant, or None when it does not apply to this item."""

    name = "operator"
    changes_text = True  # question text changes: protection and similarity checks apply

    def __init__(self, **options) -> None:
        self.options = options

    def apply(self, prompt: Prompt, item: Item, seed: int, context: dict) -> Variant | None:
        raise NotImplementedError

    def apply_many(self, prompt: Prompt, items: list[Item], seeds: list[int], context: dict) -> list[Variant | None]:
        return [self.apply(prompt, item, seed, context) for item, seed in zip(items, seeds)]

    def n_variants(self, suite_default: int) -> int:
        """Variants per item for this family (the suite's `variants_per_item` unless the operator says)."""
        return suite_default


def _split(text: str) -> list[str]:
    return text.split()


def _join(tokens: list[str]) -> str:
    return " ".join(tokens)


class _NlpaugOperator(Operator):
    """nlpaug with whitespace tokens: its default tokenizer re-spaces punctuation ("didn ' t") and would
    change the text beyond the words it means to change."""

    _warmed: set[str] = set()

    def augmenter(self, stopwords: list[str]):
        raise NotImplementedError

    def apply(self, prompt, item, seed, context):
        aug = self.augmenter(protected_words(prompt, item))
        model = getattr(aug, "model", None)
        if model is not None and hasattr(model, "predict"):  # candidates may come from a set: fix their order
            predict = model.predict
            model.predict = lambda *args, **kwargs: sorted(predict(*args, **kwargs) or [])
        if self.name not in _NlpaugOperator._warmed:  # first use loads WordNet/lexicons and draws random numbers
            aug.augment("the quick brown fox jumps over the lazy dog")
            _NlpaugOperator._warmed.add(self.name)
        _seed_everything(seed)  # seeded right before the draw: the variant depends on the seed alone
        augmented = aug.augment(item.question)
        text = augmented[0] if isinstance(augmented, list) else augmented
        return Variant(prompt, replace(item, question=text)) if text else None


class SynonymOperator(_NlpaugOperator):
    """WordNet synonym replacement of 1–max_words keywords (nlpaug SynonymAug)."""

    name = "synonym"

    def augmenter(self, stopwords):
        import nlpaug.augmenter.word as naw

        from promptopt.robustness.wordnet import pos_tagger, require_wordnet

        require_wordnet()
        aug = naw.SynonymAug(
            aug_src="wordnet",
            aug_min=1,
            aug_max=int(self.options.get("max_words", 2)),
            stopwords=stopwords,
            tokenizer=_split,
            reverse_tokenizer=_join,
        )
        aug.model.pos_tag = pos_tagger()
        return aug


class KeyboardTypoOperator(_NlpaugOperator):
    name = "keyboard_typos"

    def augmenter(self, stopwords):
        import nlpaug.augmenter.char as nac

        return nac.KeyboardAug(
            aug_char_max=int(self.options.get("max_chars", 1)),
            aug_word_max=int(self.options.get("max_words", 2)),
            include_numeric=False,
            include_special_char=False,
            stopwords=stopwords,
            tokenizer=_split,
            reverse_tokenizer=_join,
        )


class SpellingTypoOperator(_NlpaugOperator):
    name = "spelling_typos"

    def augmenter(self, stopwords):
        import nlpaug.augmenter.word as naw

        return naw.SpellingAug(
            aug_min=1,
            aug_max=int(self.options.get("max_words", 2)),
            stopwords=stopwords,
            tokenizer=_split,
            reverse_tokenizer=_join,
        )


class ClauseReorderOperator(Operator):
    """Shuffle the middle sentences of a multi-sentence question where that is safe: the first sentence
    (which introduces the entities) and the final question stay in place, and no moved sentence may start
    with a pronoun or connective that points back to its neighbour."""

    name = "clause_reorder"

    def apply(self, prompt, item, seed, context):
        sentences = _SENTENCE.split(item.question.strip())
        middle = sentences[1:-1]
        if len(middle) < 2 or any(_DEPENDENT_START.match(s) for s in middle):
            return None
        rng = random.Random(seed)
        for _ in range(10):
            order = middle[:]
            rng.shuffle(order)
            if order != middle:
                return Variant(prompt, replace(item, question=" ".join([sentences[0], *order, sentences[-1]])))
        return None


class DistractorOperator(Operator):
    """Insert an irrelevant sentence before the question's last sentence."""

    name = "distractor"
    changes_text = False  # adds content on purpose: only the protection check applies

    def apply(self, prompt, item, seed, context):
        sentences = context["distractors"]
        if not sentences:
            return None
        distractor = random.Random(seed).choice(sentences)
        parts = _SENTENCE.split(item.question.strip())
        text = " ".join([*parts[:-1], distractor, parts[-1]]) if len(parts) > 1 else f"{distractor} {item.question}"
        return Variant(prompt, replace(item, question=text))


class TautologyOperator(Operator):
    """PromptBench's StressTest: append a tautology several times."""

    name = "tautology"
    changes_text = False

    def apply(self, prompt, item, seed, context):
        phrase = str(self.options.get("phrase", " and true is true"))
        return Variant(
            prompt, replace(item, question=item.question.rstrip() + phrase * int(self.options.get("repeat", 5)))
        )


class ExemplarReorderOperator(Operator):
    """The same exemplars in another order (one order per variant index, shared by all items)."""

    name = "exemplar_reorder"
    changes_text = False

    def apply(self, prompt, item, seed, context):
        if len(prompt.exemplars) < 2:
            return None
        rng = random.Random(variant_seed(context["seed"], self.name, "prompt", context["index"]))
        order = list(prompt.exemplars)
        while order == list(prompt.exemplars):
            rng.shuffle(order)
        return Variant(prompt.with_(exemplars=tuple(order)), item)


class ExemplarReplaceOperator(Operator):
    """One exemplar swapped for another pool item (one swap per variant index, shared by all items)."""

    name = "exemplar_replace"
    changes_text = False

    def apply(self, prompt, item, seed, context):
        used = {ex.id for ex in prompt.exemplars}
        spare = [p for p in context["pool"] if p.id not in used and p.id not in context["evaluated"]]
        if not prompt.exemplars or not spare:
            return None
        rng = random.Random(variant_seed(context["seed"], self.name, "prompt", context["index"]))
        position = rng.randrange(len(prompt.exemplars))
        shots = list(prompt.exemplars)
        shots[position] = rng.choice(spare).as_exemplar()
        return Variant(prompt.with_(exemplars=tuple(shots)), item)


class FormatOperator(Operator):
    """The prompt rendered again in an equivalent format (prompt_formats.py: field separators, field-name
    casing, line joiners, the exemplar delimiter); the item, the answers and the label words stay. One format per
    variant index, shared by all items and distinct across indices (`variants`: formats per item, 1–8)."""

    name = "format"
    changes_text = False
    MAX_VARIANTS = 8

    def __init__(self, **options) -> None:
        super().__init__(**options)
        variants = options.get("variants")
        if variants is not None and (
            isinstance(variants, bool) or not isinstance(variants, int) or not 1 <= variants <= self.MAX_VARIANTS
        ):
            from promptopt.errors import ConfigError

            raise ConfigError(f"format: variants must be an integer from 1 to {self.MAX_VARIANTS}, got {variants!r}")

    def n_variants(self, suite_default: int) -> int:
        return int(self.options.get("variants") or suite_default)

    def formats(self, prompt: Prompt, seed: int, count: int) -> list:
        """`count` distinct templates that differ from the prompt's own, drawn from one seeded stream."""
        from promptopt.prompt_formats import DIMENSIONS, PromptFormat

        rng = random.Random(variant_seed(seed, self.name, "prompt", 0))
        found: list = []
        for _ in range(64 * count):
            template = PromptFormat(**{d: rng.choice(c) for d, c in DIMENSIONS.items()}).apply(prompt.template)
            if template != prompt.template and template not in found:
                found.append(template)
                if len(found) == count:
                    break
        return found

    def apply_many(self, prompt, items, seeds, context):
        index = int(context.get("index", 0))
        templates = self.formats(prompt, context["seed"], index + 1)
        if len(templates) <= index:  # a template with nothing to reformat
            return [None] * len(items)
        variant = prompt.with_(template=templates[index])
        return [Variant(variant, item) for item in items]


class ParaphraseMemo:
    """LM paraphrases already written, by (model, chat?, question, style): an item's paraphrase is the same
    for every prompt, so a session (one model) generates it once. Counts what was reused and generated."""

    def __init__(self) -> None:
        self.texts: dict[tuple[str, bool, str, int], str] = {}
        self.hits = self.misses = 0


class LMParaphraseOperator(Operator):
    """Paraphrases written by the loaded model, greedy, numbers kept; `variants` (1–3) per item, as in the
    δ_TCB paper's protocol ("2–3 variants of the question").

    Variant v uses the v-th rewording style (v = 0 is the original instruction), so the variants differ
    without sampling and each is deterministic whatever else is in the batch. An instruct model gets the
    request as a chat turn; a model without a chat template (a base model) gets a plain completion prompt
    with one worked example, read up to the end of the line (the question's own newlines become spaces).
    """

    name = "lm_paraphrase"
    STYLES = (
        "Rewrite the following text in different words.",
        "Say the same thing as the following text in simpler words.",
        "Rephrase the following text with a different sentence structure.",
    )
    INSTRUCTION = (
        "{style} Keep its meaning, every number and every name unchanged. Reply with the rewritten text only.\n\n{text}"
    )
    COMPLETION = (
        "{style} Keep its meaning, every number and every name unchanged.\n\n"
        "Text: The meeting was moved to 3 pm because Anna was late.\n"
        "Rewritten: Because Anna was late, the meeting was pushed back to 3 pm.\n\n"
        "Text: {text}\nRewritten:"
    )

    def __init__(self, **options) -> None:
        super().__init__(**options)
        variants = options.get("variants")
        if variants is not None and (
            isinstance(variants, bool) or not isinstance(variants, int) or not 1 <= variants <= len(self.STYLES)
        ):
            from promptopt.errors import ConfigError

            raise ConfigError(
                f"lm_paraphrase: variants must be an integer from 1 to {len(self.STYLES)}, got {variants!r}"
            )

    def n_variants(self, suite_default: int) -> int:
        return int(self.options.get("variants") or min(suite_default, len(self.STYLES)))

    @staticmethod
    def token_limit(question_tokens: int) -> int:
        """New tokens a paraphrase may take: 1.5× its own question + 16, whatever else is batched with it."""
        return int(question_tokens * 1.5) + 16

    def _request(self, lm, style: str, question: str) -> list[int]:
        tok = lm.tokenizer
        if lm.has_chat_template:
            text = tok.apply_chat_template(
                [{"role": "user", "content": self.INSTRUCTION.format(style=style, text=question)}],
                tokenize=False,
                add_generation_prompt=True,
            )
            return tok(text, add_special_tokens=False)["input_ids"]
        return tok(self.COMPLETION.format(style=style, text=" ".join(question.split())))["input_ids"]

    def apply_many(self, prompt, items, seeds, context):
        lm = context["lm"]
        index = int(context.get("index", 0)) % len(self.STYLES)
        style = self.STYLES[index]
        key = (lm.name, lm.has_chat_template)
        memo = context.get("paraphrases") or ParaphraseMemo()  # the caller's memo, or one for this call
        todo = [item for item in items if (*key, item.question, index) not in memo.texts]
        memo.hits += len(items) - len(todo)
        memo.misses += len(todo)
        if todo:
            contexts = [self._request(lm, style, item.question) for item in todo]
            limits = [self.token_limit(len(ids)) for ids in lm.tokenizer([item.question for item in todo])["input_ids"]]
            stop = ["\n\n"] if lm.has_chat_template else ["\n"]
            runner = context["runner"]
            # Requests are one question plus a fixed instruction, far shorter than scored prompts: 4× the
            # rows fit, and a decoding step reads every weight once however many rows it carries.
            gens = runner.generate(
                contexts, max_new_tokens=limits, stop=stop, keep_hidden=False, batch_size=4 * runner.batch_size
            )
            for item, gen in zip(todo, gens):
                memo.texts[(*key, item.question, index)] = gen.text.strip()
        variants = []
        for item in items:
            text = memo.texts[(*key, item.question, index)]
            variants.append(Variant(prompt, replace(item, question=text)) if text else None)
        return variants


# The operators a suite's family may name: a new one is a class with `name`, `changes_text` and `__call__`, added
# with `OPERATORS.register(cls)` or an entry point in the group `promptopt.perturbations` (promptopt/registry.py).
OPERATORS: Registry[type] = Registry("perturbation operator", group="promptopt.perturbations")
for _operator in (
    SynonymOperator,
    LMParaphraseOperator,
    ClauseReorderOperator,
    DistractorOperator,
    TautologyOperator,
    KeyboardTypoOperator,
    SpellingTypoOperator,
    ExemplarReorderOperator,
    ExemplarReplaceOperator,
    FormatOperator,
):
    OPERATORS.register(_operator)
