"""Keep the cyclic garbage collector's pauses from growing with what the manager holds.

The manager holds every session it folded; a full collection visits all of them, so with
10,000 live sessions one pause took 0.4-1.9 s (gc.callbacks under bench/lifecycle.py), which
is a create's p99.  After each full collection, what survived it is frozen (``gc.freeze``):
later collections visit only what is newer, so a pause grows with what changed since the last
one, not with the fleet.  Frozen objects are still freed by reference counting; only cyclic
garbage among them waits, until the frozen set has doubled since it was last thawed: then it is
thawed and collected once (one long pause per doubling, amortized like a list's growth).
"""

from __future__ import annotations

import gc
from typing import Any

_state = {"thawed_at": 0, "installed": False}


def _after_collection(phase: str, info: dict[str, Any]) -> None:
    if phase != "stop" or info.get("generation") != 2:
        return
    frozen = gc.get_freeze_count()
    if frozen > 2 * max(_state["thawed_at"], 100_000):
        # Cyclic garbage among frozen objects is collected now and then (the next full
        # collection runs on the thawed heap, and freezes what survives it).
        gc.unfreeze()
        _state["thawed_at"] = 0
        return
    gc.freeze()
    if not _state["thawed_at"]:
        _state["thawed_at"] = gc.get_freeze_count()


def keep_pauses_short() -> None:
    """Freeze what the start-up fold built, and what survives each full collection from now on
    (idempotent: installed once per process)."""
    if _state["installed"]:
        return
    _state["installed"] = True
    gc.collect()
    gc.freeze()
    _state["thawed_at"] = gc.get_freeze_count()
    gc.callbacks.append(_after_collection)
