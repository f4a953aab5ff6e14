"""The fleet's view of every agent's reservations (domain.reservation), folded from the log.

An agent's occupancy for the scheduler is the union of two accounts of its kernels: those the
sessions say occupy it (the fleet's footprints, as before reservations existed, so a log
written before them folds as it did) and those its reservation subject holds.  This view keeps
the second account's surplus: held kernels the sessions do not (or no longer) show on the
agent, per agent and session (``extra``).  Those whose kernel has ended are due for release
(``due``); the scheduler releases them in its next batch.  Held kernels whose session the view
has not caught up with yet count too: the union never shows room that a reservation holds.

Own writes: the scheduler applies its reservations and releases to the cached aggregates before
it appends them (``begin``), and until the append is answered (``end``) the fold only notes what
it saw on those subjects; afterwards a subject that moved beyond what we saved is reloaded.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable

from domain import events as ev
from domain.events import Resources
from domain.reservation import AgentReservations
from domain.session import Session
from domain.status import AGENT_RESOURCE_OCCUPYING, TERMINAL
from eventstore.repository import NotFound, Repository, loaded_seq, passed
from eventstore.store import Recorded

log = logging.getLogger(__name__)

# (cpu, mem, slots) held beyond what the sessions show, and which of those kernels ended
_Part = tuple[float, int, dict[str, float], list[str]]


class Reservations:
    def __init__(
        self,
        repository: Repository,
        session_of: Callable[[str], Session | None],
        changed: Callable[[str, bool], None],
    ) -> None:
        self.repository = repository
        self.session_of = session_of
        self.changed = changed  # (agent id, room freed): its scheduler view is stale
        self.by_agent: dict[str, AgentReservations] = {}
        # agent id -> session id -> its part of the agent's surplus
        self._parts: defaultdict[str, dict[str, _Part]] = defaultdict(dict)
        self._in_flight: set[str] = set()  # agents whose subject we are appending to
        self._seen: dict[str, int] = {}  # highest seq folded meanwhile, per such agent
        self._stale: set[str] = set()  # refused appends whose reload failed: reload first
        # While the start-up fold runs (defer() .. flush()): agents whose surplus is counted
        # once at its end, not at each of their records (a count visits the agent's sessions).
        self._deferred: set[str] | None = None

    # -- folding -------------------------------------------------------------------------

    def fold(self, agent_id: str, rec: Recorded, event: ev.Event, apply: Callable) -> None:
        """One record of ``hoist.events.reservation.<agent_id>`` (``apply``: the fleet's
        admitted fold of one event into an aggregate)."""
        if agent_id in self._in_flight or agent_id in self._stale:
            self._seen[agent_id] = max(rec.seq, self._seen.get(agent_id, 0))
            return
        current = self.by_agent.get(agent_id)
        if current is not None and rec.seq <= loaded_seq(current):
            return  # our own write, applied when we made it
        try:
            self.by_agent[agent_id] = apply(current, event, rec)
        except Exception:
            if current is not None:
                passed(current, rec.seq)
            raise
        self.recount(agent_id)

    async def reload(self, agent_id: str) -> None:
        """The agent's reservations as the log has them."""
        try:
            self.by_agent[agent_id] = await self.repository.get(AgentReservations, agent_id)
        except NotFound:
            self.by_agent.pop(agent_id, None)
        self.recount(agent_id)

    # -- the surplus ---------------------------------------------------------------------

    def defer(self) -> None:
        """Count surpluses only at flush(): nothing reads them before the fold ends."""
        self._deferred = set()

    def flush(self) -> None:
        """Count every surplus deferred since defer(), each agent once; count at once again."""
        deferred, self._deferred = self._deferred or set(), None
        for agent_id in deferred:
            self.recount(agent_id)

    def recount(self, agent_id: str, session_ids: Iterable[str] | None = None) -> None:
        """Bring the agent's surplus in line (only these sessions' parts, if given)."""
        if self._deferred is not None:
            self._deferred.add(agent_id)  # all its sessions' parts, at flush()
            return
        reservations = self.by_agent.get(agent_id)
        held = {} if reservations is None else reservations.held
        by_session = {} if reservations is None else reservations.by_session
        parts = self._parts[agent_id]
        if session_ids is None:
            session_ids = set(parts) | set(by_session)
        before = sum(p[0] for p in parts.values()), sum(p[1] for p in parts.values())
        touched = False
        for sid in session_ids:
            kernels = sorted(by_session.get(sid, ()))
            resources = held[kernels[0]].resources if kernels else None
            part = self._part(agent_id, sid, kernels, resources)
            if part is None:
                touched = parts.pop(sid, None) is not None or touched
            elif parts.get(sid) != part:
                parts[sid] = part
                touched = True
        if not parts:
            self._parts.pop(agent_id, None)
        if touched:
            after = sum(p[0] for p in parts.values()), sum(p[1] for p in parts.values())
            self.changed(agent_id, after[0] < before[0] or after[1] < before[1])

    def _part(
        self, agent_id: str, sid: str, kernels: list[str], resources: Resources | None
    ) -> _Part | None:
        if not kernels or resources is None:
            return None
        session = self.session_of(sid)
        extra: list[str] = []
        ended: list[str] = []
        for kernel_id in kernels:
            kernel = None if session is None else session.kernels.get(kernel_id)
            if kernel is not None and kernel.status in TERMINAL:
                ended.append(kernel_id)
                extra.append(kernel_id)
            elif (
                kernel is None
                or kernel.agent_id != agent_id
                or kernel.status not in AGENT_RESOURCE_OCCUPYING
            ):
                extra.append(kernel_id)
        if not extra:
            return None
        n = len(extra)
        slots = {name: round(v * n, 9) for name, v in resources.slots.items()}
        return (round(resources.cpu * n, 9), resources.mem * n, slots, ended)

    def extra(self, agent_id: str) -> tuple[float, int, dict[str, float]]:
        """What the agent's reservations hold beyond what its sessions show."""
        parts = self._parts.get(agent_id)
        if not parts:
            return 0.0, 0, {}
        slots: dict[str, float] = {}
        for _, _, part_slots, _ in parts.values():
            for name, v in part_slots.items():
                slots[name] = round(slots.get(name, 0.0) + v, 9)
        cpu = round(sum(p[0] for p in parts.values()), 9)
        return cpu, sum(p[1] for p in parts.values()), slots

    def due(self) -> dict[str, dict[str, list[str]]]:
        """agent id -> session id -> its ended kernels the agent still holds room for."""
        out: dict[str, dict[str, list[str]]] = {}
        for agent_id, parts in self._parts.items():
            for sid, (_, _, _, ended) in parts.items():
                if ended:
                    out.setdefault(agent_id, {})[sid] = list(ended)
        return out

    # -- own appends ---------------------------------------------------------------------

    def begin(self, agent_ids: Iterable[str]) -> None:
        """We are appending to these agents' subjects (until ``end``)."""
        self._in_flight.update(agent_ids)

    def busy(self, agent_id: str) -> bool:
        """Whether an append of ours to the agent's subject is unanswered (or was refused and
        not reloaded yet): its next expected sequence is not known."""
        return agent_id in self._in_flight or agent_id in self._stale

    async def end(self, agent_ids: Iterable[str], stored: bool) -> None:
        """The append to these agents' subjects was answered (``stored`` or not): reload
        those that moved meanwhile, or all of them when it was refused."""
        for agent_id in list(agent_ids):
            self._in_flight.discard(agent_id)
            seen = self._seen.pop(agent_id, 0)
            current = self.by_agent.get(agent_id)
            if not stored or (seen and (current is None or seen > loaded_seq(current))):
                self._stale.add(agent_id)
        await self.refresh()

    async def refresh(self) -> None:
        """Reload every agent whose cached reservations may hold what the log has not (a
        StoreError if the store does not answer: the next pass tries again first)."""
        for agent_id in sorted(self._stale):
            await self.reload(agent_id)
            self._stale.discard(agent_id)
