"""CPU attention for scoring and generation: transformers' sdpa with grouped-query heads kept grouped under a mask
(`_grouped_sdpa`), registered as its own attention implementation (`use_grouped_sdpa`)."""

from __future__ import annotations

import threading

import torch

GROUPED_SDPA = "promptopt_grouped_sdpa"

_last_mask = threading.local()  # .pair: (a boolean mask, its additive form), the last one converted in this thread


def _additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as the additive one (0 where attended, -inf elsewhere) that torch's CPU kernel turns it into,
    converted once per forward instead of once per layer: every layer of a forward gets the same mask object.
    The kernel's own conversion gives the same values, so the numbers are the same bit for bit."""
    if mask.dtype != torch.bool:
        return mask
    last = getattr(_last_mask, "pair", None)
    if last is not None and last[0] is mask and last[1].dtype == dtype:
        return last[1]
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask.logical_not(), float("-inf"))
    _last_mask.pair = (mask, additive)
    return additive


def _grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' sdpa, except that on CPU grouped-query key/value heads reach torch's kernel ungrouped under
    a mask as well.

    Under a mask (every prefix-cached or padded batch) transformers copies each key/value head once per query
    head of its group, layer by layer, because CUDA kernels need it; torch's CPU kernel takes the groups as they
    are (`enable_gqa`) and gives the same numbers bit for bit. On SmolLM2's prefix-cached scoring shapes (16 rows,
    28 queries, 152 keys) attention ran 2.3x faster and the whole forward 1.07-1.13x.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = kwargs.get("position_bias") is None and kwargs.get("softcap") is None
    if query.device.type == "cpu" and attention_mask is not None and plain:
        attention_mask = _additive_mask(attention_mask, query.dtype)
    if (
        query.device.type != "cpu"
        or attention_mask is None
        or getattr(module, "num_key_value_groups", 1) == 1
        or not plain
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


def use_grouped_sdpa(model: torch.nn.Module) -> None:
    """Run an sdpa model on CPU through `_grouped_sdpa` (registered once, with sdpa's masks)."""
    if model.config._attn_implementation != "sdpa" or next(model.parameters()).device.type != "cpu":
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, _grouped_sdpa)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    model.set_attn_implementation(GROUPED_SDPA)
