"""Card version 2 for a prompt (promptopt/card_schema.json): everything its score depends on — rendering, answer
reading, model and data fingerprints, the numbers measured with the session's scorer — and a check that the
light loader renders the scored text byte for byte."""

from __future__ import annotations

import time

from promptopt.card import field_hashes, prompt_hashes, sha256_json, sha256_text, token_ids_sha256, validate_card
from promptopt.errors import UserError
from promptopt.prompts import Prompt
from promptopt.scoring.card_answers import CardMember, answer_table
from promptopt.workflows.export.measure import clean, measured
from promptopt.workflows.session import Session


def fitted_members(scorer, prompts: list[Prompt], dev_items: list) -> list[CardMember]:
    """Each prompt with its decision rule fit on the dev items (argmax reads the task's metric; a generative task's
    prompt decides nothing)."""
    from promptopt.decision import DecisionRule, parse_rule
    from promptopt.scoring.calibration import fit_rule

    if scorer.data.spec.answer.generative:
        return [CardMember(p, DecisionRule()) for p in prompts]
    return [CardMember(p, fit_rule(parse_rule(p.decision), scorer, p, dev_items)) for p in prompts]


def _ensemble_section(scorer, ensemble: dict, members: list[CardMember], test_items: list) -> dict:
    """The members (prompt, rule, where each came from, its own dev accuracy and test δ_TCB) and how they were
    chosen; the top-level prompt fields are members[0]'s."""
    from promptopt.scoring import summarize

    out = []
    for member, (_, source) in zip(members, ensemble["members"]):
        card = member.prompt.to_card()
        table = answer_table(scorer, [member], test_items)
        out.append(
            {
                **{k: card[k] for k in ("instruction", "template", "exemplars")},
                "decision": member.rule.to_card(),
                "source": dict(source),
                "dev_accuracy": source.get("dev_accuracy"),
                "tcb_mean": summarize(table).get("tcb_mean"),
            }
        )
    return {
        "members": out,
        "aggregation": "mean_normalized_scores",
        "selection": ensemble.get("selection", ""),
        "objective": ensemble.get("objective", "accuracy"),
        "forwards_per_input": len(members),
    }


def _fragility(session, members, dev_items, flag, flag_test, test_table) -> dict:
    from promptopt.robustness.suite import load_suite
    from promptopt.workflows.export.fragility import answers_match, fragility_section

    if not dev_items:
        raise UserError("--flag-rate: the run has no dev items to choose the threshold on")
    suite = load_suite(flag.suite or "cheap")
    test = flag_test if answers_match(flag_test, test_table) else None  # only this card's own answers
    return fragility_section(session, members, dev_items, flag, suite=suite, test=test)


def render_check(prompt: Prompt, item, tokenizer) -> tuple[str, list[int]]:
    """The text the scorer renders for an item and its token ids, encoded as the scorer encodes it."""
    text = prompt.context(item.question, item.choices, tokenizer)
    return text, list(tokenizer(text, add_special_tokens=prompt.add_special_tokens)["input_ids"])


def rendering_section(prompt: Prompt, tokenizer) -> dict:
    """How the prompt becomes text: plain or chat, with the chat template and what it saw (chat cards)."""
    from promptopt.workflows.fingerprint import chat_template_sha256

    section = {
        "mode": "chat" if prompt.template.chat else "plain",
        "add_special_tokens": prompt.add_special_tokens,
        "chat_template": None,
        "chat_template_sha256": chat_template_sha256(tokenizer),
    }
    if prompt.template.chat:
        section["chat_template"] = tokenizer.chat_template
        section["template_vars"] = {
            k: (list(v) if isinstance(v, (list, tuple)) else str(v)) for k, v in tokenizer.special_tokens_map.items()
        }
    return section


def answer_section(spec, items) -> dict:
    """How answers are read: the task's answer type, metric, and its fixed choices if every item shares them."""
    choice_sets = {tuple(i.choices) for i in items if i.choices is not None}
    fixed = (
        list(next(iter(choice_sets))) if len(choice_sets) == 1 and all(i.choices is not None for i in items) else None
    )
    return {"type": spec.answer_type, "metric": spec.metric, "gold_format": spec.gold_format, "choices": fixed}


def batch_size_record(quantization: dict | None, batch_size: int) -> dict:
    """`model.batch_size` for an 8-bit card: LLM.int8 decides its outlier columns per batch, so its answers move with
    the batch size (SST-2, 200 items: accuracy 0.770 at 1, 0.745 at 16, 0.725 at 64), and `verify` re-scores at the
    size the test metrics were measured at. Float and 4-bit answers do not depend on it: nothing recorded."""
    return {"batch_size": int(batch_size)} if isinstance(quantization, dict) and quantization.get("bits") == 8 else {}


