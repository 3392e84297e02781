"""Decision rules on scored tables: fit a rule's parameters, decide every item, and read δ_TCB on the
distribution the decision reads (the rules and their formulas: promptopt/decision.py).

A wrapper, like the result cache: `DecidingScorer(scorer, rule)` scores exactly as the scorer does and then
decides by the rule, so search, robustness and compare use calibrated answers without knowing about them.
What calibration costs: `contextual` scores three content-free inputs per prompt; `batch` and `affine` read
the log-probabilities the scorer computes anyway; `pmi` scores each input's choices once more after the prompt's
content-free context (shared by every input of the prompt; a (context, choice) pair seen before is free:
`Scorer.content_free_logprobs`); δ_TCB of a calibrated decision is one more δ_TCB pass over the kept critical
hidden states (no forward).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import torch

from promptopt.decision import (
    CONTENT_FREE,
    PMI_CONTENT_FREE,
    DecisionRule,
    centered,
    logsumexp,
    normalized,
    reference_row,
)
from promptopt.errors import ConfigError
from promptopt.prompts import Prompt
from promptopt.scoring.scorer import ScoreResult, summarize
from promptopt.tasks import Item

AFFINE_L2 = 1.0  # the affine map's penalty λ(‖a − 1‖² + ‖b‖²) per item: λ / n, so more dev items weigh more
CROSS_FIT_FOLDS = 5  # affine dev decisions are cross-fitted: no item is decided by parameters fit on its label
_TCB_COLUMNS = ("tcb", "jacobian_norm", "v_eff", "margin", "entropy", "top_prob", "tcb_approx", "tcb_diffuse")


def fixed_labels(items: list[Item]) -> tuple[str, ...] | None:
    """The labels every item shares (SST-2's negative/positive), or None when items have their own choices."""
    sets = {tuple(i.choices) for i in items if i.choices is not None}
    if len(sets) != 1 or any(i.choices is None for i in items):
        return None
    return next(iter(sets))


def need_fixed_labels(rule: DecisionRule, items: list[Item], task: str) -> tuple[str, ...] | None:
    """Calibrated rules learn one parameter per label, which means nothing when label k is a different answer
    on every item (ARC, COPA): refuse them there in one line."""
    labels = fixed_labels(items)
    if rule.calibrated and all(i.choices is None for i in items):
        raise ConfigError(f"decision {rule.name}: task {task} has no choices to decide between (a generative task)")
    if rule.calibrated and not rule.per_item and labels is None:
        raise ConfigError(
            f"decision {rule.name}: needs the same labels on every item (a bias per label), but task {task} gives "
            "each item its own choices; use pmi there (each choice against its content-free log-likelihood)"
        )
    return labels


def resolved(rule: DecisionRule, metric: str) -> DecisionRule:
    """The rule reading the task's metric (acc or acc_norm) unless it names its own reading."""
    return rule if rule.reading else rule.with_params(reading="acc_norm" if metric == "acc_norm" else "acc")


def rows_of(table: pd.DataFrame, rule: DecisionRule) -> list[list[float]]:
    column = rule.column()
    if column not in table:
        raise ConfigError(f"decision {rule.name}: the scored rows have no {column} (a generative task?)")
    return [list(map(float, r)) for r in table[column]]


REFERENCE_SUFFIX = "_cf"  # pmi's references beside the column they belong to: choice_logprobs_cf, ..._norm_cf


def with_references(scorer, rule: DecisionRule, prompt: Prompt, items: list[Item], table: pd.DataFrame) -> pd.DataFrame:
    """`table` (the scorer's rows of `items`) with pmi's references added: `choice_logprobs_cf` (r_k, the
    content-free log-likelihoods of each item's choices combined over the rule's content-free inputs) and
    `choice_logprobs_norm_cf` (r_k per character of the choice's scored text, for acc_norm). Other rules: as is."""
    if not rule.per_item or f"choice_logprobs{REFERENCE_SUFFIX}" in table:
        return table
    raw = scorer.content_free_logprobs(prompt, items, rule.content_free or PMI_CONTENT_FREE)
    refs = [reference_row(r) for r in raw]
    lengths = [
        [1.0] * len(item.choices) if item.partial else [float(len(t)) for t in prompt.choice_texts(item.choices)]
        for item in items
    ]
    out = table.copy()
    out[f"choice_logprobs{REFERENCE_SUFFIX}"] = refs
    out[f"choice_logprobs_norm{REFERENCE_SUFFIX}"] = [[v / n for v, n in zip(r, ln)] for r, ln in zip(refs, lengths)]
    return out


def references_of(table: pd.DataFrame, rule: DecisionRule) -> list[list[float]] | None:
    """pmi's per-row references for the rule's reading (None for rules without them)."""
    if not rule.per_item:
        return None
    column = rule.column() + REFERENCE_SUFFIX
    if column not in table:
        raise ConfigError(f"decision {rule.name}: the rows carry no content-free references ({column})")
    return [list(map(float, r)) for r in table[column]]


def fitted_on(items: list[Item], split: str) -> dict:
    ids = [i.id for i in items]
    return {
        "split": split,
        "n": len(ids),
        "ids_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(),
        "ids": ids,
    }


def content_free_items(labels: tuple[str, ...]) -> list[Item]:
    """The content-free inputs of contextual calibration, as items of the task's labels."""
    return [
        Item(id=f"content-free-{i}", question=text, gold=0, target=labels[0], choices=labels)
        for i, text in enumerate(CONTENT_FREE)
    ]


def fit_affine(rows: list[list[float]], golds: list[int]) -> tuple[list[float], list[float]]:
    """a, b minimizing the mean NLL of softmax(a ⊙ ñ + b) at the gold label + (λ/n)(‖a − 1‖² + ‖b‖²)
    (L-BFGS, analytic gradient; deterministic). b is centered."""
    from scipy.optimize import minimize

    x = np.array([normalized(r) for r in rows])
    y = np.asarray(golds)
    n, k = x.shape
    lam = AFFINE_L2 / n

    def loss(theta):
        a, b = theta[:k], theta[k:]
        z = x * a + b
        z = z - z.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        nll = -np.log(np.clip(p[np.arange(n), y], 1e-300, None)).mean()
        grad_z = p.copy()
        grad_z[np.arange(n), y] -= 1
        grad_z /= n
        ga = (grad_z * x).sum(0) + 2 * lam * (a - 1)
        gb = grad_z.sum(0) + 2 * lam * b
        return nll + lam * (((a - 1) ** 2).sum() + (b**2).sum()), np.concatenate([ga, gb])

    theta0 = np.concatenate([np.ones(k), np.zeros(k)])
    result = minimize(loss, theta0, jac=True, method="L-BFGS-B")
    a, b = result.x[:k], result.x[k:]
    return [float(v) for v in a], centered([float(v) for v in b])


def affine_params(rows: list[list[float]], golds: list[int]) -> tuple[list[float], list[float]]:
    """The affine rule's (bias, scale), in the order every rule's fit returns them (decision.RuleKind)."""
    scale, bias = fit_affine(rows, golds)
    return bias, scale


def fitted_params(rule: DecisionRule, rows: list[list[float]], golds: list[int] | None, **changes) -> DecisionRule:
    """`rule` with the parameters its kind fits on these rows (and labels, for a rule fit on them)."""
    bias, scale = rule.spec.fit_params(rows, golds if rule.spec.fit_on == "dev_labels" else None)
    return rule.with_params(bias=bias, **({"scale": scale} if scale is not None else {}), **changes)


def fit_rule(rule: DecisionRule, scorer, prompt: Prompt, items: list[Item], *, split: str = "dev") -> DecisionRule:
    """The rule with its parameters fitted for `prompt` on `items` (dev): contextual scores the content-free
    inputs, batch averages the items' label log-probabilities, affine fits on their labels."""
    spec = scorer.data.spec
    rule = resolved(rule, spec.metric)
    labels = need_fixed_labels(rule, items, spec.name)
    if not rule.calibrated:
        return rule
    if rule.per_item:  # nothing to fit: each input brings its own reference
        return rule.with_params(labels=labels, content_free=rule.content_free or PMI_CONTENT_FREE, fitted_on={})
    if rule.spec.fit_on == "content_free":
        cf_rows = rows_of(scorer.score(prompt, content_free_items(labels)).table, rule)
        mean_p = np.mean([np.exp(normalized(r)) for r in cf_rows], axis=0)
        bias = centered([float(v) for v in np.log(mean_p)])
        return rule.with_params(labels=labels, bias=tuple(bias), content_free=CONTENT_FREE, fitted_on={})
    table = scorer.score(prompt, items).table
    golds = [int(g) for g in table["gold"]]
    return fitted_params(rule, rows_of(table, rule), golds, labels=labels, fitted_on=fitted_on(items, split))


def deciding_scorer(scorer, prompt: Prompt, dev: list[Item]):
    """(the scorer that answers for `prompt` as its card would, its fitted rule): on a choice task `scorer`
    deciding by the prompt's rule fit on the `dev` items (argmax included, so every answer keeps its decision
    scores); a generative task's answers are not decided from label log-probabilities: (scorer, None)."""
    from promptopt.decision import parse_rule

    if scorer.data.spec.answer.generative:
        return scorer, None
    rule = fit_rule(parse_rule(prompt.decision), scorer, prompt, dev)
    return DecidingScorer(scorer, rule), rule


def cross_fitted_decisions(rule: DecisionRule, rows: list[list[float]], golds: list[int]) -> list[int]:
    """Decisions of dev items by a rule fit on their labels (affine) where each fold is decided by parameters fit
    on the other folds (an honest dev accuracy: an in-sample fit would flatter it against the label-free rules)."""
    n = len(rows)
    folds = min(CROSS_FIT_FOLDS, n)
    if folds < 2:
        return rule.decide(rows)
    out = [0] * n
    for f in range(folds):
        held = [i for i in range(n) if i % folds == f]
        train = [i for i in range(n) if i % folds != f]
        part = fitted_params(rule, [rows[i] for i in train], [golds[i] for i in train])
        for i, d in zip(held, part.decide([rows[i] for i in held])):
            out[i] = d
    return out


def decide_table(
    rule: DecisionRule,
    table: pd.DataFrame,
    *,
    hidden: torch.Tensor | None = None,
    head=None,
    eps: float = 1.0,
    decisions: list[int] | None = None,
) -> pd.DataFrame:
    """The table decided by a fitted rule: `pred`/`correct` become the rule's (the argmax ones stay as
    `pred_raw`/`correct_raw`), `decision_scores` holds s_k, and with the critical hidden states δ_TCB and its
    companions are read on the shifted distribution (`tcb_basis` says which one the row's numbers are on).
    `decisions`: precomputed (e.g. cross-fitted) choices to use instead of the rule's own."""
    rows = rows_of(table, rule)
    biases = rule.biases(rows, references_of(table, rule))
    scores = [rule.scores(r, b) for r, b in zip(rows, biases)]
    preds = decisions if decisions is not None else [int(np.argmax(s)) for s in scores]
    raw_pred = table["pred" if rule.reading == "acc" else "pred_norm"].to_numpy()
    out = table.copy()
    out["pred_raw"] = raw_pred
    out["correct_raw"] = raw_pred == out["gold"].to_numpy()
    out["pred"] = preds if rule.calibrated else raw_pred  # argmax keeps the scorer's own (a tie of equal choices: -1)
    out["correct"] = out["pred"].to_numpy() == out["gold"].to_numpy()
    out["decision"] = rule.name
    out["decision_scores"] = scores
    out["tcb_basis"] = "raw"
    if rule.calibrated and hidden is not None and head is not None and len(out):
        _calibrated_tcb(out, rule, rows, biases, hidden, head, eps)
    return out


def first_token_shifts(tokens: list[int], ll: list[float], shift: list[float]) -> tuple[list[int], list[float]]:
    """The shift of each distinct first token at the read position, for choices whose decision scores are
    ℓ_k + shift_k (rule.logit_shift): a token that starts one choice gets that choice's shift (exact: the decided
    distribution is then o' = softmax(z + shift)); a token that starts several gets the factor by which the
    decision reweights their mass, log Σ_k e^(ℓ_k + shift_k) − log Σ_k e^(ℓ_k) over those choices (a reading:
    the decision between them is made after the read position)."""
    groups: dict[int, list[int]] = {}
    for k, t in enumerate(tokens):
        groups.setdefault(int(t), []).append(k)
    ids, values = [], []
    for t, ks in groups.items():
        ids.append(t)
        if len(ks) == 1:
            values.append(shift[ks[0]])
        else:
            values.append(logsumexp([ll[k] + shift[k] for k in ks]) - logsumexp([ll[k] for k in ks]))
    return ids, values


def _calibrated_tcb(out, rule, rows, biases, hidden, head, eps) -> None:
    """δ_TCB and its companions on the decided distribution: the read position's logits shifted at each choice's
    first token (`first_token_shifts`); rows of different choice counts are padded with zero shifts."""
    tokens = [list(map(int, t)) for t in out["choice_first_tokens"]]
    raw_rows = [list(map(float, r)) for r in out["choice_logprobs"]]
    idx = list(range(len(out)))
    per_row = [first_token_shifts(tokens[i], raw_rows[i], rule.logit_shift(rows[i], biases[i])) for i in idx]
    width = max(len(ids) for ids, _ in per_row)
    ids = torch.tensor([t + [t[0]] * (width - len(t)) for t, _ in per_row], dtype=torch.long)
    shifts = torch.tensor([v + [0.0] * (width - len(v)) for _, v in per_row], dtype=torch.float64)
    golds = out["gold"].to_numpy()
    target = torch.tensor([tokens[i][int(golds[i])] for i in idx], dtype=torch.long)
    with torch.inference_mode():
        res = head(hidden[idx].to(head.weight.device), eps=eps, target=target, shift_tokens=ids, shift_values=shifts)
    values = {name: value.cpu().numpy() for name, value in res.to_dict().items()}
    out["tcb_raw"] = out["tcb"]
    for name in _TCB_COLUMNS:
        column = out[name].to_numpy(dtype=float).copy()
        column[idx] = values[name]
        out[name] = column
    for name, source in (("target_nll", "nll"), ("predicted_token", "top_token")):
        column = out[name].to_numpy().copy()
        column[idx] = values[source]
        out[name] = column
    basis = np.array(["raw"] * len(out), dtype=object)
    basis[idx] = "calibrated"
    out["tcb_basis"] = basis


class DecidingScorer:
    """A scorer (cached or not) whose answers are decided by a fitted rule: usable wherever the scorer is
    (`score`, `score_table`, `lm`, `data`, `runner`, `cache`). The batch an adaptive rule re-estimates its
    bias from is the items of one call."""

    def __init__(self, scorer, rule: DecisionRule) -> None:
        if not rule.fitted:
            raise ConfigError(f"decision {rule.name}: fit the rule before deciding with it")
        self.scorer, self.rule = scorer, rule

    def __getattr__(self, name):  # lm, data, runner, cache, generate_answers, judge, check_fits, key ...
        return getattr(self.scorer, name)

    @property
    def eps(self) -> float:
        inner = self.scorer
        while not hasattr(inner, "eps") and hasattr(inner, "scorer"):
            inner = inner.scorer
        return getattr(inner, "eps", 1.0)

    def score(self, prompt: Prompt, items: list[Item]) -> ScoreResult:
        if self.rule.calibrated and hasattr(self.scorer, "score_with_hidden"):
            table, hidden = self.scorer.score_with_hidden(prompt, items)
        else:
            raw = self.scorer.score(prompt, items)
            table, hidden = raw.table, raw.hidden
        table = with_references(self.scorer, self.rule, prompt, items, table)
        decided = decide_table(self.rule, table, hidden=hidden, head=self.scorer.lm.output_head, eps=self.eps)
        return ScoreResult(decided, summarize(decided), hidden)

    def score_table(self, prompt: Prompt, items: list[Item]) -> pd.DataFrame:
        return self.score(prompt, items).table


class RunningDecision:
    """A search trial's decisions under its prompt's rule, on the dev items scored so far (study/trial.py):
    `contextual` is fit once up front (three content-free inputs), `batch` re-estimates its bias from every dev
    item scored so far, `affine` is cross-fitted on them (`cross_fitted_decisions`). The pruner sees each new
    minibatch decided by the fit so far; the trial's value reads every dev item decided by the fit on all of them.
    `hidden`: keep the critical states so δ_TCB is read on the decided distribution (strategies that read it)."""

    def __init__(self, scorer, prompt: Prompt, *, hidden: bool = False) -> None:
        from promptopt.decision import parse_rule

        self.scorer, self.prompt = scorer, prompt
        self.rule = resolved(parse_rule(prompt.decision), scorer.data.spec.metric)
        self.hidden = hidden and self.rule.calibrated
        self.tables: list[pd.DataFrame] = []
        self.states: list[torch.Tensor] = []
        self.items: list[Item] = []
        if self.rule.spec.reads_content_free:  # labels from the task's items; content-free inputs
            self.rule = fit_rule(self.rule, scorer, prompt, scorer.data.dev + scorer.data.test)

    def add(self, items: list[Item]) -> pd.DataFrame:
        """Score `items` and return them decided by the fit so far (every earlier item included in the fit)."""
        if self.hidden:
            table, hidden = self.scorer.score_with_hidden(self.prompt, items)
            self.states.append(hidden)
        else:
            table = self.scorer.score_table(self.prompt, items)
        table = with_references(self.scorer, self.rule, self.prompt, items, table)
        self.tables.append(table)
        self.items.extend(items)
        if not self.rule.calibrated:
            return table
        return self.decided().iloc[-len(items) :].reset_index(drop=True)

    def decided(self) -> pd.DataFrame:
        """Every item scored so far, decided by the fit on all of them."""
        table = pd.concat(self.tables, ignore_index=True)
        if not self.rule.calibrated:
            return table
        rule, rows, decisions = self.fitted(), rows_of(table, self.rule), None
        if rule.spec.fit_on == "dev_labels":
            decisions = cross_fitted_decisions(rule, rows, [int(g) for g in table["gold"]])
        hidden = torch.cat(self.states) if self.hidden and self.states else None
        eps = getattr(getattr(self.scorer, "scorer", self.scorer), "eps", 1.0)
        return decide_table(rule, table, hidden=hidden, head=self.scorer.lm.output_head, eps=eps, decisions=decisions)

    def scorer_for_variants(self):
        """The scorer perturbed variants are answered with: deciding by the fit on every clean dev item (an
        adaptive rule re-estimates on each variant batch), as serving would."""
        return DecidingScorer(self.scorer, self.fitted()) if self.rule.calibrated else self.scorer

    def fitted(self) -> DecisionRule:
        """The rule fit on every item scored so far (contextual: on its content-free inputs)."""
        if not self.rule.spec.fits_on_dev:
            return self.rule
        table = pd.concat(self.tables, ignore_index=True)
        return fitted_params(
            self.rule,
            rows_of(table, self.rule),
            [int(g) for g in table["gold"]],
            labels=fixed_labels(self.items),
            fitted_on=fitted_on(self.items, "dev"),
        )


def describe(rule: DecisionRule) -> str:
    """One line for messages and cards: the rule and where its parameters came from."""
    per_char = "per-character " if rule.reading == "acc_norm" else ""
    if not rule.calibrated:
        return f"argmax over the {per_char}label log-likelihoods"
    if rule.per_item:
        inputs = ", ".join(repr(t) for t in rule.content_free)
        return (
            f"pmi: each choice's {per_char}log-likelihood minus its log-likelihood after the prompt with the "
            f"content-free input {inputs} in place of the question"
        )
    where = rule.fitted_on
    came = f"{where.get('n')} {where.get('split')} items" if where else "content-free inputs"
    biases = ", ".join(f"{label}: {b:+.3f}" for label, b in zip(rule.labels or (), rule.bias or ()))
    adaptive = rule.adapts_to_batch
    extra = f" (re-estimated from each answered batch of ≥ {rule.min_batch} inputs)" if adaptive else ""
    return f"{rule.name} calibration fit on {came}{extra}; bias {biases}" + (
        "; scale " + ", ".join(f"{a:.3f}" for a in rule.scale) if rule.scale is not None else ""
    )


__all__ = [
    "DecidingScorer",
    "RunningDecision",
    "content_free_items",
    "cross_fitted_decisions",
    "decide_table",
    "describe",
    "fit_affine",
    "fit_rule",
    "first_token_shifts",
    "fixed_labels",
    "need_fixed_labels",
    "references_of",
    "resolved",
    "with_references",
]
