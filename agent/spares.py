"""Which containers a manager's view does not know yet: the creates it has not folded.

A sync-kernels from a view behind a kernel's create-kernel (``CreateKernel.seq``) must not
destroy its container: another manager asked for it, or a new leader's predecessor did.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from agent.runtime.base import KernelContainer

# How long after its create-kernel a container a lagging view does not know is spared
# (CreateKernel.seq): another manager's view folds a create within a second, a new leader's its
# predecessor's creates as it takes over.  Bounded, so that a sequence no view reaches (a buggy
# sender, a stream recreated with lower sequences) cannot keep an orphan alive.
SPARE_S = 60.0


class Spares:
    def __init__(self) -> None:
        # kernel id -> the log sequence its create-kernel came from, and when (monotonic).  The
        # first create's sequence and time are also its container's labels, which a restarted
        # agent reads back (recall_from_labels).
        self.asked_at: dict[str, tuple[int, float]] = {}
        # Containers made or read back by this process: their labels are never read again,
        # so a pruned entry is not seeded anew (each is spared SPARE_S at most, once).
        self.recalled: set[str] = set()

    def asked(self, kernel_id: str, seq: int) -> None:
        """A create-kernel from the log record ``seq`` came now."""
        self.asked_at[kernel_id] = (seq, time.monotonic())

    def forget(self, kernel_id: str) -> None:
        self.asked_at.pop(kernel_id, None)

    def prune(self) -> None:
        now = time.monotonic()
        self.asked_at = {k: a for k, a in self.asked_at.items() if now - a[1] < SPARE_S}

    def recall_from_labels(self, kernels: Sequence[KernelContainer]) -> None:
        """The sequences of creates this process did not hear (it restarted since), from the
        containers' labels, once per container: a restarted agent spares what it spared
        before, for what is left of SPARE_S since the create by the wall clock (which a
        restart does not reset); a create dated ahead of the clock (set back since) counts
        from now, more than SPARE_S ahead not at all."""
        now_wall, now = time.time(), time.monotonic()
        listed = {k.container_id for k in kernels}
        for k in kernels:
            if k.container_id in self.recalled:
                continue
            self.recalled.add(k.container_id)
            if k.asked_seq and k.kernel_id not in self.asked_at:
                age = now_wall - k.asked_at
                if -SPARE_S < age < SPARE_S:
                    self.asked_at[k.kernel_id] = (k.asked_seq, now - max(0.0, age))
        self.recalled &= listed  # what is gone is not listed again

    def created_past_view(self, kernel_id: str, view_seq: int | None) -> bool:
        """Whether the kernel's create came from a record past ``view_seq`` (a view that has
        not folded it yet: another manager's create, seen by a lagging or paused one) less than
        SPARE_S ago; never without one (an older manager)."""
        seq, at = self.asked_at.get(kernel_id, (0, 0.0))
        return view_seq is not None and seq > view_seq and time.monotonic() - at < SPARE_S
