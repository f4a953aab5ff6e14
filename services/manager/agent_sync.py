"""Agent resource sync and continuous reconciliation from heartbeats.

The manager's view is the truth: ``sync(agent)`` sends the agent its kernels by status
(``sync-kernels``) and how far the view has folded the log (``view_seq``); the agent destroys
containers of kernels the manager does not know (or that are over), except those whose
create-kernel came from a record past ``view_seq`` (another manager's, or one a lagging view
has not folded yet: spared, a later sync decides), and answers which listed running ones have
no live container, which the manager then records TERMINATED ``container-gone: not found on
agent X`` (``container-exited: ...`` when the heartbeat saw the process end).

When it runs:
- ``hoist.admin.agent.sync`` (domain.contracts.agents says what it takes and answers);
- the configurable triggers ``after-scheduling`` (the placed agents, right after a session is
  scheduled), ``before-kernel-creation`` (the agents of a session's creates, first) and
  ``on-creation-failure`` (the default: every agent that refused a create with
  insufficient-resources, all at once, then those creates are retried once; so a
  multi-kernel session failing on several agents is handled, which the original was not);
- without any trigger, every ``interval_s``: each live agent's last heartbeat is compared with
  the view, and an agent that drifted is synced: a running kernel with no container (killed
  outside Hoist), a running container of a kernel the manager does not know or ended (an
  ended container is no drift: the agent keeps it a while for its logs). A kernel
  CREATING that the agent never got (no container after ``create_grace_s``) gets its
  create-kernel asked again (idempotent). A difference younger than ``grace_s`` (the beat
  may predate the change) is left for the next round. An agent that agreed entirely is
  visited again only once its kernels, registration or liveness change, or its beat lists
  other containers (a round costs what changed, not every live kernel).

The same round tells each agent which images its kernels are about to use (``pin-images``
``expected``), for image GC, and ends RUNNING kernels on agents lost for ``lost_grace_s``
(TERMINATED ``agent-lost: X (heartbeat-timeout: ...)``): after the liveness deadline and this
grace the manager stops counting on them, frees their room, and a returning agent's leftover
containers are destroyed by the next sync (the manager no longer knows them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import msgspec

from domain import events as ev
from domain import rpc
from domain.contracts.agents import DEFAULT_TRIGGERS, SyncAgents, check_triggers
from domain.limits import quote
from domain.rpc import RequestError
from domain.session import Session
from domain.status import ABOUT_TO_USE, KernelStatus
from services.manager.agent_rpc import AgentRefused, AgentRpc, AgentUnreachable
from services.manager.bus import LookAgain
from services.manager.fleet import Fleet
from services.manager.liveness import LivenessWatcher
from services.manager.uow import UnitOfWork
from transport.tasks import Tasks, every

log = logging.getLogger(__name__)

S = KernelStatus
# A reconciliation round pauses _PAUSE_S after the agent that takes its slice past _SLICE_S: a
# round after a burst visits hundreds of agents (100-130 ms of work at 21,000 live), and slices
# that yielded only to what was ready at that moment took half the loop while the round lasted,
# so every create in flight then waited 200-500 ms (bench/lifecycle.py --scale).  About a fifth
# of the loop: a round of 130 ms of work takes about 0.7 s of its 5 s interval.
_SLICE_S = 0.002
_PAUSE_S = 0.008
# The kernels an agent is expected to run or to be about to: what reconciliation compares.
_ON_AGENT = ABOUT_TO_USE | {S.RUNNING, S.TERMINATING}


class AgentSync:
    def __init__(
        self,
        fleet: Fleet,
        uow: UnitOfWork,
        agents: AgentRpc,
        liveness: LivenessWatcher,
        *,
        triggers: Iterable[str] = DEFAULT_TRIGGERS,
        interval_s: float = 5.0,
        grace_s: float = 2.0,
        create_grace_s: float = 30.0,
        lost_grace_s: float = 15.0,
        assured: Callable[[], bool] = lambda: True,
        on_round: Callable[[float], None] | None = None,
    ) -> None:
        self.fleet = fleet
        self.uow = uow
        self.agents = agents
        self.liveness = liveness
        self.triggers = check_triggers(triggers)
        self.interval_s = interval_s
        self.grace = timedelta(seconds=grace_s)
        self.create_grace = timedelta(seconds=create_grace_s)
        self.lost_grace = timedelta(seconds=lost_grace_s)
        # Whether this manager surely still leads (Leadership.assured): a sync from the view
        # of one that was paused past its lease would destroy its successor's kernels.
        self.assured = assured
        self.syncs = 0  # sync-kernels calls made (tests, logs)
        self._expected_sent: dict[str, frozenset[str]] = {}
        # Agents that agreed with their last beat and have not changed since (reconcile)
        self._agreed: set[str] = set()
        self.visited = 0  # agents the last reconciliation round visited (tests, stats)
        # Told the seconds each round worked, its pauses left out (the manager's stats)
        self.on_round = on_round
        self._paused_s = 0.0  # the current round's pauses so far
        self._tasks = Tasks()
        # agent id -> the after-scheduling sync of it in flight, which its creates wait for
        self._after_scheduling: dict[str, asyncio.Task[None]] = {}

    def start(self) -> None:
        self._tasks.spawn(every(self.interval_s, self.reconcile, "agent reconciliation"))

    async def stop(self) -> None:
        await self._tasks.stop()

    def trigger(self, name: str) -> Callable[[set[str]], Awaitable[None]] | None:
        """The sync the reactors call at trigger ``name``, or None when it is off."""
        return self.sync_agents if name in self.triggers else None

    def before_create(self) -> Callable[[set[str]], Awaitable[None]] | None:
        """What the reactors await before a session's creates: the before-kernel-creation
        sync; else, with after-scheduling on, that sync of its agents in flight (it removes
        stray containers so the kernels fit, and a session placed where its image is known
        goes to its creates at once); else nothing."""
        if "before-kernel-creation" in self.triggers:
            return self.sync_agents
        if "after-scheduling" in self.triggers:
            return self.after_scheduling_done
        return None

    def scheduled(self, event: ev.SessionScheduled) -> None:
        """A bus handler: sync the placed agents when the after-scheduling trigger is on."""
        if "after-scheduling" in self.triggers:
            agents = set(event.placements.values())
            task = self._tasks.spawn(self.sync_agents(agents), "sync after scheduling")
            for agent_id in agents:
                self._after_scheduling[agent_id] = task
            task.add_done_callback(lambda _: self._forget(agents, task))

    def _forget(self, agent_ids: set[str], task: asyncio.Task[None]) -> None:
        for agent_id in agent_ids:
            if self._after_scheduling.get(agent_id) is task:
                del self._after_scheduling[agent_id]

    async def after_scheduling_done(self, agent_ids: set[str]) -> None:
        """Wait for the after-scheduling syncs of these agents in flight (their outcome is
        theirs to log: a create goes on either way)."""
        pending = {t for a in agent_ids if (t := self._after_scheduling.get(a)) is not None}
        if pending:
            await asyncio.wait(pending)

    def agent_registered(self, event: ev.AgentRegistered | ev.AgentReregistered) -> None:
        """A bus handler: the agent (re)started and forgot the images it was told of."""
        self._expected_sent.pop(event.originator_id, None)

    # -- the command ---------------------------------------------------------------------

    async def handle(self, req: SyncAgents) -> dict[str, Any]:
        if req.agent_ids is None:
            ids = [a for a, s in self.fleet.agents.items() if s.live]
        else:
            unknown = [a for a in req.agent_ids if a not in self.fleet.agents]
            if unknown:
                raise RequestError(
                    "not-found",
                    f"agent_ids: no agent {quote(unknown)}; list them with hoist agents",
                )
            ids = list(dict.fromkeys(req.agent_ids))
        results = await asyncio.gather(*(self.sync(a) for a in ids))
        return {"agents": dict(zip(ids, results, strict=True))}

    async def sync_agents(self, agent_ids: set[str]) -> None:
        await asyncio.gather(*(self.sync(a) for a in agent_ids))

    # -- one agent -----------------------------------------------------------------------

    def truth(self, agent_id: str) -> rpc.SyncKernels:
        """This agent's kernels as the manager knows them, by status."""
        lists: dict[str, list[str]] = {
            "preparing": [],
            "pulling": [],
            "creating": [],
            "running": [],
            "terminating": [],
        }
        where = {
            S.SCHEDULED: "preparing",
            S.PREPARING: "preparing",
            S.PULLING: "pulling",
            S.PREPARED: "creating",
            S.CREATING: "creating",
            S.RUNNING: "running",
            S.TERMINATING: "terminating",
        }
        for k in self._kernels_on(agent_id):
            lists[where[k[1].status]].append(k[1].kernel_id)
        return rpc.SyncKernels(**lists, view_seq=self.fleet.last_seq)

    def _kernels_on(self, agent_id: str) -> list[tuple[Session, Any]]:
        out = []
        for sid in self.fleet.sessions_on(agent_id):
            session = self.fleet.sessions[sid]
            for k in session.kernels.values():
                if k.agent_id == agent_id and k.status in _ON_AGENT:
                    out.append((session, k))
        return out

    async def sync(self, agent_id: str, exited: Iterable[str] = ()) -> dict[str, Any]:
        """sync-kernels with the view's truth, then record what the agent no longer runs."""
        if not self.assured():
            return {
                "error": "not synced: this manager's lease was not renewed in time (it may no"
                " longer lead, its view may be old); it syncs again once renewed"
            }
        self.syncs += 1
        try:
            reply = msgspec.convert(
                await self.agents.call(agent_id, rpc.SYNC_KERNELS, self.truth(agent_id)),
                rpc.KernelsSynced,
            )
        except (AgentUnreachable, AgentRefused) as e:
            return {"error": str(e)}
        if reply.destroyed:
            log.warning("agent %s: sync destroyed unknown containers %s", agent_id, reply.destroyed)
        repaired = await self._record_gone(agent_id, reply.terminated, set(exited), reply.exits)
        return {
            "running": reply.running,
            "terminated": reply.terminated,
            "destroyed": reply.destroyed,
            "spared": reply.spared,
            "repaired": repaired,
        }

    async def _record_gone(
        self,
        agent_id: str,
        kernel_ids: list[str],
        exited: set[str],
        exits: dict[str, rpc.KernelExit] | None = None,
    ) -> list[str]:
        """Record what the agent no longer runs; the kernels recorded TERMINATED."""
        by_session: dict[str, list[str]] = {}
        for kid in kernel_ids:
            sid = self.fleet.kernel_session.get(kid)
            if sid is not None:
                by_session.setdefault(sid, []).append(kid)
        repaired: list[str] = []
        for sid, kids in by_session.items():
            before = self.fleet.sessions[sid].kernels
            was = {kid: before[kid].status for kid in kids if kid in before}
            await self.uow.try_change(
                sid,
                partial(
                    Session.containers_gone,
                    agent_id=agent_id,
                    kernel_ids=kids,
                    exited=exited,
                    exits=exits,
                ),
                fenced=True,
            )
            after = self.fleet.sessions.get(sid)
            repaired.extend(
                kid
                for kid, status in was.items()
                if after is not None
                and status is not S.TERMINATED
                and after.kernels[kid].status is S.TERMINATED
            )
        return repaired

    # -- reconciliation ------------------------------------------------------------------

    async def reconcile(self) -> list[str]:
        """One round: sync every drifted agent, re-ask lost creates, pin expected images,
        end running kernels of long-lost agents; return the agents synced.

        An agent that agreed with its beat last round (every kernel the view runs there has a
        live container, every live container a kernel of the view, its images pinned) is not
        visited again until its kernels, registration or liveness change in the view or its
        beat lists other containers: time alone cannot make it differ, so a round costs what
        changed, not every live kernel."""
        began = time.perf_counter()
        self._paused_s = 0.0
        try:
            return await self._round()
        finally:
            if self.on_round is not None:
                self.on_round(time.perf_counter() - began - self._paused_s)

    async def _round(self) -> list[str]:
        if not self.assured():  # its pins and syncs would come from an old view: next round
            return []
        now = datetime.now(UTC)
        changed = self.fleet.changed_agents | self.liveness.changed_beats
        self.fleet.changed_agents.clear()
        self.liveness.changed_beats.clear()
        self._agreed -= changed
        drifted: dict[str, set[str]] = {}
        expecting: list[tuple[str, frozenset[str]]] = []  # agent -> the images it must pin
        agreeing: dict[str, frozenset[str]] = {}  # agent -> the images it must have pinned
        visited = 0
        slice_end = time.perf_counter() + _SLICE_S
        for agent_id, state in list(self.fleet.agents.items()):
            if agent_id in self._agreed:
                continue
            visited += 1
            if (spent := time.perf_counter()) > slice_end:
                await asyncio.sleep(_PAUSE_S)  # let creates through: an agent costs its kernels
                resumed = time.perf_counter()
                self._paused_s += resumed - spent
                slice_end = resumed + _SLICE_S
            if not state.live:
                await self._end_on_lost(agent_id, now)
                continue
            beat = self.liveness.last_beat.get(agent_id)
            kernels = self._kernels_on(agent_id)
            expected = frozenset(s.image for s, k in kernels if k.status in ABOUT_TO_USE)
            expecting.append((agent_id, expected))
            if beat is None:
                continue
            drift, agrees = self._drift(agent_id, beat, kernels)
            if drift is not None:
                drifted[agent_id] = drift
            elif agrees:
                agreeing[agent_id] = expected
        self.visited = visited
        # Pinned where the images changed, as known now (a re-registration meanwhile forgets
        # what was pinned); a task per agent whose pins did not change would do nothing.
        await asyncio.gather(
            *(
                self._pin_expected(agent_id, expected)
                for agent_id, expected in expecting
                if self._expected_sent.get(agent_id) != expected
            )
        )
        for agent_id, expected in agreeing.items():
            if self._expected_sent.get(agent_id) == expected:  # else the pin failed: again
                self._agreed.add(agent_id)  # a change meanwhile is taken out next round
        await asyncio.gather(*(self.sync(a, exited) for a, exited in drifted.items()))
        return sorted(drifted)

    def _drift(
        self, agent_id: str, beat: rpc.Heartbeat, kernels: list[tuple[Session, Any]]
    ) -> tuple[set[str] | None, bool]:
        """The kernels whose process exited, if the beat disagrees with the view (else None),
        and whether the two agree entirely (no difference, even one too young to act on)."""
        live = {k.kernel_id: k for k in beat.kernels}
        drift = False
        differs = False
        exited: set[str] = set()
        mine = set()
        for session, k in kernels:
            mine.add(k.kernel_id)
            settled = beat.sent_at - k.status_history[-1].at > self.grace
            container = live.get(k.kernel_id)
            if k.status in (S.RUNNING, S.TERMINATING):
                if container is None or container.status == "exited":
                    differs = True
                    if settled:
                        drift = True
                        if container is not None:
                            exited.add(k.kernel_id)
            elif k.status is S.CREATING and container is None:
                differs = True
                if beat.sent_at - k.status_history[-1].at > self.create_grace:
                    self.uow.publish(LookAgain(session.id))  # create-kernel is asked again
        for kid in live.keys() - mine:
            if live[kid].status == "exited":
                continue  # an ended kernel's container, kept by the agent for its logs
            differs = True
            sid = self.fleet.kernel_session.get(kid)
            known = self.fleet.sessions.get(sid) if sid else None
            if known is None:
                drift = True  # a container of a kernel the manager never knew
                continue
            k = known.kernels[kid]
            if beat.sent_at - k.status_history[-1].at > self.grace:
                drift = True  # a container of a kernel that is over or elsewhere
        return (exited if drift else None), not differs

    async def _pin_expected(self, agent_id: str, expected: frozenset[str]) -> None:
        try:
            await self.agents.call(
                agent_id, rpc.PIN_IMAGES, rpc.PinImages(expected=sorted(expected))
            )
        except (AgentUnreachable, AgentRefused) as e:
            log.info("agent %s: expected images not pinned (%s)", agent_id, e)
            return
        self._expected_sent[agent_id] = expected

    async def _end_on_lost(self, agent_id: str, now: datetime) -> None:
        state = self.fleet.agents[agent_id]
        if state.lost_at is None or now - state.lost_at < self.lost_grace:
            return
        grace_s = self.lost_grace.total_seconds()
        for sid in {s.id for s, k in self._kernels_on(agent_id) if k.status is S.RUNNING}:
            await self.uow.try_change(
                sid, lambda s: s.given_up_on(agent_id, state.status_info, grace_s), fenced=True
            )
