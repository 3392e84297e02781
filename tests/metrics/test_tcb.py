"""δ_TCB against independent references: float64 explicit Jacobian, 50-digit mpmath, and autograd."""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from promptopt.metrics import OutputGeometry, jacobian_frobenius_reference, token_constraint_bound


def _mp_jacobian_norm(h: torch.Tensor, w: torch.Tensor, softcap: float | None = None) -> float:
    """‖J‖_F in 50-digit arithmetic straight from the definition J = (diag(o) − o oᵀ) D W."""
    mpmath.mp.dps = 50
    wm = [[mpmath.mpf(float(x)) for x in row] for row in w.double()]
    hm = [mpmath.mpf(float(x)) for x in h.double()]
    s = [mpmath.fsum(a * b for a, b in zip(row, hm)) for row in wm]
    gain = [mpmath.mpf(1)] * len(s)
    if softcap is not None:
        gain = [1 / mpmath.cosh(x / softcap) ** 2 for x in s]
        s = [softcap * mpmath.tanh(x / softcap) for x in s]
    top = max(s)
    e = [mpmath.exp(x - top) for x in s]
    total = mpmath.fsum(e)
    o = [x / total for x in e]
    d = len(hm)
    weff = [[gain[i] * wm[i][k] for k in range(d)] for i in range(len(s))]
    mu = [mpmath.fsum(o[i] * weff[i][k] for i in range(len(o))) for k in range(d)]
    sq = mpmath.fsum(o[i] ** 2 * mpmath.fsum((weff[i][k] - mu[k]) ** 2 for k in range(d)) for i in range(len(o)))
    return float(mpmath.sqrt(sq))


@pytest.mark.parametrize("scale", [0.05, 0.5, 2.0, 8.0, 30.0, 120.0])
def test_matches_float64_reference_flat_to_peaked(scale):
    gen = torch.Generator().manual_seed(int(scale * 100))
    w = torch.randn(3000, 48, generator=gen) * 0.4
    h = torch.randn(24, 48, generator=gen) * scale
    ours = token_constraint_bound(h, w)
    ref = jacobian_frobenius_reference(h, w)
    assert not torch.isnan(ours.tcb).any() and not torch.isnan(ours.jacobian_norm).any()
    finite = ref > 0
    rel = ((ours.jacobian_norm[finite] - ref[finite]) / ref[finite]).abs()
    assert rel.max() < 1e-5
    assert torch.equal(torch.isinf(ours.tcb), ~finite)  # +inf exactly where the reference is 0
    assert torch.allclose(ours.tcb[finite], 1.0 / ref[finite], rtol=1e-5)


