"""What the managers reserved on one agent: the AgentReservations aggregate on
``hoist.events.reservation.<agent id>``, a subject only managers write (domain.subjects).

Its fold is the agent's occupancy: each kernel placed there is held from the batch that
scheduled it (CapacityReserved, with the session's SessionScheduled, each expecting its
subject's last sequence) until its release (CapacityReleased, once the kernel ended).  Two
managers that decide on the same room both expect the subject where they read it: one batch
is stored, the other refused whole, so the room is never booked twice whatever their timing.
``reserve`` also refuses, before recording anything, room the agent does not have.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventsourcing.domain import BaseAggregate

from domain import events as ev
from domain.errors import NotNow, require_text
from domain.events import Capacity, Resources
from domain.limits import MAX_REASON, clip
from domain.subjects import RESERVATION, check_token


@dataclass(frozen=True, slots=True)
class Held:
    """One kernel's room on the agent."""

    session_id: str
    resources: Resources


@ev.started_by(ev.CapacityReserved)  # the first reservation creates it (no topic field)
class AgentReservations(BaseAggregate[str]):
    KIND = RESERVATION

    if TYPE_CHECKING:  # set by the events
        held: dict[str, Held]  # kernel id -> its room
        by_session: dict[str, set[str]]  # session id -> its kernels held here

    @staticmethod
    def reserve(
        existing: AgentReservations | None,
        agent_id: str,
        capacity: Capacity,
        session_id: str,
        kernel_ids: Collection[str],
        resources: Resources,
    ) -> AgentReservations:
        """Hold ``resources`` for each of ``kernel_ids`` (``existing``: the agent's reservations
        so far, if any); NotNow, recording nothing, if the agent lacks the room."""
        kernels = sorted(kernel_ids)
        held = {} if existing is None else existing.held
        again = [k for k in kernels if k in held]
        if again:
            raise NotNow(f"kernels {again} already hold room on agent {agent_id!r}")
        short = lacks(capacity, held.values(), resources, len(kernels))
        if short:
            raise NotNow(f"agent {agent_id!r} has no room: {short}")
        fields = {"session_id": session_id, "kernel_ids": kernels, "resources": resources}
        if existing is not None:
            existing.trigger_event(ev.CapacityReserved, **fields)
            return existing
        event = ev.CapacityReserved(
            originator_id=check_token(agent_id, "agent_id"),
            originator_version=1,
            timestamp=ev.CapacityReserved.create_timestamp(),
            **fields,  # type: ignore[arg-type]
        )
        reservations: AgentReservations = event.mutate(None)
        reservations.pending_events.append(event)
        return reservations

    def release(self, session_id: str, kernel_ids: Collection[str], status_info: str) -> None:
        """Free the room of those of ``kernel_ids`` this agent holds for ``session_id``."""
        kernels = sorted(k for k in kernel_ids if self._holds(k, session_id))
        if kernels:
            self.trigger_event(
                ev.CapacityReleased,
                session_id=session_id,
                kernel_ids=kernels,
                status_info=clip(require_text(status_info, "status_info"), MAX_REASON),
            )

    def _holds(self, kernel_id: str, session_id: str) -> bool:
        held = self.held.get(kernel_id)
        return held is not None and held.session_id == session_id

    # --- state changes (Event.apply calls WHEN) ----------------------------------------------

    def _on_reserved(self, e: ev.CapacityReserved) -> None:
        if not hasattr(self, "held"):
            self.held, self.by_session = {}, {}
        for kernel_id in e.kernel_ids:
            self.held[kernel_id] = Held(e.session_id, e.resources)
        self.by_session.setdefault(e.session_id, set()).update(e.kernel_ids)

    def _on_released(self, e: ev.CapacityReleased) -> None:
        for kernel_id in e.kernel_ids:
            if self._holds(kernel_id, e.session_id):
                del self.held[kernel_id]
                kernels = self.by_session[e.session_id]
                kernels.discard(kernel_id)
                if not kernels:
                    del self.by_session[e.session_id]

    WHEN = {ev.CapacityReserved: _on_reserved, ev.CapacityReleased: _on_released}


def lacks(
    capacity: Capacity, held: Collection[Held], resources: Resources, kernels: int
) -> str | None:
    """What ``kernels`` more kernels of ``resources`` would exceed on an agent of ``capacity``
    already holding ``held`` (e.g. ``cpu 7.5 + 1.0 > 8.0``), None if they fit."""
    cpu = sum(h.resources.cpu for h in held) + resources.cpu * kernels
    if round(cpu, 9) > capacity.cpu:
        return f"cpu {round(cpu, 9)} > {capacity.cpu}"
    mem = sum(h.resources.mem for h in held) + resources.mem * kernels
    if mem > capacity.mem:
        return f"mem {mem} > {capacity.mem}"
    for name, amount in resources.slots.items():
        want = sum(h.resources.slots.get(name, 0.0) for h in held) + amount * kernels
        if round(want, 9) > capacity.slots.get(name, 0.0):
            return f"{name} {round(want, 9)} > {capacity.slots.get(name, 0.0)}"
    return None


def over_capacity(capacity: Capacity, held: Mapping[str, Held]) -> str | None:
    """What an agent's held room exceeds of its ``capacity`` (a checker's question)."""
    slots = {n for h in held.values() for n in h.resources.slots}
    zero = Resources(cpu=0.0, mem=0, slots=dict.fromkeys(slots, 0.0))
    return lacks(capacity, held.values(), zero, 0)
