"""`Server`: a prompt card answering inputs on a model, exactly as the scorer answered the card's items.

The card's prompt (or an ensemble card's members) is scored by the project's own `Scorer` — the same token ids,
the same shared-prefix reuse, the same read position — and decided by the card's rule through the same functions
export and verify use (`scoring.calibration.decide_table`, `scoring.ensemble.ensemble_test`); a generative card is
generated and read by the task's own extraction. What an answer returns: the answer, each label's log-likelihood,
the rule's decision scores, δ_TCB and the cheap signals at the critical point (on the distribution the decision
reads), and the card's fragility flag with its signal's value and τ.

A `pmi` card also scores each input's choices after the prompt rendered with its content-free input: that context
is the same for every input, and the scorer keeps each (context, choice) log-likelihood, so an input costs its
choices' tokens once more and a choice text served before costs nothing (bench/bench_decision.py measures it).

A *batch* is one call's inputs (one HTTP request): an adaptive batch rule re-estimates its bias from a batch of at
least `min_batch` inputs and uses its stored bias below that (a single input always does); each answer of such a
card says which it was, and on how many inputs (`batch_adaptive`). `answer_groups` scores
several batches in one pass over the model, and a request's answers never depend on another request's inputs: a
card with an adaptive rule decides each batch on its own; under every other rule an input is decided alone whatever
it is batched with, so the pass is decided at once.
"""

from __future__ import annotations

import itertools
import math
import threading
from pathlib import Path

from promptopt.card import sha256_json
from promptopt.errors import ConfigError, PromptTooLongError, UnsupportedError, UserError
from promptopt.serving.inputs import Input, InputError, Limits, parse_input
from promptopt.serving.signals import SIGNALS, flag_from_card

_GOLD_COLUMNS = ("correct", "gold", "acc", "acc_norm", "gold_logprob", "ppl", "answer_nll", "target_nll")
_NOT_SERVED = ("code",)  # answers judged by running them: the server never executes generated code


def _number(value):
    """A JSON-safe number: finite floats as they are, +inf as the string "inf", NaN as None."""
    if value is None:
        return None
    x = float(value)
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


class _Refused(InputError):
    """An input the tokenizer raised on (not a UserError): the input's fault only where other inputs pass."""


