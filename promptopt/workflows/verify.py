"""`promptopt verify CARD`: does this card still score what it recorded, here?

Checks, in the order a difference is cheapest to find: the prompt fields and every other field that decides the
score (check.fields_sha256: the task, rendering, answer, generation, decision, model, data — test ids included —,
the recorded test metrics and each ensemble member) are as exported; the model's
weights, tokenizer and chat template have the recorded fingerprints; the model loads in the recorded precision
(model.dtype and model.quantization: a 4-bit card is loaded in 4-bit, and a load in another precision, asked for with
`quantize`, fails the check); the task file, data and carving are
the recorded ones and hold the recorded items; the first test item renders to the recorded text and token
ids; re-scored (no result cache) on the recorded test items, the accuracy lies inside the recorded 95%
interval. Each difference is one line naming what changed (and, for items, which flipped). A card without
check.fields_sha256 (deleted, or exported before the field hashes existed) fails, naming the fields it cannot check
(the rest is still checked); an error met on a card whose fields were edited (a recorded model or task that is
gone) names the edit too.

A model that differs from the recorded one is never used silently: the recorded model missing is an error
(exit 2); another model given with `--model` is scored, and its fingerprint difference fails the check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from promptopt import progress
from promptopt.card import (
    edited_fields,
    edited_scored_fields,
    sha256_text,
    token_ids_sha256,
    unchecked_fields,
    validate_card,
)
from promptopt.errors import ConfigError, UserError
from promptopt.yamlio import Fields, load_yaml


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    note: bool = False  # nothing to check against (an older card): said, never a failure


@dataclass
class Verification:
    card: Path
    model: str
    checks: list[Check] = field(default_factory=list)
    flipped: list[tuple[str, bool, bool]] = field(default_factory=list)  # (item id, recorded correct, now correct)
    n: int = 0
    accuracy: float | None = None
    interval: tuple[float, float] | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str, *, note: bool = False) -> None:
        self.checks.append(Check(name, ok, detail, note))
        progress.step(f"{'note' if note else 'ok' if ok else 'FAIL'} {name}")

    def lines(self) -> list[str]:
        out = [f"{'note' if c.note else 'ok  ' if c.ok else 'FAIL'}  {c.name}: {c.detail}" for c in self.checks]
        for item_id, before, now in self.flipped:
            out.append(
                f"      flipped {item_id}: recorded {'correct' if before else 'wrong'}, now {'correct' if now else 'wrong'}"
            )
        failed = [c.name for c in self.checks if not c.ok]
        out.append(
            f"verified {self.card} on {self.n} items in {self.seconds:.1f}s"
            if not failed
            else f"verify failed for {self.card}: {', '.join(failed)} differ"
        )
        return out


def _alive(spec: str) -> bool:
    """Whether `spec` names a model this process can use now (an in-memory one: its object is still alive)."""
    from promptopt.errors import ModelNotFoundError
    from promptopt.models import handles

    try:
        handles.get(spec)
    except ModelNotFoundError:
        return False
    return True


def _short(digest: str | None) -> str:
    return digest[:12] if digest else "none"


def _same(result: Verification, name: str, recorded, now, what: str = "") -> None:
    if recorded == now:
        result.add(name, True, f"{what}{_short(now) if isinstance(now, str) or now is None else now}")
    else:
        result.add(
            name,
            False,
            f"{what}recorded {_short(recorded) if isinstance(recorded, (str, type(None))) else recorded}, "
            f"got {_short(now) if isinstance(now, (str, type(None))) else now}",
        )


VERIFY_BATCH_SIZE = 16  # the Session's default, and export's: what a card without model.batch_size was measured at


def verify_batch_size(recorded_model: dict, load_quantize: str | None, result: Verification) -> int:
    """The rows per forward pass verify scores at: an 8-bit card's recorded `model.batch_size` (LLM.int8's answers
    depend on it: SST-2 accuracy 0.770 at 1, 0.745 at 16, 0.725 at 64), said as a note; an 8-bit card exported
    before the field was recorded is scored at the default, and the note says its answers may move with it."""
    recorded = recorded_model.get("batch_size")
    if load_quantize != "8bit":
        return VERIFY_BATCH_SIZE  # float and 4-bit answers do not depend on the batch size
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 1:
        result.add("batch size", True, f"{recorded} rows per forward pass, as exported (8-bit answers depend on it)")
        return recorded
    result.add(
        "batch size",
        True,
        f"an 8-bit card without model.batch_size: scored at {VERIFY_BATCH_SIZE} rows per forward pass; 8-bit answers "
        "move with the batch size (SST-2: accuracy 0.770 at 1, 0.725 at 64), so a flip here may be that",
        note=True,
    )
    return VERIFY_BATCH_SIZE


def read_card(path: str | Path) -> dict:
    """A version-2 card, validated; version 1 has nothing to verify against."""
    where = str(path)
    data = load_yaml(path)
    version = Fields(data, where).get("promptopt_card", int, expected="card version 2")
    if version != 2:
        raise ConfigError(
            f"{where}: promptopt_card: verify needs card version 2 (written by `promptopt export`), got {version!r}"
        )
    validate_card(data, where)
    return data


def verify_card(
    path: str | Path,
    *,
    limit: int | None = None,
    model: str | None = None,
    device: str = "auto",
    quantize: str | None = None,
) -> Verification:
    """Verify the card at `path` (see the module's docs). `quantize`: load in 4bit, 8bit or "none" (full precision)
    instead of the card's recorded precision (model.quantization); a load whose precision differs fails the check."""
    import time

    if quantize not in (None, "none", "4bit", "8bit"):
        raise UserError(f"--quantize {quantize}: expected 4bit, 8bit or none (default: the card's precision)")
    start = time.perf_counter()
    card = read_card(path)
    spec = model or card["model"]["spec"]
    result = Verification(card=Path(path), model=spec)

    # 1. the card is the one exported: its prompt fields, and every other field that decides its score
    edited = edited_fields(card)
    result.add("prompt fields", not edited, "as exported" if not edited else f"{', '.join(edited)} edited after export")
    scored = edited_scored_fields(card)
    if scored is None:
        result.add(
            "card fields",
            False,
            f"check.fields_sha256 missing (deleted, or a card exported before promptopt hashed them), so an edit of "
            f"{unchecked_fields(card)} cannot be found: export the card again",
        )
    else:
        result.add(
            "card fields",
            not scored,
            f"as exported ({len(card['check']['fields_sha256'])} fields)"
            if not scored
            else f"{', '.join(scored)} edited after export",
        )
    try:
        _verify(card, str(path), result, limit=limit, model=model, device=device, quantize=quantize)
    except UserError as exc:  # e.g. a recorded model or task that is gone: when fields were edited, say which
        changed = edited + (scored or [])
        if not changed:
            raise
        raise type(exc)(f"{exc} ({', '.join(changed)} edited after export)") from None
    result.seconds = time.perf_counter() - start
    return result


def _verify(
    card: dict,
    where: str,
    result: Verification,
    *,
    limit: int | None,
    model: str | None,
    device: str,
    quantize: str | None = None,
):
    """Steps 2-5 of verify_card: the model, the task and items, the rendering, the re-score."""
    from promptopt.errors import ModelNotFoundError
    from promptopt.metrics.stats import wilson_interval
    from promptopt.models import handles, memory
    from promptopt.models.load import ModelConfig, precision_name, quantization_info, quantize_of
    from promptopt.production import card_prompt
    from promptopt.prompts import prompt_from_card
    from promptopt.tasks.data import DataConfig
    from promptopt.workflows.fingerprint import (
        chat_template_sha256,
        data_sha256,
        items_sha256,
        model_fingerprint,
        task_sha256,
        tokenizer_sha256,
    )
    from promptopt.workflows.session import Session

    recorded_model, spec = card["model"], result.model

    # 2. the model (weights) — before anything loads; a card measured on an in-memory model recorded its tensors'
    # fingerprint, which a model given by spec has only once loaded (step 4)
    in_memory_card = recorded_model.get("weights_method") == memory.METHOD
    if in_memory_card and not model and not _alive(spec):
        raise UserError(
            f"{where}: model.spec: the card was measured on a model passed as an object ('{spec}', weights "
            f"{_short(recorded_model.get('weights_sha256'))} over its tensors in memory): give those weights, "
            "promptopt.verify(card, model=promptopt.Model(model, tokenizer)) or --model with a folder they were saved to"
        )
    progress.step(f"fingerprinting the weights of {spec}")
    try:
        fingerprint = None if in_memory_card and not handles.is_in_memory(spec) else model_fingerprint(spec)
    except ModelNotFoundError as exc:
        field_name = "--model" if model else f"{where}: model.spec"
        raise UserError(
            f"{field_name}: the {'given' if model else 'recorded'} model '{spec}' is not available on this machine ({exc})"
        ) from None
    name = (
        "model weights"
        if not model or model == recorded_model["spec"]
        else f"model weights ({spec} instead of {recorded_model['spec']})"
    )
    if fingerprint is not None:
        _same(
            result,
            name,
            recorded_model["weights_sha256"],
            fingerprint["weights_sha256"],
            f"{fingerprint['weights_method']} ",
        )

    # 3. the task, data and items
    progress.step(f"loading task {card['data']['task']}")
    data_config = DataConfig(
        task=card["data"]["task"], subsets=tuple(card["data"]["subsets"]) if card["data"].get("subsets") else None
    )
    dtype = recorded_model.get("dtype") if recorded_model.get("dtype") in ("float32", "bfloat16", "float16") else None
    recorded_quantization = recorded_model.get("quantization") or None
    load_quantize = quantize_of(recorded_quantization) if quantize is None else None if quantize == "none" else quantize
    batch_size = verify_batch_size(recorded_model, load_quantize, result)
    try:  # a session without a run directory: its scorer has no result cache, so every item is scored anew
        session = Session(
            model=ModelConfig(spec=spec, device=device, dtype=dtype, quantize=load_quantize),
            data=data_config,
            batch_size=batch_size,
        )
    except UserError as exc:
        raise UserError(f"{where}: data.task: cannot load the recorded task '{card['data']['task']}' ({exc})") from None
    data = session.data
    _same(result, "task file", card["data"]["task_sha256"], task_sha256(data.spec))
    if card["data"].get("data_sha256") is not None:
        _same(result, "data files", card["data"]["data_sha256"], data_sha256(data.spec, data_config.subsets))
    _same(result, "carved items", card["data"]["items_sha256"], items_sha256(data))
    by_id = {item.id: item for role in ("pool", "dev", "test") for item in data.split(role)}
    missing = [i for i in card["data"]["test_ids"] if i not in by_id]
    if missing:
        result.add(
            "test items", False, f"{len(missing)} recorded test items are not in the task's data (first: {missing[0]})"
        )
    items = [by_id[i] for i in card["data"]["test_ids"] if i in by_id][:limit]
    if not items:
        raise UserError(f"{where}: data.test_ids: none of the recorded test items is in task '{card['data']['task']}'")

    # 4. precision (what the load quantized), tokenizer, chat template, rendering
    lm = session.lm
    if fingerprint is None:  # an in-memory card verified on a loaded spec: its tensors, hashed the same way
        _same(result, name, recorded_model["weights_sha256"], memory.tensors_sha256(lm.model), f"{memory.METHOD} ")
    recorded_precision = precision_name(recorded_model.get("dtype"), recorded_quantization)
    now_dtype, now_quantization = str(lm.model.dtype).removeprefix("torch."), quantization_info(lm.model)
    now_precision = precision_name(now_dtype, now_quantization)
    if recorded_model.get("dtype") in (None, now_dtype) and recorded_quantization == now_quantization:
        result.add("precision", True, now_precision)
    else:
        result.add("precision", False, f"recorded {recorded_precision}, got {now_precision}")
    _same(result, "tokenizer", recorded_model["tokenizer_sha256"], tokenizer_sha256(lm.tokenizer))
    _same(result, "chat template", card["rendering"]["chat_template_sha256"], chat_template_sha256(lm.tokenizer))
    prompt = prompt_from_card(card, where)
    check = card["check"]
    first = by_id.get(check["item_id"])
    if first is None:
        result.add("rendered prompt", False, f"check.item_id {check['item_id']} is not in the task's data")
    else:
        text = prompt.context(first.question, first.choices, lm.tokenizer)
        ids = list(lm.tokenizer(text, add_special_tokens=prompt.add_special_tokens)["input_ids"])
        light = card_prompt(card, where).render(first.question, first.choices)
        _same(result, "rendered text", check["text_sha256"], sha256_text(text), f"item {first.id} ")
        if light != text:
            result.add(
                "load_prompt render", False, "promptopt.load_prompt renders this card differently from the scorer"
            )
        now = token_ids_sha256(ids)
        if now == check["token_ids_sha256"]:
            result.add("token ids", True, f"item {first.id}: {len(ids)} tokens, {_short(now)}")
        else:
            result.add(
                "token ids",
                False,
                f"item {first.id}: recorded {check['n_tokens']} tokens ({_short(check['token_ids_sha256'])}), "
                f"got {len(ids)} tokens ({_short(now)})",
            )

    # 5. re-score (no result cache), answering as the card answers (its rule; an ensemble's members combined)
    from promptopt.scoring.card_answers import answer_table, card_members

    progress.step(f"re-scoring {len(items)} recorded test items (no result cache)")
    table = answer_table(session.scorer, card_members(card, where), items)
    now_correct = [bool(c) for c in table["correct"]]
    recorded_correct = card["metrics"]["test"].get("correct")
    index = {item_id: i for i, item_id in enumerate(card["data"]["test_ids"])}
    if recorded_correct:
        for item, now in zip(items, now_correct):
            before = recorded_correct[index[item.id]] == "1"
            if before != now:
                result.flipped.append((item.id, before, now))
    result.n = len(items)
    result.accuracy = sum(now_correct) / len(items)
    if limit is None or limit >= len(card["data"]["test_ids"]):
        low, high = card["metrics"]["test"]["accuracy_ci95"]
    elif recorded_correct:  # the recorded interval of the same items
        low, high = wilson_interval(sum(recorded_correct[index[i.id]] == "1" for i in items), len(items))
    else:
        low, high = card["metrics"]["test"]["accuracy_ci95"]
    result.interval = (low, high)
    inside = low is not None and high is not None and low - 1e-12 <= result.accuracy <= high + 1e-12
    flips = f"; {len(result.flipped)} item(s) flipped" if result.flipped else "; no item flipped"
    result.add(
        "accuracy",
        inside,
        f"{result.accuracy:.4f} on {len(items)} items, recorded 95% interval [{low:.4f}, {high:.4f}]{flips}"
        if low is not None
        else f"{result.accuracy:.4f}; no recorded interval",
    )


__all__ = ["Check", "Verification", "read_card", "verify_card"]
