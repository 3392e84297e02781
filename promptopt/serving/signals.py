"""The answer-level fragility signals a card's flag may use, and how a flag reads its threshold.

Pure Python (no numpy, no torch): the export that chooses a threshold, the runtime that applies it and the
risk–coverage measurement all read the signals the same way. Each signal is read on the clean answer at the
critical point, on the distribution the card's decision reads (a calibrated rule's shifted one), and has a
direction: which side of the threshold is fragile.

| signal     | table column | fragile when          | an ensemble's value (its most fragile member) |
|------------|--------------|-----------------------|-----------------------------------------------|
| `tcb`      | tcb          | below τ (small δ_TCB) | the minimum over members                       |
| `margin`   | margin       | below τ               | the minimum over members                       |
| `top_prob` | top_prob     | below τ               | the minimum over members                       |
| `entropy`  | entropy      | above τ               | the maximum over members                       |

An answer without a value (no critical point: nothing was generated) is flagged: nothing vouches for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from promptopt.errors import ConfigError


@dataclass(frozen=True)
class Signal:
    name: str
    label: str  # how tables and docs name it
    below: bool  # True: fragile when the value is below the threshold

    @property
    def direction(self) -> str:
        return "below" if self.below else "above"

    def combine(self, values: list[float]) -> float:
        """An ensemble's value from its members' (the most fragile member's); NaN when a member has none."""
        if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
            return float("nan")
        return min(values) if self.below else max(values)

    def fragility(self, value: float) -> float:
        """A score where higher means more fragile (log10 for δ_TCB, which spans orders of magnitude); +inf for
        a missing value, δ_TCB = +inf (the most stable answer) ranks lowest."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return math.inf
        x = float(value)
        if self.name == "tcb":
            x = -math.inf if x <= 0 else math.log10(x) if math.isfinite(x) else math.inf
        return -x if self.below else x


SIGNALS = (
    Signal("tcb", "δ_TCB", True),
    Signal("margin", "margin", True),
    Signal("top_prob", "max probability", True),
    Signal("entropy", "entropy", False),
)
BY_NAME = {s.name: s for s in SIGNALS}


def signal(name: str, where: str = "signal") -> Signal:
    if name not in BY_NAME:
        raise ConfigError(f"{where}: unknown signal {name!r} (use one of {', '.join(BY_NAME)})")
    return BY_NAME[name]


def threshold_between(fragile: float, steady: float, name: str) -> float:
    """A threshold between the least fragile flagged value and the most fragile unflagged one: their midpoint
    (for δ_TCB the geometric one, as it spans orders of magnitude); the flagged value itself when the other
    side is infinite or they are equal."""
    if not math.isfinite(steady) or not math.isfinite(fragile) or fragile == steady:
        return fragile
    if name == "tcb" and fragile > 0 and steady > 0:
        return math.sqrt(fragile * steady)
    return (fragile + steady) / 2


@dataclass(frozen=True)
class Flag:
    """A card's fragility threshold: flag an answer whose signal is on the fragile side of τ."""

    signal: Signal
    threshold: float

    @property
    def direction(self) -> str:
        return self.signal.direction

    def __call__(self, value) -> bool:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return True
        return value < self.threshold if self.signal.below else value > self.threshold

    def describe(self) -> str:
        return f"{self.signal.label} {'<' if self.signal.below else '>'} {self.threshold:.6g}"


def flag_from_card(card: dict, where: str = "card") -> Flag | None:
    """The card's flag (its `fragility` section), or None when the card has no threshold."""
    section = card.get("fragility")
    if not section:
        return None
    chosen = signal(section.get("signal"), f"{where}: fragility.signal")
    threshold = section.get("threshold")
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool):
        raise ConfigError(f"{where}: fragility.threshold: expected a number, got {threshold!r}")
    if section.get("direction", chosen.direction) != chosen.direction:
        raise ConfigError(
            f"{where}: fragility.direction: signal {chosen.name} is fragile {chosen.direction} its threshold, "
            f"not {section.get('direction')}"
        )
    return Flag(chosen, float(threshold))


__all__ = ["BY_NAME", "SIGNALS", "Flag", "Signal", "flag_from_card", "signal", "threshold_between"]
