"""The chaos tests' judge: fold every agent's reservations from the log, event by event, and
say where an agent was ever booked over its capacity, and which kernel got two containers."""

from __future__ import annotations

from typing import Any

from domain import events as ev
from domain.admission import Inadmissible, admit, binding, fold
from domain.reservation import AgentReservations, over_capacity
from domain.subjects import RESERVATION
from services.eventstore.store import EventStore


async def overbooked(store: EventStore) -> tuple[list[str], dict[str, int]]:
    """(every moment an agent's reservations exceeded its capacity, reservations per kind)."""
    capacity: dict[str, ev.Capacity] = {}
    held: dict[str, Any] = {}
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
        if kind != RESERVATION:
            continue
        held[agent_id] = fold(held.get(agent_id), event, rec.subject)
        assert isinstance(held[agent_id], AgentReservations)
        counts["reserved" if isinstance(event, ev.CapacityReserved) else "released"] += 1
        over = over_capacity(capacity[agent_id], held[agent_id].held)
        if over:
            problems.append(f"{agent_id} at seq {rec.seq}: {over}")
    return problems, counts