def test_expanded_form_fails_where_anchored_form_holds():
    """The numerical trap described in metrics/tcb.py: o_top ≥ 1 − 1e-7 breaks Σ o²(‖w‖² − 2w·μ + ‖μ‖²) in float32."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(500, 16, generator=gen)
    direction = w[0] / w[0].norm()
    alpha = 1.0
    while 1 - torch.softmax(w.double() @ (alpha * direction).double(), -1).max() > 1e-9:
        alpha *= 1.1  # sharpen until 1 − o_top ≈ 1e-9
    h = alpha * direction
    o = torch.softmax(w @ h, -1)
    assert o.max() > 1 - 1e-7
    mu = w.T @ o
    expanded = (o.pow(2) * (w.pow(2).sum(1) - 2 * (w @ mu) + mu.pow(2).sum())).sum().clamp_min(0).sqrt()
    exact = _mp_jacobian_norm(h, w)
    ours = float(token_constraint_bound(h, w).jacobian_norm)
    assert abs(ours - exact) / exact < 1e-9
    assert not abs(float(expanded) - exact) / exact < 1e-2


@pytest.mark.parametrize("sharpness", [1.0, 6.0, 15.0, 35.0])
def test_matches_mpmath_even_beyond_float64_resolution(sharpness):
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(120, 12, generator=gen)
    h = torch.randn(12, generator=gen) * sharpness
    ours = float(token_constraint_bound(h[None], w).jacobian_norm[0])
    exact = _mp_jacobian_norm(h, w)
    assert abs(ours - exact) / exact < 1e-9


def test_softcap_and_scale_against_mpmath():
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(150, 10, generator=gen)
    for sharp in (0.5, 4.0, 20.0):
        h = torch.randn(10, generator=gen) * sharp
        ours = float(token_constraint_bound(h[None], w, logit_softcap=7.0).jacobian_norm[0])
        assert abs(ours - _mp_jacobian_norm(h, w, softcap=7.0)) / ours < 1e-6  # tail gains are float32
    h = torch.randn(4, 10, generator=gen) * 3
    scaled = token_constraint_bound(h, w, logit_scale=0.25)
    ref = jacobian_frobenius_reference(h, w, logit_scale=0.25)
    assert torch.allclose(scaled.jacobian_norm, ref, rtol=1e-7)


def test_leading_dimensions_targets_and_companions():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(200, 8, generator=gen)
    h = torch.randn(2, 3, 8, generator=gen) * 2
    target = torch.randint(0, 200, (2, 3), generator=gen)
    res = token_constraint_bound(h, w, eps=2.0, target=target)
    assert res.tcb.shape == (2, 3)
    z = h.double() @ w.double().T
    o = torch.softmax(z, -1)
    assert torch.allclose(res.v_eff, 1 / o.pow(2).sum(-1), rtol=1e-6)
    top2 = z.topk(2, -1).values
    assert torch.allclose(res.margin, top2[..., 0] - top2[..., 1], atol=1e-5)
    assert torch.allclose(res.entropy, -(o * o.log()).sum(-1), rtol=1e-6)
    assert torch.allclose(res.nll, -o.log().gather(-1, target[..., None]).squeeze(-1), rtol=1e-5)
    assert torch.allclose(res.tcb, 2.0 / jacobian_frobenius_reference(h, w), rtol=1e-6)  # ε scales δ
    # statistical approximation, by hand: δ ≈ ε / sqrt(d σ² (S2 − 2 S3 + S2²)); diffuse: ε sqrt(V_eff/(dσ²))
    sigma2 = w.double().var(unbiased=False)
    s2, s3 = o.pow(2).sum(-1), o.pow(3).sum(-1)
    assert torch.allclose(res.tcb_approx, 2.0 / (8 * sigma2 * (s2 - 2 * s3 + s2**2)).sqrt(), rtol=1e-6)
    assert torch.allclose(res.tcb_diffuse, 2.0 * ((1 / s2) / (8 * sigma2)).sqrt(), rtol=1e-6)


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_companions_where_the_tail_carries_the_mass(softcap):
    """Near-uniform distributions over 3000 tokens: most probability lies outside the exact top K, so the
    tail's sums (S2, S3, Σ g² o², the entropy's) decide every companion; checked against float64 by hand and the
    approximation's own reference (with a soft-cap, every tail logit has its own gain)."""
    from promptopt.metrics import approximation_reference

    gen = torch.Generator().manual_seed(7)
    w = torch.randn(3000, 24, generator=gen)
    h = torch.randn(5, 24, generator=gen) * torch.tensor([0.01, 0.05, 0.1, 0.2, 0.3])[:, None]
    res = token_constraint_bound(h, w, logit_softcap=softcap)
    z = h.double() @ w.double().T
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    o = torch.softmax(z, -1)
    assert (o.topk(32, -1).values.sum(-1) < 0.2).all()  # the top K hold under a fifth: the tail decides
    s2, s3 = o.pow(2).sum(-1), o.pow(3).sum(-1)
    assert torch.allclose(res.s2, s2, rtol=1e-6) and torch.allclose(res.s3, s3, rtol=1e-6)
    assert torch.allclose(res.v_eff, 1 / s2, rtol=1e-6)
    assert torch.allclose(res.entropy, -(o * o.log()).sum(-1), rtol=1e-6)
    ref = approximation_reference(h, w, logit_softcap=softcap)
    assert torch.allclose(res.tcb_approx, ref, rtol=1e-6)
    assert torch.allclose(res.tcb, 1 / jacobian_frobenius_reference(h, w, logit_softcap=softcap), rtol=1e-6)
    if softcap is None:  # by hand: S2 − 2 S3 + S2², and the diffuse limit ε sqrt(V_eff / (dσ²))
        d_sigma2 = 24 * w.double().var(unbiased=False)
        assert torch.allclose(res.tcb_approx, 1 / (d_sigma2 * (s2 - 2 * s3 + s2**2)).sqrt(), rtol=1e-6)
        assert torch.allclose(res.tcb_diffuse, ((1 / s2) / d_sigma2).sqrt(), rtol=1e-6)