def _versions(model) -> dict:
    """The package versions export records, with bitsandbytes' when it quantized the model."""
    import importlib.metadata

    from promptopt.models.load import quantization_info
    from promptopt.workflows.fingerprint import versions

    out = versions()
    if quantization_info(model) is not None:
        out["bitsandbytes"] = importlib.metadata.version("bitsandbytes")
    return out


def build_card(
    session: Session,
    prompt: Prompt,
    *,
    dev_items: list,
    test_items: list,
    search: dict | None = None,
    robustness: dict | None = None,
    carving: dict | None = None,
    ensemble: dict | None = None,
    flag=None,
    flag_test=None,
) -> dict:
    """A validated card version 2 for `prompt`, measured on `dev_items` and `test_items` with the session's
    (caching) scorer, answering as the card answers (scoring/card_answers.py): its decision rule fit on the dev
    items. `ensemble`: {"members": [(Prompt, source)], "selection": ..., "objective": ...} for an ensemble card
    (`prompt` is members[0]'s). `flag`: a FlagRequest (export/fragility.py) for the card's fragility threshold,
    chosen on the dev items; `flag_test`: the compare's test answers of this card, whose flip rates at τ are
    recorded beside. The light loader must reproduce the scored text byte for byte, or nothing is built."""
    from promptopt.models.load import quantization_info
    from promptopt.production import card_prompt
    from promptopt.workflows.fingerprint import (
        data_sha256,
        items_sha256,
        model_fingerprint,
        task_sha256,
        tokenizer_sha256,
    )

    if not test_items:
        raise UserError(f"task {prompt.task}: no test items to measure the card on")
    scorer, data, spec = session.scorer, session.data, session.data.spec
    lm = scorer.lm
    quantization = quantization_info(lm.model)
    prompts = [prompt] if ensemble is None else [p for p, _ in ensemble["members"]]
    members = fitted_members(scorer, prompts, dev_items)
    test_table = answer_table(scorer, members, test_items)
    metrics = {"test": measured(test_table)}
    if dev_items:
        metrics = {"dev": measured(answer_table(scorer, members, dev_items)), **metrics}
    metrics["robustness"] = robustness
    first = test_items[0]
    text, ids = render_check(prompt, first, lm.tokenizer)
    base = prompt.to_card()
    card = {
        "promptopt_card": 2,
        **{k: base[k] for k in ("task", "instruction", "template", "exemplars")},
        "rendering": rendering_section(prompt, lm.tokenizer),
        "answer": answer_section(spec, [*test_items, *dev_items]),
        "generation": (
            {"max_new_tokens": spec.max_new_tokens, "stop": list(spec.stop), "do_sample": False}
            if spec.generative
            else None
        ),
        "model": {
            "spec": session.model_config.spec,
            **model_fingerprint(session.model_config.spec),
            "tokenizer_sha256": tokenizer_sha256(lm.tokenizer),
            "dtype": str(lm.model.dtype).removeprefix("torch."),
            "device": lm.device.type,
            "context_length": lm.context_length,
            **({"quantization": quantization} if quantization else {}),  # absent: the weights in `dtype`
            **batch_size_record(quantization, scorer.runner.batch_size),
        },
        "data": {
            "task": session.data_config.task,
            "task_sha256": task_sha256(spec),
            "data_sha256": data_sha256(spec, session.data_config.subsets),
            "items_sha256": items_sha256(data),
            "subsets": list(session.data_config.subsets) if session.data_config.subsets else None,
            "split_seed": spec.seed,
            "carving_sha256": sha256_json(carving) if carving else None,
            "dev_ids": [i.id for i in dev_items],
            "test_ids": [i.id for i in test_items],
        },
        "search": search,
        **({"decision": members[0].rule.to_card()} if not spec.generative else {}),
        **({"ensemble": _ensemble_section(scorer, ensemble, members, test_items)} if ensemble else {}),
        "metrics": metrics,
        **({"fragility": _fragility(session, members, dev_items, flag, flag_test, test_table)} if flag else {}),
        "versions": _versions(lm.model),
        "check": {
            "item_id": first.id,
            "text_sha256": sha256_text(text),
            "token_ids_sha256": token_ids_sha256(ids),
            "n_tokens": len(ids),
            "prompt_sha256": prompt_hashes(base),
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    card = clean(card)
    card["check"]["fields_sha256"] = field_hashes(card)  # of the values as written: after clean()
    validate_card(card, "exported card")
    light = card_prompt(card, "exported card").render(first.question, first.choices)
    if light != text:
        raise UserError(
            f"task {prompt.task}: the card's prompt renders differently without the tokenizer than the scorer "
            "rendered it (its chat template uses something promptopt.load_prompt does not reproduce); not exported"
        )
    return card
