"""Integer milli-units for cpu and slots inside a plan, so sums of reservations are exact."""

from __future__ import annotations

import math

from domain.events import Resources

SlotAsk = tuple[tuple[str, int], ...]  # (slot, milli-units) asked, amount > 0, sorted by slot


# Requests and reservations round up, capacity rounds down: a rounding error never
# over-commits an agent.
def mc_up(cores: float) -> int:
    return max(0, math.ceil(round(cores * 1000, 6)))


def mc_down(cores: float) -> int:
    return max(0, math.floor(round(cores * 1000, 6)))


def slot_ask(resources: Resources) -> SlotAsk:
    """The slots one kernel asks for, in milli-units (those asked 0 left out)."""
    if not resources.slots:
        return ()
    return tuple(sorted((k, mc_up(v)) for k, v in resources.slots.items() if v > 0))


def times(ask: SlotAsk, n: int) -> SlotAsk:
    return tuple((k, a * n) for k, a in ask)