def test_infinite_only_when_distribution_is_a_point_mass():
    w = torch.zeros(4, 2)
    w[0] = torch.tensor([1.0, 0.0])
    w[1:] = torch.tensor([-1.0, 0.0])
    h = torch.tensor([[500.0, 0.0], [5.0, 0.0]])  # gap 1000: exp(-1000) underflows even in float64
    res = token_constraint_bound(h, w)
    assert math.isinf(res.tcb[0]) and math.isfinite(res.tcb[1])
    assert float(jacobian_frobenius_reference(h, w)[0]) == 0.0


def test_bfloat16_weight_and_bias_are_handled():
    gen = torch.Generator().manual_seed(2)
    w = (torch.randn(300, 16, generator=gen)).to(torch.bfloat16)
    b = torch.randn(300, generator=gen)
    h = torch.randn(5, 16, generator=gen) * 3
    res = OutputGeometry(w, bias=b)(h)
    ref = jacobian_frobenius_reference(h, w.float(), bias=b)
    assert torch.allclose(res.jacobian_norm, ref, rtol=1e-5)


def test_rejects_bad_shapes():
    with pytest.raises(ValueError):
        OutputGeometry(torch.zeros(3))
    with pytest.raises(ValueError):
        token_constraint_bound(torch.zeros(2, 5), torch.zeros(10, 4))


def test_softcapped_model_against_autograd(tiny_gemma2_dir):
    """Gemma-2's final soft-cap: our ‖J‖_F equals the Frobenius norm of autograd's d softmax / d h."""
    from promptopt.models import load_model

    lm = load_model(str(tiny_gemma2_dir), device="cpu")
    assert lm.output_head.logit_softcap == 30.0
    ids = torch.tensor([[1, 422, 2210, 314, 253]])
    with torch.no_grad():
        hidden = lm.base(input_ids=ids).last_hidden_state[0].double()
    head = lm.model.get_output_embeddings().weight.double()
    hidden = hidden * 40  # push logits into the cap's curved region
    ours = lm.output_head(hidden.float()).jacobian_norm
    for i in range(hidden.shape[0]):
        probs = lambda x: torch.softmax(30.0 * torch.tanh((head @ x) / 30.0), -1)  # noqa: E731
        jac = torch.func.jacfwd(probs)(hidden[i])  # forward mode: d columns, not V rows
        assert abs(float(ours[i]) - float(torch.linalg.matrix_norm(jac))) / float(ours[i]) < 1e-4


@pytest.mark.slow
@pytest.mark.long
def test_real_smollm2_positions(embedded_lm):
    """Every position of real SmolLM2 text, peaked ones included, within 1e-5 of the float64 reference."""
    tok = embedded_lm.tokenizer
    text = "The capital of France is Paris. 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12. Once upon a time"
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        hidden = embedded_lm.base(input_ids=ids).last_hidden_state[0]
    weight = embedded_lm.model.get_output_embeddings().weight
    ours = embedded_lm.output_head(hidden)
    assert ours.top_prob.max() > 0.999  # the counting run is very peaked
    order = ours.top_prob.argsort()
    picked = torch.cat([order[:5], order[-10:]])  # the flattest and the most peaked positions
    ref = jacobian_frobenius_reference(hidden[picked], weight)
    rel = ((ours.jacobian_norm[picked] - ref) / ref).abs()
    assert rel.max() < 1e-5
    assert not torch.isnan(ours.tcb).any()


