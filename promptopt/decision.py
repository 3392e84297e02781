"""How a choice task's answer is decided from its per-label log-probabilities: the decision rule of a card.

Plain Python on purpose (no numpy, no torch): production code applies a card's rule through
`promptopt.load_prompt`, and the scorer applies the very same functions, so both decide alike.

For an item with label log-likelihoods ℓ_k (summed over each label's tokens; per character for acc_norm),
ñ_k = ℓ_k − logsumexp_j ℓ_j are the label-normalized log-probabilities, and a rule's decision is
argmax_k s_k with

| rule         | s_k                 | parameters, and where they come from                                    |
|--------------|---------------------|-------------------------------------------------------------------------|
| `argmax`     | ℓ_k                 | none                                                                    |
| `contextual` | ñ_k − b_k           | b = log p̄_cf: mean label probabilities on content-free inputs ("N/A",   |
|              |                     |   "", "[MASK]") under the same prompt (Zhao et al. 2021)                |
| `batch`      | ñ_k − b_k           | b = mean of ñ over a batch of unlabeled inputs (Zhou et al. 2024):      |
|              |                     |   *stored* (the dev items', frozen in the card) or *adaptive* (the      |
|              |                     |   batch being answered, when it has ≥ `min_batch` inputs)               |
| `affine`     | a_k ñ_k + b_k       | fit on dev labels (L2-regularized towards a = 1, b = 0)                  |
| `pmi`        | ℓ_k − r_k           | r_k = log mean_j P(c_k | prompt, x_j): the item's own choices scored  |
|              |                     |   after the same prompt rendered with content-free inputs x_j in place  |
|              |                     |   of the question (domain-conditional PMI, Holtzman et al. 2021); no    |
|              |                     |   fitted parameters, so it serves per-item choices (ARC, COPA, SciQ)    |

Biases are centered (Σ_k b_k = 0): a common constant never changes a decision, and centering fixes the
one constant δ_TCB would otherwise depend on. δ_TCB of a decision (scoring/calibration.py) is read on the
distribution shifted by `logit_shift` at the label tokens: −b_k for `contextual` and `batch` (exact: a
constant shift of the logits), and the item's own s_k − ñ_k, centered and held constant, for `affine`
(exact where a_k = 1; a first-order reading otherwise), and −r_k, the item's own, for `pmi` (a per-item
constant: exact for one-token choices; what it means for longer ones is said in promptopt/metrics/tcb.py).

`pmi`'s reference r is per item, not per label: `scores(ll, reference)` takes the item's r (the module
table's `reference_row` of the content-free log-likelihoods), and so does `decide(rows, references)`.
With one content-free input "" and a prompt that renders it as the empty text, r_k = log P(c_k | BOS) is
lm-eval's unconditional `acc_mutual_info` reference.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from promptopt.errors import ConfigError
from promptopt.registry import Registry, load_reference

BATCH_MODES = ("stored", "adaptive")
READINGS = ("acc", "acc_norm")
CONTENT_FREE = ("N/A", "", "[MASK]")
PMI_CONTENT_FREE = ("",)  # pmi's default content-free input: the prompt with an empty question (the domain premise)
MIN_BATCH = 16  # adaptive batch calibration re-estimates its bias only from at least this many inputs


def logsumexp(values: list[float]) -> float:
    top = max(values)
    if math.isinf(top):
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


def normalized(ll: list[float]) -> list[float]:
    """ñ_k = ℓ_k − logsumexp(ℓ): log-probabilities renormalized over the labels."""
    total = logsumexp(ll)
    return [v - total for v in ll]


def centered(values: list[float]) -> list[float]:
    mean = sum(values) / len(values)
    return [v - mean for v in values]


def batch_bias(rows: list[list[float]]) -> list[float]:
    """Batch calibration's bias: the mean label-normalized log-probability of each label over `rows`, centered."""
    if not rows:
        raise ValueError("batch calibration needs at least one input")
    normal = [normalized(r) for r in rows]
    return centered([sum(col) / len(normal) for col in zip(*normal)])


