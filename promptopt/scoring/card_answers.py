"""How a card answers items: its prompt scored as the scorer scores it, decided by the card's rule, and for an
ensemble card every member so, their scores combined. Export measures a card this way and verify re-scores it
this way, so a card's recorded numbers and its reproduction come from one function."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from promptopt.decision import DecisionRule, rule_from_card
from promptopt.prompts import Prompt, prompt_from_card
from promptopt.scoring.calibration import DecidingScorer
from promptopt.scoring.ensemble import ensemble_test


@dataclass(frozen=True)
class CardMember:
    prompt: Prompt
    rule: DecisionRule


def card_members(card: dict, where: str = "card") -> list[CardMember]:
    """The card's prompt with its rule, or an ensemble card's members (each with its own rule)."""
    ensemble = card.get("ensemble")
    if not ensemble:
        return [CardMember(prompt_from_card(card, where), rule_from_card(card.get("decision"), f"{where}: decision"))]
    out = []
    for i, member in enumerate(ensemble["members"]):
        here = f"{where}: ensemble.members[{i}]"
        mapping = {"task": card["task"], **{k: member[k] for k in ("instruction", "template", "exemplars")}}
        out.append(
            CardMember(prompt_from_card(mapping, here), rule_from_card(member.get("decision"), f"{here}.decision"))
        )
    return out


def answer_table(scorer, members: list[CardMember], items: list) -> pd.DataFrame:
    """Per-item answers of a card's members on `items` (one batch: an adaptive rule re-estimates on it), combined
    when there are several; a generative task's single prompt is scored as it is."""
    if scorer.data.spec.answer.generative:
        return scorer.score(members[0].prompt, items).table
    tables = [DecidingScorer(scorer, m.rule).score(m.prompt, items).table for m in members]
    if len(tables) == 1:
        return tables[0]
    return ensemble_test(tables)


__all__ = ["CardMember", "answer_table", "card_members"]
