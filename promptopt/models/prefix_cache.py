"""The shared prefix's KV cache, as the runner hands it to the model for a batch of suffixes.

The prefix runs once, on one row; its transformers cache (its layers know their own length and, for a
sliding-window layer, how far the window has moved) is the template every batch starts from:

- Scoring (`PrefixBuffers`): each layer gets a key and a value buffer with a row per batch row, the prefix
  written once at the front. A forward writes its suffix's keys/values right after it and attends to a view of
  both; the layer keeps the prefix's state, so one cache object serves every batch of a call. transformers'
  DynamicCache would instead copy the prefix into every batch twice per layer (its init `cat`, then the
  update's) and free it at the batch's end: on SmolLM2 that was ~130 MB a batch, which glibc handed back to
  the system and page-faulted in again for the next (190,000-270,000 minor faults per 200 items).
- Generation (`growing_cache`): a copy of the template's layers over broadcast (not copied) prefix rows; the
  first decoding step's `cat` makes each row its own, and the cache grows and drops rows as usual.

Only plain full-attention and sliding-window layers are handled (every architecture whose cache is a
DynamicCache of those); a model whose cache has other layers (linear attention, quantized, KV-shared) is run
without the prefix cache (`supported`).
"""

from __future__ import annotations

import copy

import torch
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer


class _WritesAfterPrefix:
    """A cache layer frozen as it stands after the prefix: `update` writes the batch's keys/values behind the
    prefix rows of the buffers and returns a view of both; the layer's own length never moves."""

    _layer_type = None  # not registered as a layer type of its own (transformers registers subclasses by this)
    _key_buffer: torch.Tensor
    _value_buffer: torch.Tensor
    _prefix_width: int

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows, _, width, _ = key_states.shape
        end = self._prefix_width + width
        keys, values = self._key_buffer[:rows, :, :end], self._value_buffer[:rows, :, :end]
        keys[:, :, self._prefix_width :].copy_(key_states)
        values[:, :, self._prefix_width :].copy_(value_states)
        return keys, values


class _FullLayerAfterPrefix(_WritesAfterPrefix, DynamicLayer):
    pass


class _SlidingLayerAfterPrefix(_WritesAfterPrefix, DynamicSlidingWindowLayer):
    pass


_AFTER_PREFIX = {DynamicLayer: _FullLayerAfterPrefix, DynamicSlidingWindowLayer: _SlidingLayerAfterPrefix}


def supported(template: Cache) -> bool:
    """Whether every layer of the prefix's cache is one this module can extend (see the module docstring)."""
    return all(type(layer) in _AFTER_PREFIX and layer.is_initialized for layer in template.layers)


def growing_cache(template: Cache, rows: int) -> Cache:
    """A cache for `rows` rows that starts after the prefix and grows as decoding goes (generation)."""
    cache = copy.copy(template)
    cache.layers = []
    for layer in template.layers:
        grown = copy.copy(layer)
        grown.keys = layer.keys.expand(rows, -1, -1, -1)
        grown.values = layer.values.expand(rows, -1, -1, -1)
        cache.layers.append(grown)
    return cache


class PrefixBuffers:
    """Per-layer key/value buffers that hold the prefix once per batch row, kept across batches, calls and
    prompts: a new prefix is written over the old one when the buffers are large enough, so scoring allocates
    nothing per batch (and a search, nothing per prompt once the longest has been seen)."""

    def __init__(self) -> None:
        self._storage: dict[tuple[int, int], torch.Tensor] = {}  # (layer, 0 keys / 1 values) -> flat buffer
        self._built: tuple[Cache, int, int, Cache] | None = None  # (template, rows, width, the cache over it)

    def cache(self, template: Cache, *, rows: int, width: int) -> Cache:
        """A cache over the prefix in `template` for batches of up to `rows` rows and `width` new tokens.

        It is built once per template and size and serves any number of forwards, each overwriting the suffix
        part only; building it for another template overwrites the prefix part too."""
        if self._built is not None:
            built_for, built_rows, built_width, built = self._built
            if built_for is template and built_rows >= rows and built_width >= width:
                return built
        cache = copy.copy(template)
        cache.layers = [self._layer(i, layer, rows, width) for i, layer in enumerate(template.layers)]
        self._built = (template, rows, width, cache)
        return cache

    def _layer(self, index: int, template: DynamicLayer, rows: int, width: int) -> _WritesAfterPrefix:
        prefix_width = template.keys.shape[-2]
        kind = _AFTER_PREFIX[type(template)]
        layer = kind.__new__(kind)
        layer.__dict__.update(template.__dict__)  # the prefix's state: its length, its window's offset
        buffers = []
        for slot, kept in enumerate((template.keys, template.values)):
            shape = (rows, kept.shape[1], prefix_width + width, kept.shape[3])
            buffer = self._buffer((index, slot), kept, shape)
            buffer[:, :, :prefix_width] = kept  # the one row broadcast to every row, once per prefix
            buffers.append(buffer)
        layer._key_buffer, layer._value_buffer = buffers
        layer._prefix_width = prefix_width
        return layer

    def _buffer(self, key: tuple[int, int], like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """A view of one flat buffer in `shape`, the buffer replaced by a quarter larger one when too small."""
        need = shape[0] * shape[1] * shape[2] * shape[3]
        flat = self._storage.get(key)
        if flat is None or flat.numel() < need or flat.dtype != like.dtype or flat.device != like.device:
            flat = self._storage[key] = like.new_empty(need + need // 4)
        return flat[:need].view(shape)