def reference_row(content_free: list[list[float]]) -> list[float]:
    """pmi's reference r_k for one item from its content-free log-likelihoods, one list per content-free input
    (each: every choice's summed log-likelihood): r_k = log mean_j exp(ℓ_jk)."""
    if not content_free:
        raise ValueError("pmi needs the log-likelihoods of at least one content-free input")
    n = len(content_free)
    return [logsumexp(list(col)) - math.log(n) for col in zip(*content_free)]


def argmax(values: list[float]) -> int:
    """The first index of the largest value (ties go to the lower index, as numpy's argmax)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


# --- what a rule is: the registry's entries ------------------------------------------------------------------------
FIT_ON = ("nothing", "content_free", "references", "dev", "dev_labels")


@dataclass(frozen=True)
class RuleKind:
    """One decision rule as the registry holds it: how it scores an item's labels, and what its parameters are fit on.

    `fit_on`: "nothing" (argmax); "content_free" (contextual: one bias per label from content-free inputs scored
    under the prompt); "references" (pmi: each item's own content-free log-likelihoods, nothing fitted); "dev"
    (batch: the dev items' label log-probabilities, labels unread); "dev_labels" (affine: the dev items and their
    labels; a search's dev accuracy for such a rule is cross-fitted, so an in-sample fit cannot flatter it).
    A rule of your own is fit on "dev" or "dev_labels": `fit(rows, golds)` returns (bias, scale or None) from the
    rows of label log-probabilities the rule reads (golds: each row's label index; None for "dev"), and
    `score(n, bias, scale)` is s_k from one item's label-normalized ñ. `score` runs in production code through
    `promptopt.load_prompt`, so keep it plain Python; `fit` runs in the scorer and may be a "module:function"
    reference (imported when first used)."""

    name: str
    fit_on: str
    score: Callable[[list[float], list[float], list[float] | None], list[float]] | None = None
    fit: Callable | str | None = None
    scaled: bool = False  # a scale per label beside the bias (affine): stored in the card as `scale`
    summary: str = ""

    def __post_init__(self) -> None:
        if self.fit_on not in FIT_ON:
            raise ConfigError(f"decision rule {self.name!r}: fit_on must be one of {', '.join(FIT_ON)}")
        if self.fit_on in ("content_free", "dev", "dev_labels") and self.score is None:
            raise ConfigError(f"decision rule {self.name!r}: a calibrated rule needs score(n, bias, scale)")
        if self.fit_on in ("dev", "dev_labels") and self.fit is None:
            raise ConfigError(f"decision rule {self.name!r}: fit_on {self.fit_on!r} needs fit(rows, golds)")

    @property
    def calibrated(self) -> bool:
        return self.fit_on != "nothing"

    @property
    def per_item(self) -> bool:
        return self.fit_on == "references"

    @property
    def reads_content_free(self) -> bool:
        """Its parameters come from content-free inputs (contextual, pmi), so they are known before any dev item."""
        return self.fit_on in ("content_free", "references")

    @property
    def fits_on_dev(self) -> bool:
        """Its parameters are fit on the dev items' rows (batch, affine, and the rules one adds)."""
        return self.fit_on in ("dev", "dev_labels")

    def fit_params(self, rows: list[list[float]], golds: list[int] | None):
        """(bias, scale or None) fit on `rows` (and `golds` for a rule fit on labels)."""
        fit = load_reference(self.fit) if isinstance(self.fit, str) else self.fit
        bias, scale = fit(rows, golds)
        return tuple(float(b) for b in bias), None if scale is None else tuple(float(a) for a in scale)


def _minus_bias(n: list[float], bias: list[float], scale: list[float] | None) -> list[float]:
    return [v - c for v, c in zip(n, bias)]


def _affine(n: list[float], bias: list[float], scale: list[float] | None) -> list[float]:
    return [a * v + c for a, v, c in zip(scale, n, bias)]


def _fit_batch(rows: list[list[float]], golds: list[int] | None):
    return batch_bias(rows), None


ARGMAX = RuleKind("argmax", "nothing", summary="the label with the highest log-likelihood")
CONTEXTUAL = RuleKind(
    "contextual", "content_free", score=_minus_bias, summary="ñ − b, b from content-free inputs (Zhao et al. 2021)"
)
BATCH = RuleKind(
    "batch",
    "dev",
    score=_minus_bias,
    fit=_fit_batch,
    summary="ñ − b, b the mean ñ of unlabeled inputs (Zhou et al. 2024)",
)
AFFINE = RuleKind(
    "affine",
    "dev_labels",
    score=_affine,
    fit="promptopt.scoring.calibration:affine_params",
    scaled=True,
    summary="a ⊙ ñ + b fit on dev labels",
)
PMI = RuleKind("pmi", "references", summary="ℓ − r, r each choice after a content-free input (Holtzman et al. 2021)")

DECISION_RULES: Registry[RuleKind] = Registry(
    "decision rule",
    group="promptopt.decision_rules",
    builtins={
        name: f"promptopt.decision:{name.upper()}" for name in ("argmax", "contextual", "batch", "affine", "pmi")
    },
)


def rule_names() -> str:
    """Every rule a command line or space file may name (batch-adaptive: batch re-estimated on each batch)."""
    names = []
    for name in DECISION_RULES.names():
        names += [name, "batch-adaptive"] if name == "batch" else [name]
    return ", ".join(names)


@dataclass(frozen=True, kw_only=True)
class DecisionRule:
    """A decision rule with everything it needs to decide: its parameters and the items they came from.

    Attributes:
        kind: the rule's registered name (argmax, contextual, batch, affine, pmi, or a plugin's).
        reading: the log-probabilities it reads: "acc" (summed), "acc_norm" (per character) or "" (the task's).
        mode: batch only: "stored" (bias frozen from fit items) or "adaptive" (re-estimated per batch).
        labels: the fixed labels the parameters belong to, in order.
        bias: one bias per label (calibrated rules), centered.
        scale: one scale per label (affine).
        content_free: contextual and pmi: the content-free inputs the parameters or references come from.
        min_batch: adaptive batch: the fewest inputs a batch re-estimates its bias from.
        fitted_on: what the parameters were fit on ({split, n, ids_sha256, ids}).

    Raises:
        ConfigError: an unknown kind, reading or mode.
    """

    kind: str = "argmax"
    reading: str = "acc"  # which log-probabilities it reads: summed (acc) or per character (acc_norm); "" = the task's
    mode: str = "stored"  # batch only: stored (bias frozen from fit items) or adaptive (re-estimated per batch)
    labels: tuple[str, ...] | None = None  # the fixed labels the parameters belong to, in order
    bias: tuple[float, ...] | None = None
    scale: tuple[float, ...] | None = None  # affine only
    content_free: tuple[str, ...] = ()  # contextual: the inputs b came from; pmi: the inputs its references read
    min_batch: int = MIN_BATCH
    fitted_on: dict = field(default_factory=dict)  # {split, n, ids_sha256, ids}: what the parameters came from

    def __post_init__(self) -> None:
        if self.kind not in DECISION_RULES:
            raise ConfigError(DECISION_RULES.unknown(self.kind, "decision"))
        if self.reading not in (*READINGS, ""):
            raise ConfigError(f"decision.reading: expected one of {', '.join(READINGS)}, got {self.reading!r}")
        if self.mode not in BATCH_MODES:
            raise ConfigError(f"decision.mode: expected one of {', '.join(BATCH_MODES)}, got {self.mode!r}")

    @property
    def spec(self) -> RuleKind:
        """What this rule is (the registry's entry for its kind)."""
        return DECISION_RULES.get(self.kind, "decision")

    @property
    def calibrated(self) -> bool:
        return self.spec.calibrated

    @property
    def per_item(self) -> bool:
        """Its reference comes with each item (pmi), so it needs no fixed labels and no fit."""
        return self.spec.per_item

    @property
    def fitted(self) -> bool:
        return not self.calibrated or self.per_item or self.bias is not None

    @property
    def adapts_to_batch(self) -> bool:
        """An input's decision depends on the other inputs of its batch (adaptive batch calibration re-estimates
        its bias from them); under every other rule an input is decided alone, whatever it is batched with."""
        return self.kind == "batch" and self.mode == "adaptive"

    @property
    def name(self) -> str:
        """How tables and messages name it: argmax, contextual, batch (stored), batch-adaptive, affine."""
        return "batch-adaptive" if self.adapts_to_batch else self.kind

    def column(self) -> str:
        """The per-item table column of the log-probabilities this rule reads."""
        return "choice_logprobs" if self.reading == "acc" else "choice_logprobs_norm"

    def _need_fit(self, n_labels: int) -> None:
        if not self.fitted:
            raise ConfigError(f"decision {self.name}: the rule has no parameters yet (fit it on dev items first)")
        if self.bias is not None and len(self.bias) != n_labels:
            raise ConfigError(f"decision {self.name}: {len(self.bias)} biases for {n_labels} labels")

    def bias_for(self, rows: list[list[float]]) -> list[float] | None:
        """The bias used for a batch of inputs: adaptive batch calibration re-estimates it from a batch large
        enough (≥ min_batch), every other rule uses its stored one."""
        if self.adapts_to_batch and len(rows) >= self.min_batch:
            return batch_bias(rows)
        return None if self.bias is None else list(self.bias)

    def scores(self, ll: list[float], bias: list[float] | None = None) -> list[float]:
        """s_k for one item (module table); `bias`: the batch's (from `bias_for`), else the stored one; for pmi
        the item's reference r (required)."""
        spec = self.spec
        if not spec.calibrated:
            return list(ll)
        if spec.per_item:
            if bias is None or len(bias) != len(ll):
                raise ConfigError(
                    f"decision {self.name}: each input needs its content-free log-likelihood of every choice "
                    f"({len(ll)} choices, got {None if bias is None else len(bias)})"
                )
            return [v - r for v, r in zip(ll, bias)]
        self._need_fit(len(ll))
        b = list(self.bias) if bias is None else bias
        return list(spec.score(normalized(ll), b, None if self.scale is None else list(self.scale)))

    def biases(self, rows: list[list[float]], references: list[list[float]] | None = None) -> list:
        """The bias each row of a batch is decided with: pmi's per-row references, else `bias_for` the batch."""
        if self.per_item:
            if references is None or len(references) != len(rows):
                raise ConfigError(f"decision {self.name}: every input needs its content-free reference")
            return [list(r) for r in references]
        return [self.bias_for(rows) if self.calibrated else None] * len(rows)

    def decide(self, rows: list[list[float]], references: list[list[float]] | None = None) -> list[int]:
        """The chosen label index of every row of a batch (adaptive batch calibration reads the whole batch;
        pmi reads each row's reference).

        Args:
            rows: each input's label log-likelihoods, in the labels' order.
            references: pmi only: each input's reference r (`reference_row`).

        Returns:
            The chosen label index of every row.

        Raises:
            ConfigError: a calibrated rule without its parameters, or with parameters for another number of labels.
        """
        return [argmax(self.scores(r, b)) for r, b in zip(rows, self.biases(rows, references))]

    def logit_shift(self, ll: list[float], bias: list[float] | None = None) -> list[float]:
        """The constant added to each label token's logit that δ_TCB reads (module docstring), centered."""
        if not self.calibrated:
            return [0.0] * len(ll)
        s, n = self.scores(ll, bias), normalized(ll)
        return centered([a - b for a, b in zip(s, n)])

    # --- the card ----------------------------------------------------------------------------------
    def to_card(self) -> dict:
        out: dict = {"rule": self.kind, "reading": self.reading}
        package = DECISION_RULES.provider(self.kind)
        if package:  # a plugin's rule: a reader without the package is told which one to install
            out["package"] = package
        if self.kind == "batch":
            out["mode"] = self.mode
            if self.mode == "adaptive":
                out["min_batch"] = self.min_batch
        if self.calibrated and not self.per_item:
            out["labels"] = list(self.labels or [])
            out["bias"] = None if self.bias is None else [float(b) for b in self.bias]
        if self.spec.scaled:
            out["scale"] = None if self.scale is None else [float(a) for a in self.scale]
        if self.spec.reads_content_free:
            out["content_free"] = list(self.content_free)
        if self.fitted_on:
            out["fitted_on"] = dict(self.fitted_on)
        return out

    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.to_card(), sort_keys=True).encode()).hexdigest()

    def with_params(self, **changes) -> DecisionRule:
        return replace(self, **changes)


def rule_from_card(section: dict | None, where: str = "decision") -> DecisionRule:
    """A DecisionRule from a card's `decision` mapping (None or absent: argmax); errors name the field.

    Args:
        section: the card's `decision` mapping.
        where: how errors name it (the card's file and field).

    Returns:
        The rule with its stored parameters.

    Raises:
        ConfigError: an unknown rule (naming the package that provided it, when the card records one), or an
            invalid parameter.
    """
    if section is None:
        return DecisionRule()
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: expected a mapping, got {section!r}")
    kind, package = section.get("rule", "argmax"), section.get("package")
    if isinstance(kind, str) and kind not in DECISION_RULES and isinstance(package, str):
        raise ConfigError(
            f"{where}.rule: decision rule {kind!r} is not installed here: the card was exported with it from package "
            f"{package!r} (pip install {package})"
        )

    def floats(key):
        value = section.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, (int, float)) for v in value):
            raise ConfigError(f"{where}.{key}: expected a list of numbers, got {value!r}")
        return tuple(float(v) for v in value)

    rule = DecisionRule(
        kind=section.get("rule", "argmax"),
        reading=section.get("reading", "acc"),
        mode=section.get("mode", "stored"),
        labels=tuple(section["labels"]) if section.get("labels") else None,
        bias=floats("bias"),
        scale=floats("scale"),
        content_free=tuple(section.get("content_free") or ()),
        min_batch=int(section.get("min_batch", MIN_BATCH)),
        fitted_on=dict(section.get("fitted_on") or {}),
    )
    if rule.per_item and not rule.content_free:
        raise ConfigError(f"{where}.content_free: rule pmi needs its content-free inputs (a list of strings)")
    if rule.calibrated and not rule.per_item and rule.bias is None:
        raise ConfigError(f"{where}.bias: rule {rule.kind} needs its fitted bias")
    if rule.spec.scaled and (rule.scale is None or len(rule.scale) != len(rule.bias)):
        raise ConfigError(f"{where}.scale: rule {rule.kind} needs one scale per label")
    if rule.labels is not None and rule.bias is not None and len(rule.labels) != len(rule.bias):
        raise ConfigError(f"{where}.bias: {len(rule.bias)} values for {len(rule.labels)} labels")
    return rule


