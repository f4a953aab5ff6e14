"""Kernels that ended on this agent: their KernelExited recorded once per container, and
their containers removed once kept long enough (``keep_exited_s``) for their logs."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from agent.facts import AgentFacts
from agent.kernels import Kernels
from agent.runtime.base import KernelContainer
from transport.tasks import Tasks

log = logging.getLogger(__name__)


class Exits:
    def __init__(
        self, agent_id: str, facts: AgentFacts, kernels: Kernels, tasks: Tasks, keep_s: float
    ) -> None:
        self.agent_id = agent_id
        self.facts = facts
        self.kernels = kernels
        self.tasks = tasks
        self.keep_s = keep_s
        # Containers whose KernelExited is recorded (or being recorded): once per container.
        # container id -> when it was noted (a count, self.marks): a listing begun after that
        # which lacks the container shows it removed for good, and only then is it forgotten.
        self.noted: dict[str, int] = {}
        self.marks = 0
        self.stopping = False  # exits reported from then on are ignored
        self._expiring: set[str] = set()  # ended kernels whose container is being removed

    def on_exit(self, kernel: KernelContainer) -> None:
        """runtime.watch_exits: a kernel's process ended."""
        self.housekeep([kernel])

    def _mark_recorded(self, container_id: str) -> None:
        self.marks += 1
        self.noted[container_id] = self.marks

    async def skip_recorded(self, kernels: Sequence[KernelContainer]) -> None:
        """After a restart: the kept containers whose exit an earlier agent process recorded
        are noted, so their exits are not recorded again.  A recorded KernelExited names no
        container: one matches an ended container of the same kernel and session with the
        same exit code and run time (to the microsecond, from the engine's timestamps)."""
        ended = [k for k in kernels if k.exit is not None]
        if not ended:
            return
        try:
            recorded = await self.facts.recorded_exits()
        except Exception as e:  # not fatal: the manager ignores a repeated exit
            log.warning("agent %s: exits recorded before could not be read: %s", self.agent_id, e)
            return
        for k in ended:
            assert k.exit is not None
            key = (k.kernel_id, k.session_id, k.exit.exit_code, max(0.0, float(k.exit.ran_s)))
            if key in recorded:
                self._mark_recorded(k.container_id)

    def housekeep(
        self, kernels: Sequence[KernelContainer], listed_after: int | None = None
    ) -> None:
        """Record exits not yet recorded; remove ended containers kept long enough.

        ``listed_after``: ``kernels`` is a full listing begun when ``self.marks`` was that;
        then noted containers it lacks are forgotten (only those noted before it began: one
        that ended and was noted while the listing was under way may be missing from it)."""
        if self.stopping:
            return
        self.kernels.prune_destroyed()
        self.kernels.spares.prune()
        # An exit of a container we destroyed (or are destroying) is our kill, not an end.
        ended = [
            k
            for k in kernels
            if k.exit is not None
            and k.container_id not in self.kernels.destroyed
            and k.kernel_id not in self.kernels.terminating
        ]
        for k in ended:
            if k.container_id in self.noted:
                continue
            self._mark_recorded(k.container_id)
            # Its process is gone: what it was given is free again.
            self.kernels.room.release(k.kernel_id)
            self.tasks.spawn(self._record(k), name=f"exit {k.kernel_id}")
        if listed_after is not None:
            present = {k.container_id for k in kernels}
            self.noted = {c: n for c, n in self.noted.items() if c in present or n > listed_after}
        horizon = time.time() - self.keep_s
        for k in ended:
            assert k.exit is not None
            if k.exit.finished_at <= horizon and k.kernel_id not in self._expiring:
                self._expiring.add(k.kernel_id)
                self.tasks.spawn(self._expire(k.kernel_id), name=f"expire {k.kernel_id}")

    async def _record(self, k: KernelContainer) -> None:
        assert k.exit is not None
        try:
            await self.facts.kernel_exited(
                k.kernel_id, k.session_id, k.exit.exit_code, k.exit.ran_s, k.exit.oom_killed
            )
        except Exception:
            # The next listing tries again (the store may be back by then).
            self.noted.pop(k.container_id, None)
            raise
        log.info(
            "agent %s: kernel %s exited: code %s", self.agent_id, k.kernel_id, k.exit.exit_code
        )

    async def _expire(self, kernel_id: str) -> None:
        try:
            if await self.kernels.destroy(kernel_id):
                log.info(
                    "agent %s: removed the ended kernel %s's container", self.agent_id, kernel_id
                )
        finally:
            self._expiring.discard(kernel_id)
