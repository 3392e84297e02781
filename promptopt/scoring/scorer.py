"""Score a prompt over task items: correctness plus δ_TCB, V_eff, margin and local PPL at the critical point.

How an item is asked and judged comes from its task's answer type (tasks/answers.py): log-likelihood
types score every choice's continuation; generative types generate, extract and judge. Critical
prediction point: log-likelihood types — the position that predicts the first token of the answer;
generative types — the position that predicts the first token of the extracted answer (the final number
after the chain of thought, the chosen letter, the short answer, the first token of the code). When a
generation has no extractable answer the first generated token is read and `critical_fallback` says so.
δ_TCB and its companions are computed by `promptopt.metrics.tcb` on the model's output head.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from promptopt.errors import ConfigError, PromptTooLongError, UserError
from promptopt.metrics.stats import wilson_interval
from promptopt.metrics.tcb import OutputGeometry
from promptopt.models import GenerationResult, LoadedModel, ModelRunner, Runner
from promptopt.prompts import Prompt
from promptopt.scoring.tokens import encode_texts
from promptopt.tasks import Item, TaskData
from promptopt.tasks.answers import Judgement

_CF_CACHE = 1 << 16  # content-free log-likelihoods kept per scorer (the pmi rule's references): ~10 MB at most
_TCB_COLUMNS = ("tcb", "jacobian_norm", "v_eff", "margin", "entropy", "top_prob", "tcb_approx", "tcb_diffuse")


@dataclass
class ScoreResult:
    table: pd.DataFrame  # one row per item
    summary: dict = field(default_factory=dict)
    # log-likelihood tasks: the final hidden state at each item's critical position (items × d, float32), what a
    # calibrated decision's δ_TCB is computed from (scoring/calibration.py) without another forward
    hidden: torch.Tensor | None = None


class Scorer:
    """Scores prompts of one task on one model; holds the runner so prefix caches survive across calls."""

    def __init__(
        self,
        lm: LoadedModel,
        data: TaskData,
        *,
        batch_size: int | str = 16,
        progress: bool = False,
        eps: float = 1.0,
        runner: ModelRunner | None = None,
    ):
        """`runner`: a ModelRunner to score with instead of promptopt's Runner over `lm` (its `lm` is `lm`)."""
        self.lm, self.data, self.eps = lm, data, eps
        self.runner = runner if runner is not None else Runner(lm, batch_size=batch_size, progress=progress)

    # --- tokenization --------------------------------------------------------------------------
    def _encode(self, texts: list[str], prompt: Prompt) -> list[list[int]]:
        """Token ids of each text; a text repeated (one context per choice) is tokenized once."""
        unique = list(dict.fromkeys(texts))
        ids = dict(zip(unique, encode_texts(self.lm.tokenizer, unique, add_special_tokens=prompt.add_special_tokens)))
        return [ids[text] for text in texts]

    def _pairs(self, contexts: list[str], continuations: list[str], prompt: Prompt, item_ids: list[str]):
        """lm-eval's encoding: trailing context spaces move to the continuation; the continuation's ids
        are those of (context + continuation) beyond the context's own ids."""
        ctx_texts, whole_texts = [], []
        for ctx, cont in zip(contexts, continuations):
            n_spaces = len(ctx) - len(ctx.rstrip(" "))
            if n_spaces:
                ctx, cont = ctx[:-n_spaces], ctx[-n_spaces:] + cont
            ctx_texts.append(ctx)
            whole_texts.append(ctx + cont)
        pairs = []
        encoded = self._encode(ctx_texts + whole_texts, prompt)  # one batch: its threads share both halves
        for ctx_ids, whole_ids, item_id in zip(encoded[: len(ctx_texts)], encoded[len(ctx_texts) :], item_ids):
            cont_ids = whole_ids[len(ctx_ids) :]
            if not cont_ids:
                raise UserError(f"item {item_id}: the answer tokenizes to nothing after the context")
            self._check_length(len(ctx_ids) + len(cont_ids), item_id)
            pairs.append((ctx_ids, cont_ids))
        return pairs

    def _check_length(self, n_tokens: int, item_id: str) -> None:
        if n_tokens > self.lm.context_length:
            raise PromptTooLongError(
                f"item {item_id}: prompt is {n_tokens} tokens but model {self.lm.name} takes {self.lm.context_length}"
                f"{self._item_source(item_id)}"
            )

    def _item_source(self, item_id: str) -> str:
        """' (<file> line N, <field>: C characters)' for an item of the task's data: where its text came from."""
        data = self.data
        item = next((i for i in (*data.pool, *data.dev, *data.test) if i.id == item_id and i.where), None)
        field = data.spec.fields.get("question")
        if item is None or field is None:
            return ""
        return f" ({item.where}, {field.key}: {len(item.question):,} characters)"

    def _check(self, prompt: Prompt, items: list[Item]) -> None:
        if prompt.task != self.data.spec.name:
            raise ConfigError(f"the prompt is for task '{prompt.task}', not '{self.data.spec.name}'")
        if not items:
            raise UserError(f"task {self.data.spec.name}: no items to score")
        leaked = {ex.id for ex in prompt.exemplars} & {it.id for it in items}
        if leaked:
            raise UserError(
                f"exemplar {sorted(leaked)[0]} is also an evaluated item (exemplars must come from the pool)"
            )
        if self.data.spec.answer.has_choices and prompt.template.label_words:
            prompt.choice_texts(items[0].choices)  # raises if the label words do not fit
        if any(item.partial for item in items) and (
            prompt.template.label_words or prompt.template.choice_format == "letter"
        ):
            what = "label_words" if prompt.template.label_words else "choice_format: letter"
            raise ConfigError(
                f"task {self.data.spec.name}: its choices are contexts, each followed by one continuation (lm-eval's "
                f"multiple inputs), so the prompt's template.{what} cannot apply"
            )

    def check_fits(self, prompt: Prompt, items: list[Item]) -> None:
        """Raise PromptTooLongError if `prompt` on one of `items` would not fit the model, as scoring would,
        but without running the model (a search checks its longest prompts this way before it starts)."""
        tok = self.lm.tokenizer
        contexts = [prompt.context(item.question, item.choices, tok) for item in items]
        if self.data.spec.answer.generative:
            for ids, item in zip(self._encode(contexts, prompt), items):
                self._check_length(len(ids) + self.data.spec.max_new_tokens, item.id)
            return
        ctxs, conts, _, owners = self._choice_requests(prompt, items)
        self._pairs(ctxs, conts, prompt, [items[i].id for i in owners])

    def _choice_requests(self, prompt: Prompt, items: list[Item]):
        """(contexts, continuations, scored texts, item index) of every choice. A choice is scored as the
        continuation of the item's context; partial evaluation (lm-eval's multiple inputs, Winogrande) scores the
        item's one continuation after each choice, which is a context. The scored texts are what acc_norm divides
        by, as lm-eval: the choices' own texts (the contexts, for partial evaluation)."""
        tok = self.lm.tokenizer
        contexts, conts, texts, owners = [], [], [], []
        for idx, item in enumerate(items):
            if item.partial:
                continuation = prompt.continuation(item.continuation)
                for choice in item.choices:
                    contexts.append(prompt.context(choice, None, tok))
                    conts.append(continuation)
                    texts.append(choice)
                    owners.append(idx)
                continue
            ctx = prompt.context(item.question, item.choices, tok)
            for text in prompt.choice_texts(item.choices):
                contexts.append(ctx)
                conts.append(prompt.continuation(text))
                texts.append(text)
                owners.append(idx)
        return contexts, conts, texts, owners

    # --- content-free references (the pmi decision rule) ------------------------------------------------
    def content_free_logprobs(
        self, prompt: Prompt, items: list[Item], texts: tuple[str, ...]
    ) -> list[list[list[float]]]:
        """Per item, per content-free text x_j, each choice's summed log-likelihood after the prompt rendered with
        x_j in place of the item's question: the same instruction, exemplars, template and the item's own choices
        (lm-eval's encoding, as `_pairs`). A context that renders to no tokens reads the first choice token after
        the tokenizer's BOS (EOS where it has none), as lm-eval does for its unconditional requests.

        What it costs: the content-free context is the same for every input of one prompt, so per input it is the
        input's choices scored after that shared context (one short forward each, the context's prefix reused), and
        nothing at all for a (context, choice) pair seen before: the log-likelihoods are kept per (context ids,
        continuation ids) for the life of this scorer (`_CF_CACHE` entries at most). A partial-evaluation item
        (its choices are contexts) has one shared continuation, whose content-free reference is the same for every
        choice: zeros, which decide as argmax."""
        from dataclasses import replace

        cache = self.__dict__.setdefault("_content_free", {})
        out: list[list[list[float]]] = [[[0.0] * len(item.choices) for _ in texts] for item in items]
        cf_items, where = [], []
        for i, item in enumerate(items):
            if item.partial or item.choices is None:
                continue
            for j, text in enumerate(texts):
                cf_items.append(replace(item, id=f"{item.id}#content-free-{j}", question=text))
                where.append((i, j))
        if not cf_items:
            return out
        contexts, conts, _, owners = self._choice_requests(prompt, cf_items)
        pairs = []
        for ctx, cont, owner in zip(contexts, conts, owners):
            if ctx.strip(" "):
                pairs.extend(self._pairs([ctx], [cont], prompt, [cf_items[owner].id]))
                continue
            # an empty context: lm-eval's unconditional request ("", continuation) -> [prefix token] + continuation
            cont_ids = self._encode([ctx + cont], prompt)[0]
            tok = self.lm.tokenizer
            prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
            if cont_ids and cont_ids[0] == prefix:
                cont_ids = cont_ids[1:]
            if not cont_ids:
                raise UserError(f"item {cf_items[owner].id}: the answer tokenizes to nothing")
            pairs.append(([prefix], cont_ids))
        keys = [(tuple(c), tuple(t)) for c, t in pairs]
        values = {k: cache[k] for k in keys if k in cache}
        missing = list(dict.fromkeys(k for k in keys if k not in values))
        if missing:
            results = self.runner.loglikelihood([(list(c), list(t)) for c, t in missing])
            fresh = {k: float(r.logprob) for k, r in zip(missing, results)}
            values.update(fresh)
            if len(cache) + len(fresh) > _CF_CACHE:
                cache.clear()
            cache.update(fresh)
        cursor = 0
        for (i, j), cf in zip(where, cf_items):
            n = len(cf.choices)
            out[i][j] = [values[k] for k in keys[cursor : cursor + n]]
            cursor += n
        return out

    # --- scoring --------------------------------------------------------------------------------
    def score(self, prompt: Prompt, items: list[Item]) -> ScoreResult:
        self._check(prompt, items)
        start = time.perf_counter()
        hidden = None
        if self.data.spec.answer.generative:
            table = self._score_generative(prompt, items)
        else:
            table, hidden = self._score_choices(prompt, items)
        wall = time.perf_counter() - start
        return ScoreResult(table, summarize(table, wall_seconds=wall), hidden)

    def _tcb(self, hidden: torch.Tensor, targets: list[int]) -> dict[str, np.ndarray]:
        """δ_TCB = ε/‖J‖_F and its companions at the critical states (exact closed form, metrics/tcb.py)."""
        head: OutputGeometry = self.lm.output_head
        with torch.inference_mode():
            res = head(hidden.to(head.weight.device), eps=self.eps, target=torch.tensor(targets))
        return _tcb_columns({name: value.cpu().numpy() for name, value in res.to_dict().items()})

    def _score_choices(self, prompt: Prompt, items: list[Item]) -> tuple[pd.DataFrame, torch.Tensor]:
        """Per item: every choice's log-likelihood (summed over its tokens, and per character as lm-eval's
        acc_norm), both argmax decisions, and δ_TCB and its companions at the critical state (whose hidden
        state is returned beside the table).

        The critical state is the one that predicts the first token of the gold answer: for choices that continue
        the item's context, the context's last position (every choice shares it); for partial evaluation (the
        choices are contexts), the last position of the gold context, predicting the shared continuation's first
        token. `target_nll` is −log p of that token there; `answer_nll` and `ppl` are over the gold's whole
        continuation."""
        contexts, conts, texts, owners = self._choice_requests(prompt, items)
        pairs = self._pairs(contexts, conts, prompt, [items[i].id for i in owners])
        starts = np.cumsum([0] + [len(item.choices) for item in items])
        gold_first = [pairs[start + item.gold][1][0] for start, item in zip(starts, items)]
        # δ_TCB at the critical state, aimed at the gold's first token; the runner reads it from the logits of the
        # log-probs. Each item's requests form a group: its context runs once where no few-shot prefix does
        results = self.runner.loglikelihood(
            pairs, tcb_targets=[gold_first[i] for i in owners], eps=self.eps, groups=owners
        )
        rows, critical, hidden = [], [], []
        cursor = 0
        for item in items:
            n = len(item.choices)
            lls = np.array([r.logprob for r in results[cursor : cursor + n]])
            # lm-eval's acc_norm: the choice's own character length, without the answer delimiter before it
            lengths = np.array([len(t) for t in texts[cursor : cursor + n]], dtype=float)
            gold_pairs, gold_res = pairs[cursor + item.gold], results[cursor + item.gold]
            read = cursor + item.gold if item.partial else cursor  # the choices share the context's critical state
            critical.append(results[read].tcb)
            hidden.append(results[read].hidden)
            pred, pred_norm = int(lls.argmax()), int((lls / lengths).argmax())
            scored = texts if item.partial else conts  # what tells two choices apart
            pred, pred_norm = (
                -1 if scored[cursor : cursor + n].count(scored[cursor + p]) > 1 else p for p in (pred, pred_norm)
            )  # a tie between equal choices (allowed by the task) is wrong
            gold_tokens = len(gold_pairs[1])
            rows.append(
                {
                    "item_id": item.id,
                    "gold": item.gold,
                    "pred": pred,
                    "pred_norm": pred_norm,
                    "acc": pred == item.gold,
                    "acc_norm": pred_norm == item.gold,
                    "choice_logprobs": lls.tolist(),
                    "choice_logprobs_norm": (lls / lengths).tolist(),
                    "choice_first_tokens": [pair[1][0] for pair in pairs[cursor : cursor + n]],
                    "gold_logprob": gold_res.logprob,
                    "ppl": math.exp(-gold_res.logprob / gold_tokens),
                    "answer_nll": -gold_res.logprob / gold_tokens,
                }
            )
            cursor += n
        table = pd.DataFrame(rows)
        table.insert(1, "correct", table[self.data.spec.metric])
        for name, values in _tcb_columns({name: [tcb[name] for tcb in critical] for name in critical[0]}).items():
            table[name] = values
        return table, torch.stack(hidden).float()

    def generate_answers(
        self,
        prompt: Prompt,
        items: list[Item],
        *,
        processor_factory=None,
        temperature: float = 0.0,
        seed: int | None = None,
        keep_hidden: bool = True,
    ) -> list[tuple[GenerationResult, Judgement]]:
        """Generate each item's answer with the task's decoding settings and judge it (`keep_hidden=False`:
        without the per-token hidden states, which only δ_TCB scoring reads)."""
        spec, tok = self.data.spec, self.lm.tokenizer
        contexts = [prompt.context(item.question, item.choices, tok) for item in items]
        ctx_ids = self._encode(contexts, prompt)
        for ids, item in zip(ctx_ids, items):
            self._check_length(len(ids) + spec.max_new_tokens, item.id)
        gens = self.runner.generate(
            ctx_ids,
            max_new_tokens=spec.max_new_tokens,
            stop=spec.stop,
            processor_factory=processor_factory,
            temperature=temperature,
            seed=seed,
            keep_hidden=keep_hidden,
        )
        return [(gen, self.judge(item, gen.text, prompt)) for item, gen in zip(items, gens)]

    def _score_generative(self, prompt: Prompt, items: list[Item]) -> pd.DataFrame:
        spec, tok = self.data.spec, self.lm.tokenizer
        judged = self.generate_answers(prompt, items)
        contexts = [prompt.context(item.question, item.choices, tok) for item in items]
        ids = [i.id for i in items]
        golds = [prompt.continuation(spec.answer.gold_continuation(prompt, item)) for item in items]
        gold_pairs = self._pairs(contexts, golds, prompt, ids)
        spans = [spec.answer.answer_span(prompt, item) for item in items]
        span_pairs = self._pairs(
            [c + prompt.continuation(pre) if pre else c for c, (pre, _) in zip(contexts, spans)],
            [ans if pre else prompt.continuation(ans) for pre, ans in spans],
            prompt,
            ids,
        )
        gold_results = self.runner.loglikelihood(gold_pairs)
        span_results = gold_results if span_pairs == gold_pairs else self.runner.loglikelihood(span_pairs)
        rows, hidden, targets, has_critical = [], [], [], []
        for item, (gen, (answer, start, correct)), gold_pair, gold_res, span_pair, span_res in zip(
            items, judged, gold_pairs, gold_results, span_pairs, span_results
        ):
            critical = (
                next((i for i, end in enumerate(gen.token_char_ends) if end > start), None) if start >= 0 else None
            )
            fallback = critical is None and bool(gen.tokens)
            if fallback:
                critical = 0  # no answer found: read the first generated token, and say so
            has_critical.append(critical is not None)
            if critical is not None:
                hidden.append(gen.hidden[critical])
                targets.append(gen.tokens[critical])
            rows.append(
                {
                    "item_id": item.id,
                    "gold": spec.answer.gold_label(item),
                    "pred": answer,
                    "correct": correct,
                    "generated_tokens": len(gen.tokens),
                    "finish_reason": gen.finish_reason,
                    "critical_index": critical if critical is not None else -1,
                    "critical_fallback": fallback,
                    "gold_logprob": gold_res.logprob,
                    "ppl": math.exp(-gold_res.logprob / len(gold_pair[1])),
                    "answer_nll": -span_res.logprob / len(span_pair[1]),
                    "output": gen.text,
                }
            )
        table = pd.DataFrame(rows)
        if hidden:
            metrics = self._tcb(torch.stack(hidden), targets)
            mask = np.array(has_critical)
            for name, values in metrics.items():
                column = np.full(len(items), np.nan if values.dtype.kind == "f" else -1, dtype=values.dtype)
                column[mask] = values
                table[name] = column
        return table

    def judge(self, item: Item, text: str, prompt: Prompt | None = None) -> Judgement:
        """(extracted answer, where it starts in `text` or -1, correct), by the task's answer type; the
        prompt says how choices were shown (letters, label words or text)."""
        return self.data.spec.answer.read(self.data.spec, item, text, prompt or self.data.default_prompt())


