"""The math behind `promptopt diagnose`: the statistical approximation (conditioning and chain-rule gain),
δ_TCB for a given (o, W) with replaced rows, the paper's clustering on a W where the answer is known, and
correlation intervals / log fits. References: explicit float64 matrices and 50-digit mpmath."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from promptopt.metrics import (
    OutputGeometry,
    approximation_reference,
    jacobian_frobenius_reference,
    move_toward,
    tcb_from_probs,
    token_constraint_bound,
)
from promptopt.metrics.stats import correlation_interval, fit_log, pearson, spearman
from promptopt.metrics.tcb_fixed_probs import logits_float64


def _mp_probs(h: torch.Tensor, w: torch.Tensor, softcap: float | None = None, scale: float | None = None):
    mpmath.mp.dps = 50
    wm = [[mpmath.mpf(float(x)) for x in row] for row in w.double()]
    hm = [mpmath.mpf(float(x)) for x in h.double()]
    s = [mpmath.fsum(a * b for a, b in zip(row, hm)) for row in wm]
    gain = [mpmath.mpf(1)] * len(s)
    if scale is not None:
        s = [x * scale for x in s]
        gain = [g * scale for g in gain]
    if softcap is not None:
        gain = [g / mpmath.cosh(x / softcap) ** 2 for g, x in zip(gain, s)]
        s = [softcap * mpmath.tanh(x / softcap) for x in s]
    top = max(s)
    e = [mpmath.exp(x - top) for x in s]
    total = mpmath.fsum(e)
    return wm, [x / total for x in e], gain


def _mp_approx(h, w, softcap=None, scale=None) -> float:
    """ε / sqrt(dσ² Σ_ij M_ij² g_j²) at 50 digits, M = diag(o) − o oᵀ entry by entry."""
    wm, o, gain = _mp_probs(h, w, softcap, scale)
    norm_sq = mpmath.fsum(
        ((o[i] * (1 - o[i]) if i == j else -o[i] * o[j]) ** 2) * gain[j] ** 2
        for i in range(len(o))
        for j in range(len(o))
    )
    sigma2 = float(w.double().var(unbiased=False))
    return float(1 / mpmath.sqrt(w.shape[1] * sigma2 * norm_sq))


def _mp_jacobian_norm(o, w) -> float:
    """‖J‖_F at 50 digits for given o; the top entry is 1 − Σ of the others (a float o_t ≈ 1 − 1e-9 carries a
    rounding error of 1e-16, which would move μ by 1e-7 of the distance that matters)."""
    mpmath.mp.dps = 50
    wm = [[mpmath.mpf(float(x)) for x in row] for row in w.double()]
    om = [mpmath.mpf(x) for x in o]
    t = max(range(len(om)), key=lambda i: om[i])
    om[t] = 1 - mpmath.fsum(x for i, x in enumerate(om) if i != t)
    d = len(wm[0])
    mu = [mpmath.fsum(om[i] * wm[i][k] for i in range(len(om))) for k in range(d)]
    return float(
        mpmath.sqrt(
            mpmath.fsum(om[i] ** 2 * mpmath.fsum((wm[i][k] - mu[k]) ** 2 for k in range(d)) for i in range(len(om)))
        )
    )


def _peaked(w: torch.Tensor, gap: float) -> torch.Tensor:
    """h along w_0, scaled until 1 − o_top ≈ gap (float64 softmax)."""
    direction = w[0] / w[0].norm()
    alpha = 1.0
    while 1 - torch.softmax(w.double() @ (alpha * direction).double(), -1).max() > gap:
        alpha *= 1.05
    return alpha * direction


# --- the statistical approximation ---------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [0.05, 0.5, 2.0, 8.0, 30.0, 120.0])
def test_approximation_matches_float64_reference_flat_to_peaked(scale):
    gen = torch.Generator().manual_seed(int(scale * 100))
    w = torch.randn(3000, 48, generator=gen) * 0.4
    h = torch.randn(12, 48, generator=gen) * scale
    ours = token_constraint_bound(h, w)
    ref = approximation_reference(h, w)
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isinf(ours.tcb_approx), ~finite)
    assert ((ours.tcb_approx[finite] - ref[finite]) / ref[finite]).abs().max() < 1e-6


@pytest.mark.parametrize("gap", [1e-7, 1e-9, 1e-12])
def test_approximation_is_conditioned_where_the_expanded_form_is_not(gap):
    """At o_top = 1 − 1e-9 the paper's S2 − 2S3 + S2² is O(1e-18) out of O(1) terms: float64 garbage."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(120, 12, generator=gen)
    h = _peaked(w, gap)
    exact = _mp_approx(h, w)
    ours = float(token_constraint_bound(h[None], w).tcb_approx[0])
    assert abs(ours - exact) / exact < 1e-9
    o = torch.softmax(w.double() @ h.double(), -1)
    s2, s3 = o.pow(2).sum(), o.pow(3).sum()
    expanded = s2 - 2 * s3 + s2**2
    naive = float(1 / (12 * w.double().var(unbiased=False) * expanded).sqrt()) if expanded > 0 else math.inf
    if gap <= 1e-9:
        assert not abs(naive - exact) / exact < 1e-2


