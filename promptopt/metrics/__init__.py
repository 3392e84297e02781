"""Metrics: δ_TCB and its geometry (tcb), robustness statistics (stats)."""

from promptopt.metrics.stats import wilson_interval
from promptopt.metrics.tcb import OutputGeometry, TCBResult, jacobian_frobenius_reference, token_constraint_bound

__all__ = ["OutputGeometry", "TCBResult", "jacobian_frobenius_reference", "token_constraint_bound", "wilson_interval"]