def parse_rule(text: str) -> DecisionRule:
    """A rule as written on a command line or in a space file: a registered rule's name (argmax, contextual,
    batch, batch-adaptive, affine, pmi, and any installed), each optionally with :acc or :acc_norm (else it reads
    the task's metric). Unfitted (pmi: with its default content-free input).

    Args:
        text: e.g. "argmax", "batch-adaptive", "pmi:acc_norm".

    Returns:
        The rule, without parameters yet.

    Raises:
        ConfigError: an unknown rule name (with every registered one and the nearest).
    """
    name, _, reading = text.partition(":")
    kind, mode = ("batch", "adaptive") if name == "batch-adaptive" else (name, "stored")
    if kind not in DECISION_RULES:
        near = difflib.get_close_matches(name, rule_names().split(", "), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"decision: unknown decision rule {text!r}{hint}: use one of {rule_names()}")
    per_item = DECISION_RULES.get(kind).per_item
    return DecisionRule(kind=kind, mode=mode, reading=reading, content_free=PMI_CONTENT_FREE if per_item else ())


def ensemble_scores(member_scores: list[list[float]]) -> list[float]:
    """An ensemble's label scores: the mean over members of each member's label-normalized decision scores
    (so members on different scales weigh alike); its answer is their argmax."""
    normal = [normalized(s) for s in member_scores]
    return [sum(col) / len(normal) for col in zip(*normal)]


__all__ = [
    "CONTENT_FREE",
    "DECISION_RULES",
    "DecisionRule",
    "PMI_CONTENT_FREE",
    "RuleKind",
    "argmax",
    "batch_bias",
    "ensemble_scores",
    "normalized",
    "parse_rule",
    "reference_row",
    "rule_from_card",
    "rule_names",
]
