"""Instruction proposals: a model writes new instructions for a search space (APE-style induction,
MIPROv2-style grounded proposals, OPRO-style history rounds, and `reflect`, which shows the proposer answers
that a harmless perturbation changed). Filtered, cached by content hash, provenance kept (space file, card)."""

from promptopt.workflows.propose.proposer import Proposal, Proposals, ProposeRequest, propose
from promptopt.workflows.propose.workflow import propose_space, scored_instructions

__all__ = ["Proposal", "Proposals", "ProposeRequest", "propose", "propose_space", "scored_instructions"]
