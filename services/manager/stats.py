"""The manager's counters and timers, served on ``hoist.admin.manager.stats`` (admin role).

What grows with the fleet shows here first: how long a scheduling pass, a heartbeat and an
agent reconciliation pass take, how long the start-up fold of the whole log took, and how many
sessions are live.  Kept in memory since the manager started (a restart starts them again);
nothing here is stored or decides anything.

The parts time their own work and tell it to a hook given at construction (``on_pass``,
``on_heartbeat``, ``on_round``); the manager's bootstrap passes these timers' ``add``.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from domain.contracts.commands import ShowStats
from domain.status import TERMINAL
from services.manager.fleet import Fleet


@dataclass
class Timer:
    """How many times something ran, for how long in all, and its longest run."""

    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    observe: Callable[[float], None] | None = None  # also fed to this (a Prometheus histogram)

    def add(self, seconds: float) -> None:
        if self.observe is not None:
            self.observe(seconds)
        self.count += 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (sync or async), each call timed into this timer."""
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    self.add(time.perf_counter() - start)

            return timed_async

        @functools.wraps(fn)
        def timed_sync(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(time.perf_counter() - start)

        return timed_sync

    def view(self) -> dict[str, Any]:
        mean = self.total_s / self.count if self.count else 0.0
        return {
            "count": self.count,
            "total_s": round(self.total_s, 6),
            "mean_ms": round(mean * 1000, 4),
            "max_ms": round(self.max_s * 1000, 4),
        }


class Stats:
    def __init__(
        self,
        fleet: Fleet,
        clock: Callable[[], float] = time.monotonic,
        observe_pass: Callable[[float], None] | None = None,
    ) -> None:
        self.fleet = fleet
        self.clock = clock
        self.started = clock()
        # observe_pass: each pass also fed to the Prometheus histogram
        self.scheduling_passes = Timer(observe=observe_pass)
        self.heartbeats = Timer()  # one received heartbeat each
        self.reconciliation_passes = Timer()  # every live agent's last heartbeat against its state
        self.startup_fold = Timer()  # once: the whole log folded before the manager serves
        self.folded_events = 0  # the log's last sequence that fold reached

    def live_sessions(self) -> int:
        return sum(1 for s in self.fleet.sessions.values() if s.status not in TERMINAL)

    async def show(self, _request: ShowStats) -> dict[str, Any]:
        return {
            "live_sessions": self.live_sessions(),
            "sessions": len(self.fleet.sessions),
            "agents": len(self.fleet.agents),
            "live_agents": sum(1 for a in self.fleet.agents.values() if a.live),
            "log_seq": self.fleet.last_seq,
            "uptime_s": round(self.clock() - self.started, 3),
            "startup_fold": {
                "seconds": round(self.startup_fold.total_s, 6),
                "events": self.folded_events,
            },
            "scheduling_passes": self.scheduling_passes.view(),
            "heartbeats": self.heartbeats.view(),
            "reconciliation_passes": self.reconciliation_passes.view(),
        }
