"""Scoring's last layer: its MLP runs only at the positions whose final hidden state is read.

Scoring reads the final hidden state at the answer's positions only (one of ~27 per SST-2 item). Every layer
before the last must run at every position (its keys and values are attended to later), but the last layer's
MLP output reaches nothing except the final hidden state at its own position, so elsewhere it can be skipped:
on SmolLM2 that is ~2.4% of a forward's arithmetic (the MLP is 3/4 of a layer, the last layer 1/30 of the
model), on Gemma-3-270M (18 layers) ~4%. The hidden states at the positions not read are then not the model's,
and nothing reads them. The numbers read are the same up to float rounding: a matrix product over fewer rows
may round differently (measured: identical on SmolLM2 and Gemma-3 at batch 16; at batch 5 within 1.3e-6 in log p on
SST-2, 4.3e-6 on a 14-item yes/no task of my own).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch


def position_wise_last_mlp(base: torch.nn.Module, hidden_size: int, dtype: torch.dtype) -> torch.nn.Module | None:
    """The last decoder layer's MLP where transformers' decoders keep it (`layers[-1].mlp`), if it maps a batch
    of hidden states (`dtype`) to one tensor of the same shape (a dense MLP); None otherwise (a mixture of
    experts returning its router logits, an MLP that fails on the probe), and nothing is skipped."""
    layers = getattr(base, "layers", None)
    mlp = getattr(layers[-1], "mlp", None) if isinstance(layers, torch.nn.ModuleList) and len(layers) else None
    param = next(mlp.parameters(), None) if isinstance(mlp, torch.nn.Module) else None
    if param is None:
        return None
    probe = torch.zeros(1, 2, hidden_size, dtype=dtype, device=param.device)
    try:
        with torch.inference_mode():
            out = mlp(probe)
    except (RuntimeError, TypeError, ValueError):
        return None
    return mlp if isinstance(out, torch.Tensor) and out.shape == probe.shape else None


@contextmanager
def mlp_only_at(mlp: torch.nn.Module | None, read: torch.Tensor):
    """Within the block, `mlp` runs at the flattened (row × position) indices `read` only, zeros elsewhere.

    Only in this thread: the hooks sit on the shared module, and another thread running the same model at the same
    time (a second runner, a server's other request) must get the whole MLP, not this block's rows."""
    if mlp is None:
        yield
        return
    shapes, owner = [], threading.get_ident()

    def only_read(module, args):
        if threading.get_ident() != owner:
            return None
        (x,) = args
        shapes.append(x.shape)
        return (x.reshape(-1, x.shape[-1])[read][None],)

    def scatter_back(module, args, out):
        if threading.get_ident() != owner:
            return None
        shape = shapes.pop()
        full = out.new_zeros(shape[:-1].numel(), out.shape[-1])
        full[read] = out[0]
        return full.view(*shape[:-1], out.shape[-1])

    handles = [mlp.register_forward_pre_hook(only_read), mlp.register_forward_hook(scatter_back)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
