"""The manager's Prometheus metrics (``/metrics`` with ``--metrics-port``), named after kubelet's
where one exists, with a ``hoist_`` prefix.

- ``hoist_session_start_total_duration_seconds``: enqueue to RUNNING, image pulls included
  (kubelet's ``pod_start_total_duration_seconds``); ``hoist_session_start_sli_duration_seconds``
  the same without the time its kernels spent pulling (``pod_start_sli_duration_seconds``: the
  SLO excludes pulls).  Observed once per session, on the event that made its last kernel run.
- ``hoist_scheduler_pass_duration_seconds``: each scheduling pass (Stats' timer feeds it).
- ``hoist_sessions{status}``: sessions by status, counted at scrape time from the fleet.
- ``hoist_event_append_conflicts_total``: session saves refused by the store's optimistic
  concurrency (someone else wrote the session first).
- ``hoist_projection_lag_events``: how many events of the log the read models have yet to fold.
- ``hoist_quarantined_events_total``: distinct records this process's readers skipped
  (eventstore.quarantine).

Nothing here runs per event but the session-start check on KernelCreated (a dict lookup and a
walk over that session's kernels); the gauges are read when scraped.  No label holds an id.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from prometheus_client import CollectorRegistry, Histogram

from domain import events as ev
from domain.session import Session
from domain.status import KernelStatus
from eventstore import quarantine
from services.manager.fleet import Fleet
from transport.metrics import DURATION_BUCKETS, PREFIX, Gauges

S = KernelStatus
PASS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class ManagerMetrics:
    def __init__(self, fleet: Fleet, read_seq: Callable[[], int | None]) -> None:
        """``read_seq``: the sequence the read models reflect (None before they run)."""
        self.fleet = fleet
        self.read_seq = read_seq
        self.registry = registry = CollectorRegistry()
        self.start_total = Histogram(
            f"{PREFIX}session_start_total_duration_seconds",
            "Session enqueued to all kernels RUNNING, image pulls included",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.start_sli = Histogram(
            f"{PREFIX}session_start_sli_duration_seconds",
            "Session enqueued to all kernels RUNNING, without the time its kernels spent pulling",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.scheduler_pass = Histogram(
            f"{PREFIX}scheduler_pass_duration_seconds",
            "One scheduling pass over the pending sessions",
            buckets=PASS_BUCKETS,
            registry=registry,
        )
        registry.register(
            Gauges(
                [
                    (
                        f"{PREFIX}event_append_conflicts",
                        "Session saves refused: someone else wrote the session first",
                        "counter",
                        lambda: fleet.conflicts,
                    ),
                    (
                        f"{PREFIX}projection_lag_events",
                        "Events of the log the read models have not folded yet",
                        "gauge",
                        self._lag,
                    ),
                    (
                        f"{PREFIX}quarantined_events",
                        "Distinct event records this process's readers skipped as inadmissible",
                        "counter",
                        quarantine.total,
                    ),
                ]
            )
        )
        registry.register(
            Gauges(
                [(f"{PREFIX}sessions", "Sessions by status", "gauge", self._by_status)],
                label="status",
            )
        )

    def _lag(self) -> int:
        seq = self.read_seq()
        return 0 if seq is None else max(0, self.fleet.last_seq - seq)

    def _by_status(self) -> dict[str, int]:
        counts = dict.fromkeys((s.value for s in S), 0)
        for session in self.fleet.sessions.values():
            counts[session.status.value] += 1
        return counts

    def kernel_created(self, event: ev.KernelCreated) -> None:
        """A bus handler: the session's start durations, when this kernel was its last to run."""
        session = self.fleet.sessions.get(event.originator_id)
        if session is None or session.status is not S.RUNNING:
            return
        durations = start_durations(session, event.kernel_id)
        if durations is not None:
            total, without_pulls = durations
            self.start_total.observe(total)
            self.start_sli.observe(without_pulls)


def start_durations(session: Session, kernel_id: str) -> tuple[float, float] | None:
    """(enqueue to RUNNING, the same without pulling) when ``kernel_id`` was the session's last
    kernel to start (ties broken by id, so exactly one kernel counts); else None.  The pull time
    is from the first kernel's PULLING to the last one's leaving it, as kubelet takes it."""
    running: list[tuple[datetime, str]] = []
    enqueued: datetime | None = None
    pull_start: datetime | None = None
    pull_end: datetime | None = None
    for kernel in session.kernels.values():
        history = kernel.status_history
        if not history:
            return None
        first = history[0].at
        enqueued = first if enqueued is None else min(enqueued, first)
        ran = None
        for i, change in enumerate(history):
            if change.status is S.RUNNING:
                ran = change.at
            elif change.status is S.PULLING:
                pull_start = change.at if pull_start is None else min(pull_start, change.at)
                if i + 1 < len(history):
                    left = history[i + 1].at
                    pull_end = left if pull_end is None else max(pull_end, left)
        if ran is None:
            return None
        running.append((ran, kernel.kernel_id))
    if not running or max(running)[1] != kernel_id or enqueued is None:
        return None
    total = (max(running)[0] - enqueued).total_seconds()
    pulling = (pull_end - pull_start).total_seconds() if pull_start and pull_end else 0.0
    return max(0.0, total), max(0.0, total - pulling)