def test_approximation_carries_the_logit_scale_and_softcap_gain():
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(150, 10, generator=gen)
    h = torch.randn(3, 10, generator=gen) * 2
    plain = token_constraint_bound(h, w)
    # a logit scale s on logits s·Wh equals plain logits at h·s with gain |s|: the approximation divides by |s|
    scaled = token_constraint_bound(h / 4, w, logit_scale=4.0)
    assert torch.allclose(scaled.tcb_approx * 4, plain.tcb_approx, rtol=1e-9)
    assert torch.allclose(scaled.tcb_diffuse * 4, plain.tcb_diffuse, rtol=1e-9)
    for sharp in (0.5, 4.0, 20.0):
        x = torch.randn(10, generator=gen) * sharp
        ours = float(token_constraint_bound(x[None], w, logit_softcap=7.0).tcb_approx[0])
        assert abs(ours - _mp_approx(x, w, softcap=7.0)) / ours < 1e-6  # tail gains are float32
    peaked = _peaked(w, 1e-10) * 0.3
    ours = float(token_constraint_bound(peaked[None], w, logit_scale=-2.5).tcb_approx[0])
    assert abs(ours - _mp_approx(peaked, w, scale=-2.5)) / ours < 1e-9


def test_approximation_on_softcapped_gemma2(tiny_gemma2_dir):
    """Gemma-2's final soft-cap 30: the approximation uses each logit's gain sech²(s/30), as the exact form does."""
    from promptopt.models import load_model

    lm = load_model(str(tiny_gemma2_dir), device="cpu")
    head = lm.output_head
    assert head.logit_softcap == 30.0
    ids = torch.tensor([[1, 422, 2210, 314, 253]])
    with torch.no_grad():
        hidden = lm.base(input_ids=ids).last_hidden_state[0] * 40  # into the cap's curved region
    weight = lm.model.get_output_embeddings().weight
    ours = head(hidden)
    ref = approximation_reference(hidden, weight, logit_softcap=30.0)
    assert ((ours.tcb_approx - ref) / ref).abs().max() < 1e-5
    uncapped = approximation_reference(hidden, weight)
    assert ((uncapped - ref) / ref).abs().max() > 1e-2  # the gain matters here: ignoring it is visibly wrong


# --- δ_TCB for a given (o, W) -------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [0.05, 2.0, 30.0, 120.0])
def test_tcb_from_probs_equals_the_exact_form_when_o_is_softmax_wh(scale):
    gen = torch.Generator().manual_seed(int(scale * 10))
    w = torch.randn(3000, 48, generator=gen) * 0.4
    h = torch.randn(10, 48, generator=gen) * scale
    for cap in (None, 7.0):
        geometry = OutputGeometry(w, logit_softcap=cap)
        z, gain = logits_float64(geometry, h)
        res = tcb_from_probs(torch.log_softmax(z, -1).exp(), w, gain=gain)
        ref = jacobian_frobenius_reference(h, w, logit_softcap=cap)
        finite = ref > 0
        assert ((res.jacobian_norm[finite] - ref[finite]) / ref[finite]).abs().max() < 1e-9
        assert torch.equal(torch.isinf(res.tcb), ~finite)


