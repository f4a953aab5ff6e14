"""The chaos tests' judge: fold every agent's reservations from the log, event by event, and
say where an agent was ever booked over its capacity; and, apart from the reservations (so a
wrong ``reserve`` cannot hide itself), fold the sessions: every kernel placed on an agent counts
there from its SessionScheduled until it ends, and no agent may ever hold more than it has."""

from __future__ import annotations

from typing import Any

from domain import events as ev
from domain.admission import Inadmissible, admit, binding, fold
from domain.reservation import AgentReservations, Held, over_capacity
from domain.session import Session
from domain.status import TERMINAL
from domain.subjects import RESERVATION
from eventstore.store import EventStore


async def overbooked(store: EventStore) -> tuple[list[str], dict[str, int]]:
    """(every moment an agent's reservations exceeded its capacity, reservations per kind)."""
    capacity: dict[str, ev.Capacity] = {}
    held: dict[str, Any] = {}
    sessions: dict[str, Session] = {}
    placed: dict[str, dict[str, Held]] = {}  # agent id -> kernel id -> its room, by the sessions
    counts = {"reserved": 0, "released": 0}
    problems: list[str] = []
    async for rec in store.replay():
        try:
            kind, agent_id = binding(rec.subject)
            event = admit(rec.subject, rec.headers, rec.data)
        except Inadmissible:
            continue
        if isinstance(event, ev.AgentRegistered | ev.AgentReregistered):
            capacity[agent_id] = event.capacity
        if kind == "session":
            session = sessions[agent_id] = fold(sessions.get(agent_id), event, rec.subject)
            for problem in _placed(session, placed, capacity):
                problems.append(f"{problem} at seq {rec.seq} (by the sessions)")
            continue
        if kind != RESERVATION:
            continue
        held[agent_id] = fold(held.get(agent_id), event, rec.subject)
        assert isinstance(held[agent_id], AgentReservations)
        counts["reserved" if isinstance(event, ev.CapacityReserved) else "released"] += 1
        over = over_capacity(capacity[agent_id], held[agent_id].held)
        if over:
            problems.append(f"{agent_id} at seq {rec.seq}: {over}")
    return problems, counts


def _placed(
    session: Session, placed: dict[str, dict[str, Held]], capacity: dict[str, ev.Capacity]
) -> list[str]:
    """Bring ``placed`` in line with ``session``'s kernels; the agents now over capacity."""
    touched = set()
    for kernel in session.kernels.values():
        if kernel.agent_id is None:
            continue
        on_agent = placed.setdefault(kernel.agent_id, {})
        if kernel.status in TERMINAL:
            on_agent.pop(kernel.kernel_id, None)
        elif kernel.kernel_id not in on_agent:
            on_agent[kernel.kernel_id] = Held(session.id, session.resources)
            touched.add(kernel.agent_id)
    out = []
    for agent_id in touched:
        over = over_capacity(capacity[agent_id], placed[agent_id])
        if over:
            out.append(f"{agent_id}: {over}")
    return out