class Server:
    """A card loaded with a model, answering inputs as the scorer does. Thread-safe: one scoring call at a time.

    `card`: a card file (version 2, validated) or its mapping. `model`: any model spec the CLI takes (default: the
    card's `model.spec`); `lm`: an already loaded model to use instead (tests and benchmarks share one). `dtype` and
    `quantize` (4bit, 8bit, or "none" for full precision): default the card's recorded ones (model.dtype,
    model.quantization), so the numbers are the ones export measured."""

    def __init__(
        self,
        card: str | Path | dict,
        *,
        model: str | None = None,
        lm=None,
        device: str = "auto",
        dtype: str | None = None,
        quantize: str | None = None,
        batch_size: int | str = 16,
        limits: Limits | None = None,
    ) -> None:
        from promptopt.models.load import ModelConfig, quantize_of
        from promptopt.production import card_prompt, load_prompt
        from promptopt.scoring import Scorer
        from promptopt.scoring.card_answers import card_members
        from promptopt.tasks.catalog import load_task_spec
        from promptopt.tasks.data import TaskData

        loaded = load_prompt(card) if isinstance(card, (str, Path)) else card_prompt(card, "card")
        self.where = loaded.where
        self.card = loaded.card
        if loaded.version != 2:
            raise ConfigError(f"{self.where}: promptopt_card: serving needs a version-2 card (`promptopt export`)")
        answer_type = self.card["answer"]["type"]
        if answer_type in _NOT_SERVED:
            raise UnsupportedError(
                f"{self.where}: answer.type {answer_type}: a code card's answers are judged by running them; "
                "the server does not run generated code"
            )
        task = self.card["data"]["task"]
        try:
            spec = load_task_spec(task)
        except UserError as exc:
            raise ConfigError(f"{self.where}: data.task: cannot load the recorded task '{task}' ({exc})") from None
        if spec.answer_type != answer_type:
            raise ConfigError(f"{self.where}: answer.type {answer_type} but task {task} reads {spec.answer_type}")
        self.members = card_members(self.card, self.where)
        self.flag = flag_from_card(self.card, self.where)
        self.limits = limits or Limits()
        self.fixed_choices = tuple(self.card["answer"]["choices"]) if self.card["answer"].get("choices") else None
        self.generative = spec.generative
        recorded = self.card["model"]
        self.model_spec = model or recorded["spec"]
        if lm is None:
            if dtype is None and recorded.get("dtype") in ("float32", "bfloat16", "float16"):
                dtype = recorded["dtype"]
            quantize = quantize_of(recorded.get("quantization")) if quantize is None else quantize
            quantize = None if quantize == "none" else quantize  # "none": full precision, whatever the card's
            config = ModelConfig(spec=self.model_spec, device=device, dtype=dtype, quantize=quantize)
            stand_in = config.stand_in()  # a ModelRunner the Python API was given (promptopt.serve)
            lm = stand_in.lm if stand_in is not None else config.load()
        else:
            stand_in = None
            self.model_spec = model or getattr(lm, "name", self.model_spec)
        self.scorer = Scorer(lm, TaskData(spec, [], [], []), batch_size=batch_size, runner=stand_in)
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self.identity = self._identity()

    # --- what is being served -----------------------------------------------------------------------
    def _identity(self) -> dict:
        check = self.card["check"]
        flag = self.flag
        return {
            "card_sha256": sha256_json(self.card),
            "prompt_sha256": sha256_json(check["prompt_sha256"]),
            "check_token_ids_sha256": check["token_ids_sha256"],
            "task": self.card["task"],
            "answer_type": self.card["answer"]["type"],
            "model": self.model_spec,
            "card_model": self.card["model"]["spec"],
            "decision": "generate" if self.generative else self._decision_name(),
            "flag": None if flag is None else {"signal": flag.signal.name, "threshold": flag.threshold},
        }

    def _decision_name(self) -> str:
        if len(self.members) > 1:
            return f"ensemble of {len(self.members)} ({', '.join(m.rule.name for m in self.members)})"
        return self.members[0].rule.name

    @property
    def needs_choices(self) -> bool:
        """Inputs must bring their choices: a choice task whose items each have their own."""
        return self.fixed_choices is None and self.scorer.data.spec.answer.has_choices

    def warm(self) -> None:
        """One pass over two placeholder inputs that differ from their first character: the card prompt's shared
        block (instruction, exemplars, the template up to the question) lands in the runner's prefix cache, and
        the output head's one-time statistics are computed, before the first request. A lone first request then
        runs its own tokens behind that block instead of the whole prompt. Generative cards are not warmed (their
        pass would generate)."""
        if self.generative:
            return
        choices = ("a", "b") if self.needs_choices else None
        self.answer_groups([[Input("a", choices), Input("b", choices)]])

    # --- answering ----------------------------------------------------------------------------------
    def answer(self, inputs: list) -> list[dict]:
        """One batch's answers, in order (`inputs`: Input objects or {"question", "choices"} mappings). A bad input
        raises InputError naming it."""
        batch = [
            i if isinstance(i, Input) else parse_input(i, f"inputs[{k}]", self.limits, needs_choices=self.needs_choices)
            for k, i in enumerate(inputs)
        ]
        result = self.answer_groups([batch])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def answer_groups(self, groups: list[list[Input]]) -> list[list[dict] | InputError]:
        """Several batches (requests) scored in one pass over the model, each answered as if alone (`_answer_batches`);
        a batch with a bad input gets its InputError in its place and the others are answered.

        Whether an input fits the model is checked by the pass itself (scoring tokenizes every input before any
        forward and refuses one that does not fit); only when the pass fails are the inputs checked one by one, so
        the bad ones (too long, or raising in the tokenizer, as a lone surrogate does) get their 422 and the rest are
        scored again: one request's input never fails the others'. A failure no input explains stands (a bug).
        Checking every input first tokenized each whole prompt twice. A generative card is checked first (its limit
        counts the tokens it may generate)."""
        with self._lock:
            out: list = [None] * len(groups)
            items_of = {}
            for g, batch in enumerate(groups):
                try:
                    items_of[g] = self._items(batch)
                    if self.generative:
                        self._check_fits(items_of[g])
                except InputError as exc:
                    items_of.pop(g, None)
                    out[g] = exc
            if not items_of:
                return out
            try:
                answers = self._answer_batches(list(items_of.values()))
            except Exception:  # an input too long, one whose answer tokenizes to nothing, one the tokenizer refuses
                refused = {}
                for g in list(items_of):
                    try:
                        self._check_fits(items_of[g])
                    except InputError as exc:
                        refused[g] = exc
                if not refused or (
                    len(refused) == len(items_of) and all(isinstance(e, _Refused) for e in refused.values())
                ):
                    raise  # no input is to blame, or every one (the tokenizer itself may be what fails): it stands
                for g, exc in refused.items():
                    out[g] = exc
                    del items_of[g]
                answers = self._answer_batches(list(items_of.values())) if items_of else []
            for g, batch_answers in zip(items_of, answers):
                out[g] = batch_answers
            return out

    def _items(self, batch: list[Input]) -> list:
        """Scorer items for one batch (a placeholder gold: nothing served is judged), their choices checked."""
        from promptopt.tasks.item import Item

        items = []
        for k, given in enumerate(batch):
            choices = self._choices(given, f"inputs[{k}]")
            item_id = f"serve-{next(self._ids)}"
            if choices is not None:
                item = Item(id=item_id, question=given.question, gold=0, target=choices[0], choices=choices)
            else:
                item = Item(id=item_id, question=given.question, gold="0", target="0")
            items.append(item)
        return items

    def _check_fits(self, items: list) -> None:
        """An InputError (422) naming the first of a batch's items that does not fit the model under some member's
        prompt, or whose answer tokenizes to nothing, or that the tokenizer refuses outright (`_Refused`)."""
        for k, item in enumerate(items):
            for member in self.members[: 1 if self.generative else None]:
                try:
                    self.scorer.check_fits(member.prompt, [item])
                except PromptTooLongError as exc:
                    raise InputError(f"inputs[{k}]: {str(exc).split(': ', 1)[-1]}", 422) from None
                except UserError as exc:
                    raise InputError(f"inputs[{k}]: {exc}", 422) from None
                except Exception as exc:
                    raise _Refused(
                        f"inputs[{k}]: the model's tokenizer cannot take this input ({type(exc).__name__})", 422
                    ) from None

    def _choices(self, given: Input, where: str) -> tuple[str, ...] | None:
        if not self.scorer.data.spec.answer.has_choices:
            if given.choices is not None:
                raise InputError(f"{where}.choices: task {self.card['task']} has no choices (it generates its answer)")
            return None
        if given.choices is None:
            if self.fixed_choices is None:
                raise InputError(f"{where}.choices: missing (this task's items each have their own choices)")
            return self.fixed_choices
        if self.fixed_choices is not None and tuple(given.choices) != self.fixed_choices:
            raise InputError(
                f"{where}.choices: this card answers with its fixed choices {list(self.fixed_choices)}; "
                "omit choices or give exactly those"
            )
        for member in self.members:
            try:
                member.prompt.choice_texts(given.choices)
            except UserError as exc:
                raise InputError(f"{where}.choices: {exc}", 422) from None
        return tuple(given.choices)

    def _answer_batches(self, batches: list[list]) -> list[list[dict]]:
        """Per batch, the answers `scoring.card_answers.answer_table` gives for those items alone. One pass over
        the model scores them all. A rule that adapts to its batch then decides each batch on its own; any other
        rule decides an input alone whatever it is batched with, so the whole pass is decided (and turned into
        answers) at once: two passes of 32 single-input requests take 0.925x the time of deciding request by request
        (paired, bench/MEASUREMENTS.md 2026-12-06)."""
        from promptopt.scoring.calibration import decide_table, with_references
        from promptopt.scoring.ensemble import ensemble_test

        flat = [item for batch in batches for item in batch]
        spans, start = [], 0
        for batch in batches:
            spans.append((start, start + len(batch)))
            start += len(batch)
        if self.generative:
            tables = [self.scorer.score(self.members[0].prompt, flat).table]
        else:
            units = spans if any(m.rule.adapts_to_batch for m in self.members) else [(0, len(flat))]
            head, eps = self.scorer.lm.output_head, self.scorer.eps
            per_member = []
            for member in self.members:
                raw = self.scorer.score(member.prompt, flat)
                # pmi: each input's choices after the prompt's content-free context (shared by every input; the
                # scorer keeps each (context, choice) log-likelihood, so a choice text seen before costs nothing)
                raw.table = with_references(self.scorer, member.rule, member.prompt, flat, raw.table)
                per_member.append(
                    [
                        decide_table(
                            member.rule,
                            raw.table.iloc[a:b].reset_index(drop=True) if (a, b) != (0, len(flat)) else raw.table,
                            hidden=raw.hidden[a:b] if raw.hidden is not None else None,
                            head=head,
                            eps=eps,
                        )
                        for a, b in units
                    ]
                )
            tables = []
            for u in range(len(units)):
                decided = [member[u] for member in per_member]
                tables.append(decided[0] if len(decided) == 1 else _ensemble(decided, ensemble_test))
        rows = []
        for table in tables:
            rows += table.drop(columns=[c for c in _GOLD_COLUMNS if c in table]).to_dict("records")
        answers = [self._answer(row, item) for row, item in zip(rows, flat)]
        out = [answers[a:b] for a, b in spans]
        for batch_answers in out:
            adaptive = self._batch_adaptive(len(batch_answers))
            if adaptive is not None:
                for answer in batch_answers:
                    answer["batch_adaptive"] = adaptive
        return out

    def _batch_adaptive(self, size: int) -> dict | None:
        """How a batch-adaptive rule decided a batch of `size` inputs (None for any other rule): on a bias
        re-estimated from this batch (`bias: "batch"`, at least `min_batch` inputs, as `DecisionRule.bias_for`
        decides) or on the card's stored one. An ensemble's adaptive members are listed in member order."""
        if self.generative:
            return None
        rules = [m.rule for m in self.members if m.rule.adapts_to_batch]
        if not rules:
            return None
        bias = ["batch" if size >= r.min_batch else "stored" for r in rules]
        min_batch = [r.min_batch for r in rules]
        if len(rules) == 1:
            bias, min_batch = bias[0], min_batch[0]
        return {"batch_size": size, "min_batch": min_batch, "bias": bias}

    def _answer(self, row: dict, item) -> dict:
        signals = {s.name: _number(row.get(s.name)) for s in SIGNALS}
        out: dict = {}
        if self.generative:
            out["answer"] = row.get("pred") or None
            out["output"] = row.get("output")
            out["label_logprobs"] = None
            out["critical_fallback"] = bool(row.get("critical_fallback", False))
        else:
            pred = int(row["pred"])
            texts = list(item.choices)
            out["answer"] = texts[pred] if 0 <= pred < len(texts) else None  # -1: a tie between equal choices
            out["index"] = pred
            out["label_logprobs"] = (
                dict(zip(texts, map(float, row["choice_logprobs"])))
                if "choice_logprobs" in row
                else [dict(zip(texts, map(float, lp))) for lp in row["member_logprobs"]]
            )
            out["decision_scores"] = dict(zip(texts, map(float, row["decision_scores"])))
        out["tcb"] = signals["tcb"]
        out["signals"] = signals
        out["flagged"] = None if self.flag is None else self.flag(row.get(self.flag.signal.name))
        if self.flag is not None:
            out["flag"] = {
                "signal": self.flag.signal.name,
                "value": signals[self.flag.signal.name],
                "threshold": self.flag.threshold,
                "direction": self.flag.direction,
            }
        return out


def _ensemble(tables, ensemble_test):
    """An ensemble's table (answer_table's for several members) with every signal its most fragile member's and
    each member's label log-likelihoods kept (`member_logprobs`)."""
    combined = ensemble_test(tables)
    for s in SIGNALS:
        if all(s.name in t for t in tables):
            combined[s.name] = [s.combine([float(t[s.name].iloc[i]) for t in tables]) for i in range(len(combined))]
    combined["member_logprobs"] = [[list(t["choice_logprobs"].iloc[i]) for t in tables] for i in range(len(combined))]
    return combined


__all__ = ["Server"]
