"""δ_TCB for a *given* distribution o and output matrix W: the δ_TCB paper's geometry experiments.

`OutputGeometry` always derives o from W h. The paper's §4.2 / App. C.4.1 simulation moves competitor
embeddings while holding h **and o** fixed, so the metric must also be available as a function of (o, W):

    ‖J‖²_F = Σ_i o_i² ‖w'_i − μ‖²,   μ = Σ_i o_i w'_i,   w'_i = g_i w_i   (g: chain-rule gains, 1 for plain logits)

Numerics, as in tcb.py: the sum is anchored on the most probable token t, c = μ − w'_t = Σ_{j≠t} o_j (w'_j − w'_t)
summed from the small terms (never from 1 − o_t), and the K most probable rows plus every replaced row are
done directly in float64 as Σ o_i² ‖(w'_i − w'_t) − c‖², a sum of non-negative terms. The remaining rows
(the tail, o_j below the K-th largest) go through one float64 product with W. Rows of W can be replaced
per position (`rows`, `replaced`) without copying W: the replaced rows are exact rows by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["FixedProbsTCB", "logits_float64", "move_toward", "tcb_from_probs"]

_EXACT_TOP_K = 32
_VOCAB_CHUNK = 16384
_POSITION_CHUNK = 128


@dataclass
class FixedProbsTCB:
    """Per-position results of `tcb_from_probs`, float64 tensors shaped (N,)."""

    tcb: torch.Tensor  # ε / ‖J‖_F (+inf where ‖J‖_F = 0)
    jacobian_norm: torch.Tensor


def move_toward(rows: torch.Tensor, anchor: torch.Tensor, *, alpha: float) -> torch.Tensor:
    """w_j + α (w_anchor − w_j): α = 0.5 moves each row halfway to the anchor (the paper's clustering),
    α = −0.5 moves it away along the same line by half the distance (its dispersion, β = 0.5).

    rows (..., K, d), anchor (..., d); float64 result."""
    rows, anchor = rows.double(), anchor.double()
    return rows + alpha * (anchor[..., None, :] - rows)


def logits_float64(
    geometry, hidden: torch.Tensor, *, weight: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float64 logits z (N, V) and chain-rule gains dz/ds (None for plain logits) of an `OutputGeometry`
    (`weight`: the same W already in float64, to skip the per-call upcast)."""
    w_all = geometry.weight if weight is None else weight
    h = hidden.reshape(-1, geometry.hidden_size).double()
    s = torch.empty(h.shape[0], geometry.vocab_size, dtype=torch.float64, device=h.device)
    for start in range(0, geometry.vocab_size, _VOCAB_CHUNK):
        stop = min(start + _VOCAB_CHUNK, geometry.vocab_size)
        s[:, start:stop] = h @ w_all[start:stop].double().T
    if geometry.bias is not None:
        s = s + geometry.bias.double()
    return geometry._transform(s)


def tcb_from_probs(
    probs: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float = 1.0,
    gain: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    replaced: torch.Tensor | None = None,
    exact_top_k: int = _EXACT_TOP_K,
) -> FixedProbsTCB:
    """δ_TCB = ε / ‖(diag(o) − o oᵀ) G W‖_F for given probabilities o, without building the Jacobian.

    probs: (N, V) or (V,), non-negative rows summing to 1 (float64 keeps the small ones exact). The small
    entries define the distribution: the top one is read as 1 − Σ_{j≠t} o_j, whatever its rounding.
    weight: W (V, d), any float dtype. gain: (N, V) chain-rule factors dz_i/ds_i, or None (plain logits).
    rows, replaced: per position, R distinct row indices (N, R) and the rows that stand in for them
    (N, R, d); the other rows of W are used as they are.
    """
    if probs.ndim == 1:
        probs = probs[None]
        gain = None if gain is None else gain.reshape(1, -1)
        rows = None if rows is None else rows.reshape(1, -1)
        replaced = None if replaced is None else replaced.reshape(1, *replaced.shape[-2:])
    if probs.ndim != 2 or weight.ndim != 2 or probs.shape[1] != weight.shape[0]:
        raise ValueError(
            f"probs must be (N, V) with V = weight rows; got {tuple(probs.shape)} and weight {tuple(weight.shape)}"
        )
    o = probs.detach().double()
    if not torch.isfinite(o).all() or (o < 0).any():
        raise ValueError("probs must be finite and non-negative")
    if o.shape[0] and ((o.sum(-1) - 1).abs() > 1e-6).any():
        raise ValueError("every row of probs must sum to 1")
    if gain is not None and gain.shape != o.shape:
        raise ValueError(f"gain must be shaped like probs {tuple(o.shape)}, got {tuple(gain.shape)}")
    if (rows is None) != (replaced is None):
        raise ValueError("rows and replaced go together")
    if rows is not None:
        if rows.ndim != 2 or rows.shape[0] != o.shape[0] or replaced.shape != (*rows.shape, weight.shape[1]):
            raise ValueError(
                f"rows must be (N, R) and replaced (N, R, d); got {tuple(rows.shape)}, {tuple(replaced.shape)}"
            )
        if rows.shape[1] > 1 and (rows.sort(-1).values.diff(dim=-1) == 0).any():
            raise ValueError("rows must be distinct within each position")
    parts = []
    for i in range(0, o.shape[0], _POSITION_CHUNK):
        sl = slice(i, i + _POSITION_CHUNK)
        parts.append(
            _jacobian_norm(
                o[sl],
                weight,
                None if gain is None else gain[sl].double(),
                None if rows is None else rows[sl],
                None if replaced is None else replaced[sl].double(),
                exact_top_k,
            )
        )
    jac = torch.cat(parts) if parts else torch.empty(0, dtype=torch.float64)
    tcb = torch.where(jac > 0, eps / jac, torch.full_like(jac, float("inf")))
    return FixedProbsTCB(tcb=tcb, jacobian_norm=jac)


def _jacobian_norm(o, weight, gain, rows, replaced, exact_top_k) -> torch.Tensor:
    n, vocab = o.shape
    dev = o.device
    k = max(1, min(exact_top_k, vocab))
    exact = torch.zeros(n, vocab, dtype=torch.bool, device=dev)
    exact.scatter_(1, o.topk(k, dim=-1).indices, True)
    if rows is not None:
        exact.scatter_(1, rows, True)
    m = int(exact.sum(-1).max())
    idx = exact.double().topk(m, dim=-1).indices  # every exact index first, then padding
    valid = exact.gather(1, idx)
    o_ex = o.gather(1, idx) * valid
    w_ex = weight[idx].double()  # (n, m, d)
    if rows is not None:
        match = idx[:, :, None] == rows[:, None, :]  # (n, m, R)
        has = match.any(-1)
        which = match.double().argmax(-1)
        swapped = replaced.gather(1, which[..., None].expand(-1, -1, w_ex.shape[-1]))
        w_ex = torch.where(has[..., None], swapped, w_ex)
    if gain is not None:
        w_ex = w_ex * gain.gather(1, idx)[..., None]
    top = o.argmax(-1)
    slot = (idx == top[:, None]).double().argmax(-1)  # where t sits among the exact rows
    anchor = w_ex[torch.arange(n, device=dev), slot]  # w'_t
    u = w_ex - anchor[:, None, :]
    o_rest = o_ex.scatter(1, slot[:, None], 0.0)

    # Tail: one float64 product with W for Σ o_j w'_j and Σ o_j² w'_j.
    o_tail = o.masked_fill(exact, 0.0)
    g_tail = o_tail if gain is None else o_tail * gain
    coef = torch.stack([g_tail, o_tail * g_tail], dim=1)  # (n, 2, V)
    sums = torch.zeros(n, 2, weight.shape[1], dtype=torch.float64, device=dev)
    sq_norms = torch.empty(vocab, dtype=torch.float64, device=dev)
    for start in range(0, vocab, _VOCAB_CHUNK):
        stop = min(start + _VOCAB_CHUNK, vocab)
        w = weight[start:stop].double()
        sums += coef[..., start:stop] @ w
        sq_norms[start:stop] = w.pow(2).sum(-1)
    m1, m2 = sums[:, 0], sums[:, 1]
    tail_sum1 = o_tail.sum(-1)
    tail_sum2 = o_tail.pow(2).sum(-1)
    g2 = 1.0 if gain is None else gain.pow(2)
    tail_sq = (o_tail.pow(2) * g2 * sq_norms[None, :]).sum(-1)  # Σ_tail o² ‖w'‖²

    c = (o_rest[..., None] * u).sum(1) + m1 - tail_sum1[:, None] * anchor  # μ − w'_t
    head = (o_ex.pow(2) * (u - c[:, None, :]).pow(2).sum(-1)).sum(-1)
    mu = anchor + c
    tail = tail_sq - 2 * (mu * m2).sum(-1) + tail_sum2 * mu.pow(2).sum(-1)
    return (head + tail.clamp_min(0.0)).sqrt()
