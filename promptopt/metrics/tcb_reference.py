"""The slow float64 yardsticks for tcb.py: ‖J‖_F from the explicit V×d Jacobian, and the statistical
approximation from M = diag(o) − o oᵀ column by column, one position at a time.

`logit_shift` (…, V), float64: a constant added to the final logits (after bias, scale and soft-cap), e.g. a
calibrated decision's label bias. The Jacobian of the shifted logits is that of the plain ones, so the
formulas keep their form with o replaced by the shifted distribution; these references compute it
from scratch.
"""

from __future__ import annotations

import torch

__all__ = ["approximation_reference", "jacobian_frobenius_reference"]


def _reference_logits(w, h, bias, logit_scale, logit_softcap, shift=None):
    """float64 logits s, each logit's chain-rule gain ds/dz, and o = softmax(s): shared by both references."""
    s = w @ h
    if bias is not None:
        s = s + bias.detach().double()
    gain = torch.ones_like(s)
    if logit_scale is not None:
        s = s * logit_scale
        gain = gain * logit_scale
    if logit_softcap is not None:
        x = s / logit_softcap
        gain = gain / torch.cosh(x).pow(2)
        s = logit_softcap * torch.tanh(x)
    if shift is not None:  # after the soft-cap: a constant per logit, its gain unchanged
        s = s + shift
    return s, gain, torch.log_softmax(s, dim=-1).exp()


def _shifts(logit_shift, hidden, w):
    """One float64 shift row (or None) per position of `hidden`."""
    n = hidden.reshape(-1, w.shape[1]).shape[0]
    if logit_shift is None:
        return [None] * n
    return list(logit_shift.detach().double().reshape(n, w.shape[0]))


def jacobian_frobenius_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    logit_scale: float | None = None,
    logit_softcap: float | None = None,
    bias: torch.Tensor | None = None,
    logit_shift: torch.Tensor | None = None,
) -> torch.Tensor:
    """‖J‖_F from the explicit V×d Jacobian in float64, one position at a time: the slow yardstick.

    Rows are J_i = o_i (w'_i − μ). μ is formed as w'_t + Σ_{j≠t} o_j (w'_j − w'_t): written as Wᵀo it
    rounds to w'_t once 1 − o_t < 1e-16 and the reference itself would be wrong in the peaked regime.
    """
    w = weight.detach().double()
    bias = None if bias is None else bias.detach()
    out = []
    for h, shift in zip(hidden.detach().reshape(-1, w.shape[1]).double(), _shifts(logit_shift, hidden, w)):
        s, gain, o = _reference_logits(w, h, bias, logit_scale, logit_softcap, shift)
        w_eff = w * gain[:, None]
        t = int(s.argmax())
        diff = w_eff - w_eff[t]  # w'_i − w'_t
        o_rest = o.clone()
        o_rest[t] = 0.0
        mu_minus_wt = o_rest @ diff
        jac = o[:, None] * (diff - mu_minus_wt[None, :])  # (diag(o) − o oᵀ) W', row by row
        out.append(torch.linalg.matrix_norm(jac))
    if not out:
        return torch.empty(hidden.shape[:-1], dtype=torch.float64)
    return torch.stack(out).reshape(hidden.shape[:-1])


def approximation_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float = 1.0,
    logit_scale: float | None = None,
    logit_softcap: float | None = None,
    bias: torch.Tensor | None = None,
    logit_shift: torch.Tensor | None = None,
) -> torch.Tensor:
    """The statistical approximation ε / sqrt(dσ² ‖M G‖²_F) in float64 from M = diag(o) − o oᵀ column by
    column, one position at a time: the slow yardstick for `tcb_approx`.

    Column j of M G has the diagonal entry g_j o_j (1 − o_j) and the off-diagonal entries −g_j o_i o_j, so its
    squared norm is g_j² (o_j² (1 − o_j)² + o_j² Σ_{i≠j} o_i²). Only the top token t needs care: 1 − o_t is
    taken as Σ_{j≠t} o_j and Σ_{i≠t} o_i² is summed directly (as floats, 1 − o_t is 0 once it is < 1e-16).
    Memory is O(V): a V×V matrix would not fit for real vocabularies.
    """
    w = weight.detach().double()
    sigma2 = float(w.var(unbiased=False))
    out = []
    for h, shift in zip(hidden.detach().reshape(-1, w.shape[1]).double(), _shifts(logit_shift, hidden, w)):
        s, gain, o = _reference_logits(w, h, bias, logit_scale, logit_softcap, shift)
        t = int(s.argmax())
        others = torch.cat([o[:t], o[t + 1 :]])
        one_minus = 1 - o
        one_minus[t] = others.sum()
        off_diag = o.pow(2).sum() - o.pow(2)  # Σ_{i≠j} o_i²
        off_diag[t] = others.pow(2).sum()
        column_sq = gain.pow(2) * (o.pow(2) * one_minus.pow(2) + o.pow(2) * off_diag)
        norm_sq = column_sq.sum()
        out.append(
            eps / (w.shape[1] * sigma2 * norm_sq).sqrt()
            if norm_sq > 0
            else torch.tensor(float("inf"), dtype=torch.float64)
        )
    if not out:
        return torch.empty(hidden.shape[:-1], dtype=torch.float64)
    return torch.stack(out).reshape(hidden.shape[:-1])
