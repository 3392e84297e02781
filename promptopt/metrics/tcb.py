"""δ_TCB (Token Constraint Bound) and the next-token geometry it comes with.

For the final hidden state h, output matrix W (V×d, rows w_i), logits z = W h and o = softmax(z):

    J = (diag(o) − o oᵀ) W,     ‖J‖²_F = Σ_i o_i² ‖w_i − μ‖²,  μ = Wᵀ o,     δ_TCB = ε / ‖J‖_F

With a logit scale or a final soft-cap (z_i = cap·tanh(scale·s_i / cap), s = W h), each logit's chain-rule
factor g_i = dz_i/ds_i = scale·sech²(scale·s_i / cap) multiplies its row: the same formula holds with
w'_i = g_i w_i, and it is exact.

Which W: the matrix the logits promptopt scores with come from (the runner projects h through this module), so
log-probs, answers and δ_TCB read one W. Quantized (bitsandbytes, `--quantize`): transformers keeps `lm_head`, and a
head tied to the input embedding, in float, so δ_TCB reads that float head while h carries the 4/8-bit layers' error;
a quantized head is de-quantized once (models/load.py) and δ_TCB is exact for it. LLM.int8's own matmul also
quantizes h, so its logits differ from W h by ~1% (the load checks the bound); promptopt's numbers are W h's. δ_TCB
of a quantized model is not its float32 original's (docs/models.md measures the gap): a card records its precision.

Numerics. The expanded form Σ o_i²(‖w_i‖² − 2 w_i·μ + ‖μ‖²) cancels catastrophically when o_top → 1 (the
"very stable" states). Here the sum is anchored on the top token t: with u_i = w'_i − w'_t and
c = μ − w'_t = Σ_{j≠t} o_j u_j (summed from the small terms, never via 1 − o_t),

    ‖J‖²_F = Σ_i o_i² ‖u_i − c‖².

The K most probable rows are done directly in float64 (their logits recomputed in float64 too); the tail
goes through float32 matrix products over W with its weights rescaled to O(1), so nothing underflows.
J is never built: the cost is three passes over W per position (logits, then one product with two
right-hand sides).

Statistical approximation (paper App. F). With W's entries i.i.d. of variance σ², E‖J‖²_F ≈ dσ² ‖M G‖²_F,
M = diag(o) − o oᵀ, G = diag(g) the chain-rule gains (G = I for plain logits, |scale|·I for a logit scale):

    ‖M G‖²_F = Σ_j g_j² o_j² (1 − 2 o_j + S2),     tcb_approx = ε / sqrt(dσ² ‖M G‖²_F)

which is the paper's S2 − 2 S3 + S2² when G = I. That expanded form cancels like the exact one: at
o_top = 1 − η it is O(η²) out of O(1) terms, wrong below η ≈ 1e-7 and +inf or garbage below 1e-8. Here
the top token's term uses 1 − 2 o_t + S2 = η² + Σ_{j≠t} o_j², with η summed from the small terms; for
every other token o_j ≤ 1/2, so each term is a product of non-negative factors. Its diffuse limit
(1 − 2 o_j + S2 → 1) is tcb_diffuse = ε / sqrt(dσ² Σ_j g_j² o_j²) = ε sqrt(V_eff / (dσ²)) when G = I.

Decided distributions (`shift_tokens` / `shift_values`): a calibrated rule adds constants Δ to some logits, so
∂z'/∂h = ∂z/∂h and J' = (diag(o') − o' o'ᵀ) W' with o' = softmax(z + Δ): the closed form is exact for o', whether
Δ is one row for every item (contextual, batch) or each item's own (pmi: −r_k of its choices). Which Δ stands for
a decision over whole choices is a *reading* (scoring/calibration.py, `first_token_shifts`): exact for one-token
choices; for longer ones each choice's shift goes on its first token, and a token that starts several choices
(COPA's "the …") gets log Σ_k e^(ℓ_k+Δ_k) − log Σ_k e^(ℓ_k) over them; what follows the first token, where
such choices are told apart, is read by neither raw nor decided δ_TCB.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

__all__ = [
    "OutputGeometry",
    "TCBResult",
    "approximation_reference",
    "jacobian_frobenius_reference",
    "token_constraint_bound",
]

_EXACT_TOP_K = 32
_VOCAB_CHUNK = 16384
# Positions × vocab computed at once. Each position is computed on its own, so these only set how much memory is
# touched at a time. The float32 logits come from one product per block of 2^24 (336 SmolLM2 positions, 64 of
# Gemma-3's: BLAS is ~2x faster on such blocks than on 21 rows); the elementwise work after it runs on 2^20 at a
# time (21 SmolLM2 positions), which keeps the (positions × V) float32/float64 passes near the CPU's cache; and the
# tail's product with W (Σ o w, Σ o² w) runs once per group of 2^23 (168 SmolLM2 positions, 32 of Gemma-3's). On
# 200 SmolLM2 positions (2 CPU cores) δ_TCB took 0.56 s with logits and elementwise work both at 2^24, 0.50–0.54 s
# with both at 2^20, 0.42–0.45 s with the logits at 2^24 and the rest, product included, at 2^20; that product
# alone took 0.40 s in 21-position steps and 0.19 s in one, and δ_TCB as a whole went 0.80 -> 0.55 s with these
# groups (the same numbers, torch.equal; another, slower machine, 2026-12-02).
# tests/metrics/test_tcb.py checks that the numbers do not depend on these sizes.
_LOGIT_ELEMENTS = 1 << 24
_WORK_ELEMENTS = 1 << 20
_PRODUCT_ELEMENTS = 1 << 23
# Rows of W per step of its one float64 pass (`_statistics`, paid once per model, inside the first scoring call):
# 1024 SmolLM2 rows are 4.7 MB in float64, near the CPU's cache; 0.13-0.15 s with 16384 rows, 0.033-0.035 s with
# 1024, the same numbers (torch.equal on the row norms, the same sum; float64 weights are no longer rounded to
# float32 on the way, as the 16384-row GEMM chunks are).
_STATISTICS_ROWS = 1024


@dataclass
class TCBResult:
    """Per-position metrics, each a tensor shaped like the leading dimensions of `hidden`."""

    tcb: torch.Tensor  # δ_TCB = ε / ‖J‖_F (float64; +inf where ‖J‖_F = 0)
    jacobian_norm: torch.Tensor  # ‖J‖_F
    v_eff: torch.Tensor  # 1 / Σ o_i²
    margin: torch.Tensor  # z_top1 − z_top2
    entropy: torch.Tensor  # −Σ o log o (nats)
    top_prob: torch.Tensor  # o_top
    top_token: torch.Tensor  # argmax token id (int64)
    nll: torch.Tensor  # −log o of the target token, or of the predicted token when no target is given
    s2: torch.Tensor  # Σ o_i²
    s3: torch.Tensor  # Σ o_i³
    tcb_approx: torch.Tensor  # ε / sqrt(d σ² Σ g² o² (1 − 2o + S2)) = ε / sqrt(dσ²(S2 − 2S3 + S2²)) for plain logits
    tcb_diffuse: torch.Tensor  # ε / sqrt(d σ² Σ g² o²) = ε · sqrt(V_eff / (d σ²)) for plain logits (its diffuse limit)

    def to_dict(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class OutputGeometry:
    """The output head as δ_TCB sees it: W, optional bias, logit scale and soft-cap.

    Build it once per model; it caches the row norms ‖w_i‖² and Var(W) so each call only pays the
    passes over W that depend on h. W may be any float dtype and device: chunks are upcast to float32
    on the fly, so a bf16 70B-vocab head never needs a full float32 copy.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        *,
        bias: torch.Tensor | None = None,
        logit_scale: float | None = None,
        logit_softcap: float | None = None,
        exact_top_k: int = _EXACT_TOP_K,
    ) -> None:
        if weight.ndim != 2:
            raise ValueError(f"weight must be a V×d matrix, got shape {tuple(weight.shape)}")
        if not weight.is_floating_point():
            raise ValueError(f"weight must be floating point, got {weight.dtype}")
        if logit_softcap is not None and not logit_softcap > 0:
            raise ValueError(f"logit_softcap must be positive, got {logit_softcap}")
        if logit_scale is not None and logit_scale == 0:
            raise ValueError("logit_scale must be non-zero")
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.logit_scale = None if logit_scale in (None, 1.0) else float(logit_scale)
        self.logit_softcap = None if logit_softcap is None else float(logit_softcap)
        self.vocab_size, self.hidden_size = weight.shape
        self.exact_top_k = max(2, min(exact_top_k, self.vocab_size))
        self._row_sq_norms: torch.Tensor | None = None  # float64, V
        self._row_sq_norms_f32_cache: torch.Tensor | None = None  # the same as float32, where δ_TCB runs
        self._sigma2: float | None = None

    # --- cached statistics of W -------------------------------------------------------------
    def _chunks(self):
        for start in range(0, self.vocab_size, _VOCAB_CHUNK):
            stop = min(start + _VOCAB_CHUNK, self.vocab_size)
            yield start, stop, self.weight[start:stop].float()

    def _statistics(self) -> None:
        """‖w_i‖² and Var(W) in one float64 pass over W (the only pass that does not depend on h): the row
        norms feed the anchored ‖J‖² expansion, σ² the statistical approximation."""
        parts, total = [], 0.0
        for start in range(0, self.vocab_size, _STATISTICS_ROWS):
            w = self.weight[start : start + _STATISTICS_ROWS].double()
            parts.append(w.pow(2).sum(-1))
            total += float(w.sum())
        self._row_sq_norms = torch.cat(parts)
        n = self.vocab_size * self.hidden_size
        mean = total / n
        self._sigma2 = float(self._row_sq_norms.sum()) / n - mean * mean

    @property
    def row_sq_norms(self) -> torch.Tensor:
        if self._row_sq_norms is None:
            self._statistics()
        return self._row_sq_norms

    def _row_sq_norms_f32(self, device: torch.device) -> torch.Tensor:
        """‖w_i‖² as float32 on `device`, converted once (every step of positions reads it)."""
        cached = self._row_sq_norms_f32_cache
        if cached is None or cached.device != torch.device(device):
            cached = self._row_sq_norms_f32_cache = self.row_sq_norms.to(device=device, dtype=torch.float32)
        return cached

    @property
    def sigma2(self) -> float:
        """Var of all entries of W (the statistical approximation's σ²)."""
        if self._sigma2 is None:
            self._statistics()
        return self._sigma2

    # --- logits and their chain-rule factors --------------------------------------------------
    def _transform(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Raw products s (+bias already) -> (logits z, gain dz/ds or None when it is 1)."""
        gain = None
        if self.logit_scale is not None:
            s = s * self.logit_scale
            gain = torch.full_like(s, self.logit_scale)
        if self.logit_softcap is not None:
            x = s / self.logit_softcap
            sech2 = torch.cosh(x).reciprocal().pow(2)
            gain = sech2 if gain is None else gain * sech2
            s = self.logit_softcap * torch.tanh(x)
        return s, gain

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits (N, V) for hidden (N, d), vocab-chunked."""
        return self.logits_and_gain(hidden)[0]

    def logits_and_gain(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """float32 logits (N, V) and their gain dz/ds (None for plain logits): what `__call__` reads, for a caller
        that also needs the logits themselves (the runner's log-probs) to compute them once for both."""
        h = hidden.float()
        z = torch.empty(h.shape[0], self.vocab_size, dtype=torch.float32, device=h.device)
        gain = None if self.logit_scale is None and self.logit_softcap is None else torch.empty_like(z)
        for start, stop, w in self._chunks():
            # With few rows (every decoding step) W·hᵀ is the same products in a layout BLAS (MKL on CPU)
            # runs ~2× faster than h·Wᵀ; at 256 rows runs measured 0.95–1.3×, so many rows keep h·Wᵀ
            # (bench/bench_generation.py).
            s = (w @ h.T).T if h.shape[0] < 128 else h @ w.T
            if self.bias is not None:
                s = s + self.bias[start:stop].float()
            z[:, start:stop], g = self._transform(s)
            if gain is not None:
                gain[:, start:stop] = g
        return z, gain

    # --- the metric ------------------------------------------------------------------------
    def __call__(
        self,
        hidden: torch.Tensor,
        *,
        eps: float = 1.0,
        target: torch.Tensor | None = None,
        logits: tuple[torch.Tensor, torch.Tensor | None] | None = None,
        shift_tokens: torch.Tensor | None = None,
        shift_values: torch.Tensor | None = None,
    ) -> TCBResult:
        """δ_TCB and its companions at each position of `hidden` (..., d). `logits`: `logits_and_gain(hidden)`
        when the caller has it already (rows flattened like `hidden`), so that W·h is not computed twice.

        `shift_tokens` / `shift_values` (..., L): a constant added to the final logit of each listed token (after
        bias, scale and soft-cap; a token listed twice gets both), e.g. a calibrated decision's label bias. A
        constant shift leaves the Jacobian's form unchanged, J = (diag(o') − o' o'ᵀ) W', so every number here is
        then that of the shifted distribution o' = softmax(z + shift): the distribution the decision reads."""
        if hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden has size {hidden.shape[-1]} but weight has d={self.hidden_size}")
        lead = hidden.shape[:-1]
        h = hidden.reshape(-1, self.hidden_size)
        tgt = None if target is None else target.reshape(-1).to(h.device)
        if tgt is not None and tgt.shape[0] != h.shape[0]:
            raise ValueError(f"target has {tgt.shape[0]} entries for {h.shape[0]} positions")
        shift = _flat_shift(shift_tokens, shift_values, h.shape[0])
        if logits is not None and tuple(logits[0].shape) != (h.shape[0], self.vocab_size):
            raise ValueError(
                f"logits have shape {tuple(logits[0].shape)} for {h.shape[0]} positions and V={self.vocab_size}"
            )
        step = max(1, _WORK_ELEMENTS // self.vocab_size)
        group = max(1, _PRODUCT_ELEMENTS // self.vocab_size // step) * step
        block = max(1, _LOGIT_ELEMENTS // self.vocab_size // group) * group
        parts = []
        for b in range(0, h.shape[0], block):
            if logits is None:
                z, gain = self.logits_and_gain(h[b : b + block])
            else:
                z, gain = logits[0][b : b + block], None if logits[1] is None else logits[1][b : b + block]
            if shift is not None:  # on a copy: the caller's logits stay the plain ones
                ids, values = shift[0][b : b + block].to(z.device), shift[1][b : b + block].to(z.device)
                z = z.clone().scatter_add_(1, ids, values.float())
            for g in range(b, min(b + block, h.shape[0]), group):
                coef = torch.empty(min(group, h.shape[0] - g), 2, self.vocab_size, dtype=torch.float32, device=h.device)
                steps = []
                for i in range(g, g + coef.shape[0], step):
                    rows = slice(i - b, i - b + step)
                    step_logits = z[rows], None if gain is None else gain[rows]
                    target_i = None if tgt is None else tgt[i : i + step]
                    shift_i = None if shift is None else (shift[0][i : i + step], shift[1][i : i + step])
                    steps.append(
                        self._before_product(
                            h[i : i + step], target_i, eps, step_logits, coef[i - g : i - g + step], shift_i
                        )
                    )
                m = self._weighted_rows(coef).to(torch.float64)  # one product for the group: Σ o w, Σ o² w of the tails
                for i, (companions, jacobian) in zip(range(0, coef.shape[0], step), steps):
                    parts.append({**self._after_product(jacobian, m[i : i + step], eps), **companions})
        if not parts:
            empty = torch.empty(lead, dtype=torch.float64, device=hidden.device)
            return TCBResult(**{f.name: empty for f in fields(TCBResult)})
        return TCBResult(**{k: torch.cat([p[k] for p in parts]).reshape(lead) for k in parts[0]})

    def _before_product(
        self, h: torch.Tensor, target: torch.Tensor | None, eps: float, logits, coef: torch.Tensor, shift=None
    ) -> tuple[dict, dict]:
        """Everything that reads the (positions × V) logits, for a step of positions: the tail's coefficients for
        the product with W, written into `coef` (n, 2, V); the companions; and what `_after_product` needs besides
        that product to finish ‖J‖."""
        n, k = h.shape[0], self.exact_top_k
        f64 = torch.float64
        rows = torch.arange(n, device=h.device)

        # Pass 1: float32 logits (`logits`: z and its gain, from `logits_and_gain` on these positions); the top
        # K+1 are found there, the top K recomputed exactly in float64.
        z, gain = logits
        top_idx = z.topk(min(k + 1, self.vocab_size), dim=-1).indices
        tail_ref = z.gather(1, top_idx[:, k:]).amax(-1) if top_idx.shape[1] > k else torch.zeros(n, device=h.device)
        top_idx = top_idx[:, :k]
        w_top = self.weight[top_idx].to(f64)  # (n, K, d)
        s_top = torch.einsum("nkd,nd->nk", w_top, h.to(f64))
        if self.bias is not None:
            s_top = s_top + self.bias[top_idx].to(f64)
        z_top, g_top = self._transform(s_top)
        if shift is not None:  # the same constants, added exactly: Σ over the listed tokens equal to each top token
            ids, values = shift[0].to(h.device), shift[1].to(device=h.device, dtype=f64)
            z_top = z_top + ((top_idx[:, :, None] == ids[:, None, :]) * values[:, None, :]).sum(-1)
        order = z_top.argsort(dim=-1, descending=True)  # re-rank inside K in exact arithmetic
        top_idx, z_top = top_idx.gather(1, order), z_top.gather(1, order)
        w_top = w_top.gather(1, order[..., None].expand(-1, -1, self.hidden_size))
        g_top = None if g_top is None else g_top.gather(1, order)

        # The tail (outside K) stays float32, relative to its own largest logit r: e_i = exp(z_i − r) ≤ 1.
        # Its true probabilities are f·e_i with f = exp(r − logsumexp(z)), a float64 scalar per position.
        # e and e² are written straight into the product's coefficients when the logits are plain (no gain)
        shifted = z - tail_ref[:, None]  # z_i − r
        e = torch.exp(shifted, out=coef[:, 0] if gain is None else None).scatter_(1, top_idx, 0.0)  # (n, V) float32
        ge = e if gain is None else e * gain
        e2 = torch.mul(e, e, out=coef[:, 1] if gain is None else None)
        sum_e = e.sum(-1, dtype=f64)
        sum_e2 = e2.sum(-1, dtype=f64)
        z_max = z_top[:, 0]
        log_norm = z_max + torch.log(
            torch.exp(z_top - z_max[:, None]).sum(-1) + torch.exp(tail_ref.to(f64) - z_max) * sum_e
        )
        f = torch.exp(tail_ref.to(f64) - log_norm)  # tail scale
        logp_top = z_top - log_norm[:, None]
        o_top = logp_top.exp()  # (n, K) float64, o_top[:, 0] is the predicted token

        s2 = o_top.pow(2).sum(-1) + f.pow(2) * sum_e2
        sum_e3 = (e2 * e).sum(-1, dtype=f64)
        s3 = o_top.pow(3).sum(-1) + f.pow(3) * sum_e3
        tail_elog = (e * shifted).sum(-1, dtype=f64)  # Σ e_i (z_i − r)
        tail_entropy = torch.where(f > 0, f * (torch.log(f.clamp_min(torch.finfo(f64).tiny)) * sum_e + tail_elog), 0.0)
        entropy = -(o_top * logp_top).sum(-1) - tail_entropy

        # Tail sums through one float32 product with W (`_after_product`): Σ o_j w'_j and Σ o_j² w'_j.
        if gain is not None:
            coef[:, 0] = ge
            coef[:, 1] = e * ge
        tail_sum1 = f * sum_e
        tail_sum2 = f.pow(2) * sum_e2
        g2r = self._row_sq_norms_f32(h.device)[None, :]
        if gain is not None:
            g2r = g2r * gain * gain
        tail_sq = f.pow(2) * (e2 * g2r).sum(-1, dtype=f64)  # Σ_tail o_i² ‖w'_i‖²

        w_eff = w_top if g_top is None else w_top * g_top[..., None]  # exact rows w'_i for i in K

        # Statistical approximation E‖J‖²_F ≈ dσ² ‖M G‖²_F (module docstring); sums of non-negative terms.
        g2_top = None if g_top is None else g_top.pow(2)
        t_eps = o_top[:, 1:].sum(-1) + tail_sum1  # 1 − o_t from the small terms
        t_s2 = o_top[:, 1:].pow(2).sum(-1) + tail_sum2  # S2 − o_t²
        head_m = o_top.pow(2) * (1 - 2 * o_top + s2[:, None])
        head_m[:, 0] = o_top[:, 0].pow(2) * (t_eps.pow(2) + t_s2)
        if gain is None:  # g = 1: the tail's S2 and S3 sums above, not two more passes over (n, V)
            tail_g2, tail_g3 = f.pow(2) * sum_e2, f.pow(3) * sum_e3
        else:
            ge2 = e2 * gain * gain
            tail_g2 = f.pow(2) * ge2.sum(-1, dtype=f64)  # Σ_tail g² o²
            tail_g3 = f.pow(3) * (ge2 * e).sum(-1, dtype=f64)  # Σ_tail g² o³
        m_sq = (head_m if g2_top is None else head_m * g2_top).sum(-1) + tail_g2 * (1 + s2) - 2 * tail_g3
        g2_s2 = (o_top.pow(2) if g2_top is None else o_top.pow(2) * g2_top).sum(-1) + tail_g2  # Σ g² o²
        d_sigma2 = self.hidden_size * self.sigma2
        inf = torch.full_like(s2, float("inf"))
        tcb_approx = torch.where(m_sq > 0, eps / (d_sigma2 * m_sq.clamp_min(0)).sqrt(), inf)
        v_eff = 1.0 / s2
        tcb_diffuse = torch.where(g2_s2 > 0, eps / (d_sigma2 * g2_s2).sqrt(), inf)

        pred = top_idx[:, 0]
        if target is None:
            nll = -logp_top[:, 0]
        else:  # exact when the target is among the top K, float32 logit otherwise
            in_top = top_idx == target[:, None]
            z_target = torch.where(in_top.any(-1), (z_top * in_top).sum(-1), z[rows, target].to(f64))
            nll = log_norm - z_target
        jacobian = {
            "f": f,
            "o_top": o_top,
            "w_eff": w_eff,
            "tail_sum1": tail_sum1,
            "tail_sum2": tail_sum2,
            "tail_sq": tail_sq,
        }
        companions = {
            "v_eff": v_eff,
            "margin": z_top[:, 0] - z_top[:, 1],
            "entropy": entropy,
            "top_prob": o_top[:, 0],
            "top_token": pred,
            "nll": nll,
            "s2": s2,
            "s3": s3,
            "tcb_approx": tcb_approx,
            "tcb_diffuse": tcb_diffuse,
        }
        return companions, jacobian

    def _after_product(self, jacobian: dict, m: torch.Tensor, eps: float) -> dict[str, torch.Tensor]:
        """‖J‖_F and δ_TCB for a step of positions from `_before_product`'s `jacobian` and the tail's product with
        W, m (n, 2, d) float64: Σ e_j w'_j and Σ e_j² w'_j (tail probabilities o_j = f·e_j)."""
        f, o_top, w_eff = jacobian["f"], jacobian["o_top"], jacobian["w_eff"]
        tail_sum1, tail_sum2, tail_sq = jacobian["tail_sum1"], jacobian["tail_sum2"], jacobian["tail_sq"]
        m1 = f[:, None] * m[:, 0]
        m2 = f.pow(2)[:, None] * m[:, 1]
        # Exact rows, anchored on the top token.
        anchor = w_eff[:, 0]  # w'_t
        u = w_eff - anchor[:, None, :]  # (n, K, d), u_t = 0
        c = (o_top[:, 1:, None] * u[:, 1:]).sum(1) + (m1 - tail_sum1[:, None] * anchor)  # μ − w'_t
        # Top-K part: Σ_K o_i² ‖u_i − c‖², a sum of non-negative terms.
        head_part = (o_top.pow(2) * (u - c[:, None, :]).pow(2).sum(-1)).sum(-1)
        # Tail part: Σ_tail o_i² ‖u_i − c‖² = Σ o²‖u‖² − 2 c·Σ o² u + Σo² ‖c‖², with u = w' − anchor.
        tail_u_sq = tail_sq - 2 * (anchor * m2).sum(-1) + tail_sum2 * anchor.pow(2).sum(-1)
        tail_m2u = m2 - tail_sum2[:, None] * anchor
        tail_part = tail_u_sq - 2 * (c * tail_m2u).sum(-1) + tail_sum2 * c.pow(2).sum(-1)
        jac = (head_part + tail_part.clamp_min(0.0)).sqrt()
        tcb = torch.where(jac > 0, eps / jac, torch.full_like(jac, float("inf")))
        return {"tcb": tcb, "jacobian_norm": jac}

    def _weighted_rows(self, coef: torch.Tensor) -> torch.Tensor:
        """coef (n, r, V) float32 -> Σ_i coef_i w_i, shape (n, r, d), vocabulary-chunked."""
        out = torch.zeros(*coef.shape[:2], self.hidden_size, dtype=torch.float32, device=coef.device)
        for start, stop, w in self._chunks():
            out += coef[..., start:stop] @ w
        return out


def _flat_shift(tokens, values, n: int):
    """(tokens, values) reshaped to (n, L), checked; None when no shift is given."""
    if tokens is None and values is None:
        return None
    if tokens is None or values is None or tokens.shape != values.shape:
        raise ValueError("shift_tokens and shift_values go together and need the same shape")
    tokens, values = tokens.reshape(n, -1).long(), values.reshape(n, -1).double()
    return tokens, values


def token_constraint_bound(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float = 1.0,
    logit_scale: float | None = None,
    logit_softcap: float | None = None,
    bias: torch.Tensor | None = None,
    target: torch.Tensor | None = None,
    shift_tokens: torch.Tensor | None = None,
    shift_values: torch.Tensor | None = None,
) -> TCBResult:
    """δ_TCB and its companions for every position of `hidden` (..., d), given the output matrix W (V×d).

    `target` (same leading shape as hidden) selects the token whose −log o is reported as `nll`;
    without it, the predicted token's. For repeated calls on one model, build an `OutputGeometry` once.

    Args:
        hidden: final hidden states, shape (..., d).
        weight: the output (unembedding) matrix W, shape (V, d).
        eps: the probability change δ_TCB bounds (1.0: the paper's definition).
        logit_scale: a constant the model multiplies its logits by, if any.
        logit_softcap: the model's final logit soft-cap, if any.
        bias: the output layer's bias, shape (V,), if any.
        target: token ids (same leading shape as hidden) whose −log o is reported as `nll`.
        shift_tokens: token ids whose logits a decision rule shifts (e.g. the label tokens of a calibrated rule).
        shift_values: the constant added to each of those logits, so δ_TCB is read on the decided distribution.

    Returns:
        A TCBResult per position: δ_TCB, the Jacobian norm, V_eff, margin, entropy, top probability and the NLL.

    Raises:
        ValueError: `weight` is not a floating-point V×d matrix, or a non-positive soft-cap or a zero scale.
    """
    geometry = OutputGeometry(weight, bias=bias, logit_scale=logit_scale, logit_softcap=logit_softcap)
    return geometry(hidden, eps=eps, target=target, shift_tokens=shift_tokens, shift_values=shift_values)


# The slow float64 references live beside this module (tcb_reference.py); re-exported here, where they were.
from promptopt.metrics.tcb_reference import approximation_reference, jacobian_frobenius_reference  # noqa: E402