@pytest.mark.parametrize("gap", [1e-9, 1e-13])
def test_tcb_from_probs_against_mpmath_when_peaked(gap):
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(120, 12, generator=gen)
    h = _peaked(w, gap)
    o = torch.log_softmax(w.double() @ h.double(), -1).exp()
    exact = _mp_jacobian_norm([float(x) for x in o], w)
    ours = float(tcb_from_probs(o, w, exact_top_k=4).jacobian_norm[0])
    assert abs(ours - exact) / exact < 1e-9


def test_replaced_rows_equal_a_copied_matrix():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(500, 16, generator=gen)
    h = torch.randn(4, 16, generator=gen) * 3
    o = torch.softmax(h.double() @ w.double().T, -1)
    top = o.argmax(-1)
    comps = torch.randint(0, 500, (4, 60), generator=gen)  # beyond the exact top K, overlapping it
    comps = torch.stack([c[c != t].unique()[:12][torch.randperm(12, generator=gen)] for c, t in zip(comps, top)])
    new = move_toward(w[comps], w[top], alpha=0.3)
    ours = tcb_from_probs(o, w, rows=comps, replaced=new, exact_top_k=5)
    for i in range(4):
        copied = w.double().clone()
        copied[comps[i]] = new[i]
        assert ours.jacobian_norm[i] == pytest.approx(float(tcb_from_probs(o[i], copied).jacobian_norm[0]), rel=1e-12)
    with pytest.raises(ValueError, match="distinct"):
        tcb_from_probs(o, w, rows=torch.zeros(4, 2, dtype=torch.long), replaced=torch.zeros(4, 2, 16))
    with pytest.raises(ValueError, match="sum to 1"):
        tcb_from_probs(o * 2, w)


def test_clustering_must_raise_delta_on_a_built_w():
    """All mass on the top token and its K = 10 competitors (the rest at exactly 0): with o fixed, moving the
    competitors halfway to w_t halves every w_j − w_t, so ‖J‖_F halves and δ doubles; moving them away by half
    multiplies it by 1.5, so δ falls to δ/1.5. The paper's hypothesis δ_cluster > δ_orig > δ_disperse holds."""
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(40, 8, generator=gen)
    o = torch.zeros(40, dtype=torch.float64)
    o[3] = 0.6
    comps = torch.tensor([1, 5, 7, 9, 11, 13, 17, 19, 23, 29])
    o[comps] = torch.rand(10, generator=gen, dtype=torch.float64)
    o[comps] *= 0.4 / o[comps].sum()
    orig = float(tcb_from_probs(o, w).tcb[0])
    cluster = float(
        tcb_from_probs(o, w, rows=comps[None], replaced=move_toward(w[comps], w[3], alpha=0.5)[None]).tcb[0]
    )
    disperse = float(
        tcb_from_probs(o, w, rows=comps[None], replaced=move_toward(w[comps], w[3], alpha=-0.5)[None]).tcb[0]
    )
    assert cluster == pytest.approx(2 * orig, rel=1e-12)
    assert disperse == pytest.approx(orig / 1.5, rel=1e-12)
    assert cluster > orig > disperse


# --- statistics -------------------------------------------------------------------------------------------
def test_correlation_intervals_and_log_fit():
    low, high = correlation_interval(0.5, 100)
    assert (low, high) == (pytest.approx(0.3366, abs=1e-4), pytest.approx(0.6341, abs=1e-4))  # Fisher z, textbook
    s_low, s_high = correlation_interval(0.5, 100, method="spearman")
    assert s_low < low and s_high > high  # Bonett–Wright: wider than Pearson's
    assert math.isnan(correlation_interval(0.5, 3)[0])
    x = [1, 2, 3, 4, 5]
    assert pearson(x, [2, 4, 6, 8, 10]) == pytest.approx(1.0) and math.isnan(pearson(x, [1] * 5))
    assert spearman(x, [1, 4, 9, 16, 25]) == pytest.approx(1.0)
    fit = fit_log([1, 2, 4, 8], [1.0 + 2 * math.log(i) for i in (1, 2, 4, 8)])
    assert fit["a"] == pytest.approx(1.0) and fit["b"] == pytest.approx(2.0) and fit["r2"] == pytest.approx(1.0)
    noisy = fit_log([1, 2, 4, 8], [1.0, 3.0, 2.0, 4.0])
    assert 0 < noisy["r2"] < 1
