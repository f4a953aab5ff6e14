"""The kernel status machine: statuses, the allowed transitions, and the kernel record.

Only the transitions in ``TRANSITIONS`` exist; commands call ``check_transition`` before
recording an event, so an illegal move is refused and never applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum

import msgspec

from domain.errors import IllegalTransition


class KernelStatus(StrEnum):
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    PREPARING = "PREPARING"
    PULLING = "PULLING"
    PREPARED = "PREPARED"
    CREATING = "CREATING"
    RUNNING = "RUNNING"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"
    CANCELLED = "CANCELLED"


S = KernelStatus

TRANSITIONS: Mapping[KernelStatus, frozenset[KernelStatus]] = {
    # Waiting for the scheduler: placed on an agent, or cancelled (user, bad request).
    S.PENDING: frozenset({S.SCHEDULED, S.CANCELLED}),
    # Placed: the manager starts check-and-pull (PREPARING), or the agent's answer is already
    # in (PULLING: a background pull started; PREPARED: the image is there).
    S.SCHEDULED: frozenset({S.PREPARING, S.PULLING, S.PREPARED, S.CANCELLED}),
    # Check-and-pull in progress: its answer decides between pulling and ready.
    S.PREPARING: frozenset({S.PULLING, S.PREPARED, S.CANCELLED}),
    # Background pull: done -> PREPARED; pull failed or superadmin force-cancel -> CANCELLED,
    # which frees the agent's reserved resources; PULLING again: the pull asked again as a new
    # task (its agent restarted and forgot the first), so every reader follows the new one.
    S.PULLING: frozenset({S.PULLING, S.PREPARED, S.CANCELLED}),
    # Image on the agent: the manager asks for the container, or it is cancelled first.
    S.PREPARED: frozenset({S.CREATING, S.CANCELLED}),
    # The agent creates the container: it runs, fails to start (ERROR), or is cancelled
    # (a stray container is removed by the agent's reconciliation); the agent no longer holds
    # the image (PREPARING: a kernel placed where the log showed it goes to check-and-pull).
    S.CREATING: frozenset({S.RUNNING, S.ERROR, S.CANCELLED, S.PREPARING}),
    # Running: asked to stop (TERMINATING), or the agent reports it gone (exited, agent lost).
    S.RUNNING: frozenset({S.TERMINATING, S.TERMINATED}),
    # Stopping: the agent confirms the container is gone.
    S.TERMINATING: frozenset({S.TERMINATED}),
    # Final statuses: nothing follows.
    S.TERMINATED: frozenset(),
    S.ERROR: frozenset(),
    S.CANCELLED: frozenset(),
}

TERMINAL: frozenset[KernelStatus] = frozenset({S.TERMINATED, S.ERROR, S.CANCELLED})
# Did not make it: a session with such a kernel winds down (domain.session.Session.wind_down).
FAILED: frozenset[KernelStatus] = frozenset({S.ERROR, S.CANCELLED})

# The agent's capacity is reserved from scheduling until the container is gone: a kernel
# waiting for its image still holds its slot on that agent.
AGENT_RESOURCE_OCCUPYING: frozenset[KernelStatus] = frozenset(
    {S.SCHEDULED, S.PREPARING, S.PULLING, S.PREPARED, S.CREATING, S.RUNNING, S.TERMINATING}
)
# A user's quota is not charged while the image is pulling (a download is not use of the
# agent's cpu or memory); PENDING never occupies anything.
USER_RESOURCE_OCCUPYING: frozenset[KernelStatus] = AGENT_RESOURCE_OCCUPYING - {S.PULLING}
# Not running yet: a destroy cancels these, and a superadmin may force-cancel them.
PRE_RUNNING: frozenset[KernelStatus] = frozenset(
    {S.PENDING, S.SCHEDULED, S.PREPARING, S.PULLING, S.PREPARED, S.CREATING}
)
# Placed on an agent whose image the agent is about to need (image GC must keep it, unload
# refuses it); IN_USE: its container uses the image now.
ABOUT_TO_USE: frozenset[KernelStatus] = frozenset(
    {S.SCHEDULED, S.PREPARING, S.PULLING, S.PREPARED, S.CREATING}
)
IN_USE: frozenset[KernelStatus] = frozenset({S.RUNNING, S.TERMINATING})


def check_transition(old: KernelStatus, new: KernelStatus, kernel_id: str = "") -> None:
    """Raise IllegalTransition unless the table allows ``old -> new``."""
    allowed = TRANSITIONS[old]
    if new not in allowed:
        raise IllegalTransition(old, new, frozenset(allowed), kernel_id)


class StatusChange(msgspec.Struct, frozen=True, kw_only=True):
    status: KernelStatus
    status_info: str
    at: datetime


class Kernel(msgspec.Struct, kw_only=True):
    """One container of a session as its events describe it (state, not an event)."""

    kernel_id: str
    status: KernelStatus = S.PENDING
    status_info: str = ""
    status_history: list[StatusChange] = []
    agent_id: str | None = None  # set when scheduled
    pull_task_id: str | None = None  # the agent's pull this kernel waits for
    container_id: str | None = None  # set when created
    # Where its exposed ports are reachable (domain.events.PublishedPort; that module imports
    # this one).
    ports: tuple[object, ...] = ()
    exit_code: int | None = None  # set when its process ended on its own
    ran_s: float | None = None  # how long its command ran

    def move_to(self, status: KernelStatus, status_info: str, at: datetime) -> None:
        """Record a change its event decided (kernel events check it first: a stored one may
        be a forgery, domain.admission)."""
        self.status = status
        self.status_info = status_info
        self.status_history.append(StatusChange(status=status, status_info=status_info, at=at))