def _tcb_columns(metrics: dict) -> dict[str, np.ndarray]:
    """The table's δ_TCB columns from TCBResult's fields (an array or list of numbers per field)."""
    out = {name: np.asarray(metrics[name]) for name in _TCB_COLUMNS}
    out["target_nll"] = np.asarray(metrics["nll"])
    out["predicted_token"] = np.asarray(metrics["top_token"])
    return out


def summarize(table: pd.DataFrame, *, wall_seconds: float | None = None) -> dict:
    """Task-level numbers: accuracy with its 95% Wilson interval, δ_TCB (mean, median, geometric mean —
    it is heavy-tailed), V_eff, margin, PPL."""
    n = len(table)
    correct = int(table["correct"].sum())
    low, high = wilson_interval(correct, n)
    out = {"n": n, "accuracy": correct / n if n else float("nan"), "accuracy_ci95": [low, high]}
    if "acc_norm" in table:  # the two argmax readings; beside a calibrated rule's accuracy they say so
        raw = "_argmax" if "decision" in table and (table["decision"] != "argmax").any() else ""
        out[f"acc{raw}"] = float(table["acc"].mean())
        out[f"acc_norm{raw}"] = float(table["acc_norm"].mean())
    if "tcb" in table:
        tcb = table["tcb"].replace([np.inf], np.nan).dropna()
        out["tcb_mean"] = float(tcb.mean()) if len(tcb) else float("nan")
        out["tcb_median"] = float(tcb.median()) if len(tcb) else float("nan")
        out["tcb_geomean"] = float(np.exp(np.log(tcb).mean())) if len(tcb) else float("nan")
        out["tcb_infinite"] = int(np.isinf(table["tcb"]).sum())
        for name in ("v_eff", "margin", "target_nll"):  # an ensemble's combined table has δ_TCB alone
            if name in table:
                out[f"{name}_mean"] = float(table[name].mean())
    out["ppl_mean"] = float(table["ppl"].mean())
    if wall_seconds is not None:
        out["wall_seconds"] = wall_seconds
        out["items_per_second"] = n / wall_seconds if wall_seconds > 0 else float("nan")
    return out