@pytest.mark.parametrize("head", [{}, {"logit_softcap": 3.0, "logit_scale": 0.7}], ids=["plain", "scaled-softcapped"])
def test_positions_computed_in_chunks_give_the_numbers_of_one_pass(monkeypatch, head):
    """`_LOGIT_ELEMENTS`, `_PRODUCT_ELEMENTS` and `_WORK_ELEMENTS` only set how many positions are computed
    together; every field must come out the same (up to the output product's BLAS layout) whether 300 positions run
    at once or in logit blocks of 42, product groups of 21 and steps of 7 (the last block, group and step short)."""
    import promptopt.metrics.tcb as tcb

    torch.manual_seed(3)
    w, h = torch.randn(1000, 16), 2 * torch.randn(300, 16)
    target = torch.randint(0, 1000, (300,))
    for name in ("_WORK_ELEMENTS", "_PRODUCT_ELEMENTS", "_LOGIT_ELEMENTS"):
        monkeypatch.setattr(tcb, name, 300 * 1000)
    bias = torch.randn(1000) if head else None  # the gain (scale, soft-cap) is sliced with the logits
    whole = OutputGeometry(w, bias=bias, **head)(h, target=target)
    monkeypatch.setattr(tcb, "_WORK_ELEMENTS", 7 * 1000)
    monkeypatch.setattr(tcb, "_PRODUCT_ELEMENTS", 23 * 1000)  # the product with W for 21 positions (3 steps) at a time
    monkeypatch.setattr(tcb, "_LOGIT_ELEMENTS", 50 * 1000)  # logits for 42 positions (2 groups) at a time
    chunked = OutputGeometry(w, bias=bias, **head)(h, target=target)
    for name in ("tcb", "jacobian_norm", "v_eff", "margin", "entropy", "top_prob", "nll", "tcb_approx", "tcb_diffuse"):
        assert torch.allclose(getattr(chunked, name), getattr(whole, name), rtol=1e-6, atol=0), name
    assert torch.equal(chunked.top_token, whole.top_token)


def test_statistics_of_w_over_several_steps_match_one_float64_pass():
    """Row norms and Var(W) come from a pass over W in steps of `_STATISTICS_ROWS` rows; across steps (and a
    short last one) they are the float64 values of the whole matrix."""
    import promptopt.metrics.tcb as tcb

    torch.manual_seed(5)
    w = torch.randn(2 * tcb._STATISTICS_ROWS + 37, 24) * 0.05 + 0.01
    geometry = OutputGeometry(w)
    assert torch.equal(geometry.row_sq_norms, w.double().pow(2).sum(-1))
    assert geometry.sigma2 == pytest.approx(float(w.double().var(unbiased=False)), rel=1e-10)


@pytest.mark.parametrize("head", [{}, {"logit_softcap": 3.0, "logit_scale": 0.7}], ids=["plain", "scaled-softcapped"])
def test_given_logits_give_the_numbers_of_its_own(monkeypatch, head):
    """A caller that has `logits_and_gain(h)` already (the runner's log-probs) hands it in: every field is what the
    head computes on its own, in logit blocks too; logits of the wrong shape are refused."""
    import promptopt.metrics.tcb as tcb

    torch.manual_seed(5)
    w, h = torch.randn(1000, 16), 2 * torch.randn(90, 16)
    target = torch.randint(0, 1000, (90,))
    geometry = OutputGeometry(w, bias=torch.randn(1000) if head else None, **head)
    monkeypatch.setattr(tcb, "_LOGIT_ELEMENTS", 40 * 1000)  # blocks of 40 positions: the given logits are sliced too
    own = geometry(h, target=target)
    given = geometry(h, target=target, logits=geometry.logits_and_gain(h))
    assert (given.to_dict().keys()) == own.to_dict().keys()
    for name, value in own.to_dict().items():
        assert torch.equal(getattr(given, name), value), name
    shifted = geometry(h, target=target, logits=(geometry.logits(h) + 1.0, geometry.logits_and_gain(h)[1]))
    assert not torch.equal(shifted.nll, own.nll)  # the given logits are the ones read
    with pytest.raises(ValueError, match="logits have shape"):
        geometry(h, logits=geometry.logits_and_gain(h[:10]))


