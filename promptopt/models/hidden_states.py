"""The final hidden states one scoring call reads (`Runner.loglikelihood`, and `packing.run` where inputs
share positions): per input its rows from its first read position on, and the key each read position's
projection is shared under."""

from __future__ import annotations

import torch


class States:
    """The final hidden states a call reads: per input, its rows from its first read position on; positions that a
    group of inputs shares (packing.py) carry the group's key, so requests reading them share one projection."""

    def __init__(self) -> None:
        self._rows: dict[tuple[int, ...], tuple[int, torch.Tensor]] = {}  # input -> (first position, its rows)
        self._shared: dict[tuple[int, ...], tuple[object, int]] = {}  # input -> (group key, shared length)

    def add(self, seq: tuple[int, ...], first: int, rows: torch.Tensor, group=None, shared: int = 0) -> None:
        self._rows[seq] = (first, rows)
        if group is not None:
            self._shared[seq] = (group, shared)

    def at(self, seq: tuple[int, ...], position: int) -> torch.Tensor:
        first, rows = self._rows[seq]
        return rows[position - first]

    def key(self, seq: tuple[int, ...], position: int) -> tuple:
        group, shared = self._shared.get(seq, (None, 0))
        return ("group", group, position) if position < shared else ("input", seq, position)
