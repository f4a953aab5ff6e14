"""Keep the cyclic garbage collector's pauses from growing with what a process holds.

For the manager (every session it folded), its read models' child (what the runner keeps of
every session) and a process of many simulated agents (what hundreds of hosts would hold,
bench/lifecycle.py's dummy fleet).  A full collection visits all
of it: in the manager, with 10,000 live sessions one pause took 0.4-1.9 s (gc.callbacks under
bench/lifecycle.py), which is a create's p99.  After each full collection, what survived it is
frozen (``gc.freeze``): later collections visit only what is newer, so a pause grows with what
changed since the last one, not with the fleet.  Frozen objects are still freed by reference
counting; only cyclic garbage among them waits, until as much again has been frozen since it
was last thawed: then it is thawed and collected once (one long pause per doubling, amortized
like a list's growth; rarer still while thaws find next to nothing).

What was frozen is counted here, as it is frozen (the survivors of each full collection, which
that collection just visited), never with ``gc.get_freeze_count``: that walks the whole frozen
set, 40 ms at 20,000 live sessions, after every full collection (one every few seconds).
"""

from __future__ import annotations

import gc
from typing import Any

_MIN_THAW = 100_000  # frozen objects below which a thaw is not worth its pause
# A thaw's full collection visits the whole heap (0.4-0.6 s at 20,000 live sessions) and in the
# manager found 0-9 objects of cyclic garbage: one that finds less than _WORTH of what it
# visited makes the next thaw wait for twice as much (up to _MAX_WAIT times the heap), one that
# finds more brings the wait back to once the heap.
_WORTH = 0.01
_MAX_WAIT = 64
_state = {"thawed_at": 0, "since": 0, "installed": False, "wait": 1}


def _freeze() -> int:
    """Freeze the survivors of the full collection that just ended, count them, return them."""
    survivors = len(gc.get_objects(generation=2))  # what that collection visited: not more
    gc.freeze()
    if not _state["thawed_at"]:
        _state["thawed_at"] = survivors  # everything: the heap was thawed
    else:
        _state["since"] += survivors
    return survivors


def _after_collection(phase: str, info: dict[str, Any]) -> None:
    if phase != "stop" or info.get("generation") != 2:
        return
    if not _state["thawed_at"]:  # this collection ran on the thawed heap
        survivors = _freeze()
        found = int(info.get("collected", 0))
        worth = found >= _WORTH * (survivors + found)
        _state["wait"] = 1 if worth else min(2 * _state["wait"], _MAX_WAIT)
        return
    if _state["since"] > max(_state["thawed_at"], _MIN_THAW) * _state["wait"]:
        # Cyclic garbage among frozen objects is collected now and then (the next full
        # collection runs on the thawed heap, and freezes what survives it).
        gc.unfreeze()
        _state["thawed_at"] = _state["since"] = 0
        return
    _freeze()


def keep_pauses_short() -> None:
    """Freeze what the start-up fold built, and what survives each full collection from now on
    (idempotent: installed once per process)."""
    if _state["installed"]:
        return
    _state["installed"] = True
    gc.collect()
    _freeze()
    gc.callbacks.append(_after_collection)
