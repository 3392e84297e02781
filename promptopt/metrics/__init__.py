"""Metrics: δ_TCB and its geometry (tcb), robustness statistics (stats)."""

from promptopt.metrics.geometry import FixedProbsTCB, move_toward, tcb_from_probs
from promptopt.metrics.stats import wilson_interval
from promptopt.metrics.tcb import (
    OutputGeometry,
    TCBResult,
    approximation_reference,
    jacobian_frobenius_reference,
    token_constraint_bound,
)

__all__ = ["FixedProbsTCB", "OutputGeometry", "TCBResult", "approximation_reference", "jacobian_frobenius_reference",
           "move_toward", "tcb_from_probs", "token_constraint_bound", "wilson_interval"]