def _dense(tokens: torch.Tensor, values: torch.Tensor, vocab: int) -> torch.Tensor:
    """The sparse (tokens, values) shift as a dense float64 (N, V) matrix, a token listed twice getting both."""
    dense = torch.zeros(tokens.shape[0], vocab, dtype=torch.float64)
    return dense.scatter_add_(1, tokens, values.double())


@pytest.mark.parametrize("scale, softcap", [(0.5, None), (4.0, None), (30.0, None), (4.0, 8.0), (120.0, None)])
def test_a_label_bias_matches_the_float64_reference(scale, softcap):
    """A calibrated decision shifts a few logits by constants (metrics/tcb.py): δ_TCB on the shifted distribution,
    against the explicit float64 Jacobian of the shifted logits, to 1e-6 relative (flat to very peaked)."""
    from promptopt.metrics import approximation_reference

    gen = torch.Generator().manual_seed(int(scale * 10))
    w = torch.randn(3000, 48, generator=gen) * 0.4
    h = torch.randn(16, 48, generator=gen) * scale
    plain = w @ h.T
    top2 = plain.T.topk(2).indices  # shift the two most likely tokens and a third, listed twice: its shifts add up
    tokens = torch.cat([top2, torch.full((16, 2), 7)], dim=1)
    values = torch.randn(16, 4, generator=gen, dtype=torch.float64) * 3.0
    geometry = OutputGeometry(w, logit_softcap=softcap)
    ours = geometry(h, shift_tokens=tokens, shift_values=values)
    dense = _dense(tokens, values, w.shape[0])
    ref = jacobian_frobenius_reference(h, w, logit_softcap=softcap, logit_shift=dense)
    assert torch.allclose(ours.jacobian_norm, ref, rtol=1e-6, atol=0)
    assert torch.allclose(
        ours.tcb_approx, approximation_reference(h, w, logit_softcap=softcap, logit_shift=dense), rtol=1e-6
    )
    s64 = h.double() @ w.double().T
    shifted = (s64 if softcap is None else softcap * torch.tanh(s64 / softcap)) + dense  # float64 logits + shift
    assert torch.equal(ours.top_token, shifted.argmax(-1))  # the companions read the shifted distribution too
    assert torch.allclose(ours.top_prob, torch.softmax(shifted, -1).amax(-1), rtol=1e-6)
    unshifted = geometry(h)
    assert not torch.allclose(unshifted.jacobian_norm, ours.jacobian_norm, rtol=1e-3)  # the shift matters
    # the same shift given with precomputed logits (the runner's path) leaves those logits untouched
    logits = geometry.logits_and_gain(h)
    before = logits[0].clone()
    again = geometry(h, logits=logits, shift_tokens=tokens, shift_values=values)
    assert torch.equal(logits[0], before) and torch.allclose(again.jacobian_norm, ours.jacobian_norm, rtol=1e-12)


def test_a_shift_that_makes_a_state_peaked_stays_exact():
    """A bias that pushes one label far ahead (o' → 1): the anchored sum holds there too, +inf only where the
    reference's norm is 0."""
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(500, 16, generator=gen)
    h = torch.randn(6, 16, generator=gen)
    tokens = torch.tensor([[3], [3], [3], [9], [9], [9]])
    values = torch.tensor([[10.0], [20.0], [30.0], [10.0], [25.0], [35.0]], dtype=torch.float64)
    ours = token_constraint_bound(h, w, shift_tokens=tokens, shift_values=values)
    ref = jacobian_frobenius_reference(h, w, logit_shift=_dense(tokens, values, 500))
    finite = ref > 0
    assert torch.allclose(ours.jacobian_norm[finite], ref[finite], rtol=1e-6, atol=0)
    assert torch.equal(torch.isinf(ours.tcb), ~finite)


def test_shift_arguments_are_checked():
    w, h = torch.randn(50, 4), torch.randn(2, 4)
    with pytest.raises(ValueError, match="go together"):
        token_constraint_bound(h, w, shift_tokens=torch.zeros(2, 1, dtype=torch.long))
