"""Metrics: δ_TCB from a hidden state (tcb), δ_TCB for a given distribution o and moved rows of W
(tcb_fixed_probs, the paper's geometry experiments), robustness statistics (stats)."""

from promptopt.metrics.stats import wilson_interval
from promptopt.metrics.tcb import (
    OutputGeometry,
    TCBResult,
    approximation_reference,
    jacobian_frobenius_reference,
    token_constraint_bound,
)
from promptopt.metrics.tcb_fixed_probs import FixedProbsTCB, move_toward, tcb_from_probs

__all__ = [
    "FixedProbsTCB",
    "OutputGeometry",
    "TCBResult",
    "approximation_reference",
    "jacobian_frobenius_reference",
    "move_toward",
    "tcb_from_probs",
    "token_constraint_bound",
    "wilson_interval",
]
