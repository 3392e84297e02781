"""An experiment session: one model (loaded once, on first use), the task's data, one caching scorer and
one run directory. Every workflow (score, evaluate, stress, compare, export, report, diagnose) starts
from a session, so none assembles model + data + scorer its own way.

The task data is loaded and checked when the session is built; the model only when `scorer` is first
used, so a bad task or card fails before the (slow) model load.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from promptopt import progress
from promptopt.errors import UserError
from promptopt.models.load import ModelConfig
from promptopt.prompts import Prompt, load_card
from promptopt.robustness.perturb import ParaphraseMemo
from promptopt.scoring import ScorerFactory
from promptopt.tasks.data import DataConfig, TaskData
from promptopt.tasks.item import Item


class Session:
    def __init__(
        self,
        *,
        model: ModelConfig,
        data: DataConfig,
        out: str | Path | None = None,
        batch_size: int | str = 16,
        progress: bool = False,
        keep_hidden: bool = False,
    ) -> None:
        self.out = Path(out) if out is not None else None
        self.factory = ScorerFactory(
            model=model,
            data=data,
            batch_size=batch_size,
            cache_path=str(self.out / "cache.sqlite") if self.out is not None else None,
            keep_hidden=keep_hidden,
        )
        self.progress = progress
        self.data: TaskData = data.load()
        self.paraphrases = ParaphraseMemo()  # LM paraphrases of this session's model, shared by every prompt
        self.flips: dict = {}  # (suite, dev limit) -> dev answers the suite changes (propose reflect), found once

    @property
    def model_config(self) -> ModelConfig:
        return self.factory.model

    @property
    def data_config(self) -> DataConfig:
        return self.factory.data

    @cached_property
    def scorer(self):
        """The session's scorer (cached when the session has a run directory); loads the model once."""
        progress.step(f"loading model {self.model_config.spec}")
        return self.factory.build(self.data, progress=self.progress or progress.bars())

    @property
    def lm(self):
        return self.scorer.lm

    # --- what to score ------------------------------------------------------------------------------
    def prompt(self, card: str | Path | None = None) -> Prompt:
        """A prompt card, or the task's own prompt."""
        return load_card(card)[0] if card else self.data.default_prompt()

    def card_members(self, card: str | Path | None, *, command: str, ensembles: bool = False):
        """The card's members, each a prompt with the rule its card decides by (the task's own prompt and argmax
        without a card): what a command answers with so that a calibrated card is scored as it is served, never
        silently by argmax. An ensemble card (several members) is refused in one line unless `ensembles`."""
        from promptopt.decision import DecisionRule
        from promptopt.scoring.card_answers import CardMember, card_members
        from promptopt.yamlio import load_yaml

        if not card:
            return [CardMember(self.data.default_prompt(), DecisionRule())]

        prompt = self.prompt(card)  # validated as a card first: errors name the file and field
        data = load_yaml(card)
        if isinstance(data.get("decision"), str):  # a search's card (version 1) names its rule
            return [CardMember(prompt, self._named_rule(data, prompt, card))]
        members = card_members(data, str(card))
        if len(members) > 1 and not ensembles:
            raise UserError(
                f"{command}: {card} is an ensemble card ({len(members)} members) and {command} stresses one "
                f"prompt; `promptopt verify {card}` scores the ensemble as it is served, `compare --ensembles K` "
                "measures an ensemble's robustness"
            )
        return members

    def _named_rule(self, data: dict, prompt: Prompt, card):
        """A version-1 card's rule: the fitted one its search recorded (provenance.decision_fitted), else the named
        rule fit on this session's dev items (a hand-written card saying `decision: batch`)."""
        from promptopt.decision import parse_rule, rule_from_card

        rule = parse_rule(prompt.decision)
        fitted = (data.get("provenance") or {}).get("decision_fitted")
        if isinstance(fitted, dict):
            recorded = rule_from_card(fitted, f"{card}: provenance.decision_fitted")
            if (recorded.kind, recorded.mode) == (rule.kind, rule.mode) and rule.reading in ("", recorded.reading):
                return recorded
        if not rule.calibrated or self.data.spec.answer.generative:
            return rule
        from promptopt.scoring.calibration import fit_rule

        return fit_rule(rule, self.scorer, prompt, self.items("dev"))

    def answering(self, member):
        """The scorer that answers for one card member: deciding by its rule where the task's answers are decided
        from label log-probabilities and the rule is calibrated; the session's scorer otherwise."""
        if self.data.spec.answer.generative or not member.rule.calibrated:
            return self.scorer
        from promptopt.scoring.calibration import DecidingScorer

        return DecidingScorer(self.scorer, member.rule)

    def items(self, split: str, limit: int | None = None) -> list[Item]:
        """A split's items; dev and test honour the session's limits, then `limit`."""
        if split == "dev":
            items = self.data_config.dev(self.data)
        elif split == "test":
            items = self.data_config.test(self.data)
        else:
            items = self.data.split(split)
        return items[:limit]
