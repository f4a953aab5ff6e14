"""The manager's liveness watcher: an agent whose heartbeats stop for ``deadline_s`` is lost.

Heartbeats (``hoist.heartbeat.<id>``, core NATS) are not stored, so only the loss is a fact:
AgentLost with ``status_info`` like ``heartbeat-timeout: no heartbeat for 15s``, on the agent's
liveness subject (``hoist.events.liveness.<id>``, domain.liveness), which only the manager may
write.  An agent that comes back re-registers itself (agent.facts); its next heartbeat re-arms
the watch here.

Only the leader marks agents lost, and each AgentLost is fenced with its lease
(services.manager.leadership): a paused ex-leader's loss is refused.  A watcher that did not
look for a while (its process was paused or starved: the heartbeats it has not read yet are
no evidence of silence) judges nobody on that round and gives every agent a deadline from then.

The watcher is also the live agent table: ``last_beat`` holds every agent's latest heartbeat
since the manager started (in memory, never stored); the agents query joins
``last_heartbeat_at`` in from it at reply time (services.manager.queries).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from domain import rpc
from domain.agent import Agent
from domain.beats import BeatReceiver, pace_floor, silence_deadline
from domain.liveness import AgentLiveness
from domain.reasons import Reason, info
from domain.rpc import MAX_BEAT_FLOOR_S, Heartbeat, is_beat
from domain.subjects import HEARTBEAT, agent_rpc, manager_term
from eventstore.repository import NotFound, Repository, loaded_seq
from eventstore.store import ConcurrencyError, Write
from services.manager.agent_rpc import AgentCallFailed, AgentRpc
from services.manager.leadership import NotLeading
from transport.client import Client
from transport.connection import unsubscribe_all
from transport.tasks import Tasks, every

log = logging.getLogger(__name__)

DEFAULT_DEADLINE_S = 15.0  # several missed beats at the agent's default 2 s interval
# A fleet's beats per second, at most (domain.beats.pace_floor): 1,000 agents beat every 10 s.
DEFAULT_BEATS_PER_S = 100.0
RETELL_S = 30.0  # an agent whose beats still show another floor is told again after this
_ATTEMPTS = 10


class LivenessWatcher:
    def __init__(
        self,
        nc: Client,
        repository: Repository,
        *,
        deadline_s: float = DEFAULT_DEADLINE_S,
        beats_per_s: float = DEFAULT_BEATS_PER_S,
        check_interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        acts: Callable[[], bool] = lambda: True,
        agents: AgentRpc | None = None,
        fence: Callable[[], Sequence[Write]] = tuple,
        on_heartbeat: Callable[[float], None] | None = None,
    ) -> None:
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0 seconds, got {deadline_s!r}")
        self.nc = nc
        self.repository = repository
        pace_floor(0, beats_per_s)  # a bad value refused here, not at the first beat
        self.deadline_s = deadline_s
        self.beats_per_s = beats_per_s
        self.check_interval_s = check_interval_s or min(1.0, deadline_s / 4)
        self.clock = clock
        self.acts = acts  # whether this manager marks agents lost now (it leads)
        self.fence = fence  # the leader's, with each AgentLost
        self.on_heartbeat = on_heartbeat  # told each heartbeat's handling time (stats)
        # A round later than this after the one before is a stall, not silence (see check)
        self.stall_s = max(3 * self.check_interval_s, deadline_s / 3)
        self._checked_at: float | None = None
        # Acknowledges full beats, so agents send the kernels' changes (domain.beats); without
        # it agents go on listing every kernel in every beat.
        self.agents = agents
        self.beats = BeatReceiver()
        self.last_seen: dict[str, float] = {}  # agent id -> when its last heartbeat arrived
        self.last_beat: dict[str, Heartbeat] = {}
        # Agents whose beat listed other containers than their previous one (or was their
        # first) since reconciliation last took them (services.manager.agent_sync)
        self.changed_beats: set[str] = set()
        self.marked: set[str] = set()  # marked lost by this watcher since its last heartbeat
        self._floor = 0.0  # the floor asked last (floor_s)
        self._told: dict[str, tuple[float, float]] = {}  # agent id -> (floor, when) told
        # agent id -> the floor its last beat kept: it is judged by the longer of that and the
        # fleet's (a floor lowered reaches it only at its next beat, after the old interval)
        self._kept: dict[str, float] = {}
        self._decoder = msgspec.json.Decoder(Heartbeat)
        self._sub: Subscription | None = None
        self._tasks = Tasks()

    async def start(self, known_agents: Iterable[str] = ()) -> None:
        """Watch heartbeats; ``known_agents`` (registered, not lost) get a deadline from now
        even if they never beat again (e.g. they died while the manager was down)."""
        now = self.clock()
        for agent_id in known_agents:
            self.last_seen.setdefault(agent_id, now)
        self._sub = await self.nc.subscribe(f"{HEARTBEAT}.*", cb=self._timed_heartbeat)
        self._tasks.spawn(
            every(self.check_interval_s, self.check, "liveness check"), name="liveness"
        )

    async def stop(self) -> None:
        await unsubscribe_all([self._sub])
        self._sub = None
        await self._tasks.stop()

    def last_heartbeat_at(self, agent_id: str) -> datetime | None:
        """When the agent sent its latest heartbeat (by its clock); None if none arrived since
        the manager started."""
        beat = self.last_beat.get(agent_id)
        return beat.sent_at if beat is not None else None

    def address_of(self, agent_id: str) -> str | None:
        """Where the agent's published ports are reachable, as its latest heartbeat said."""
        beat = self.last_beat.get(agent_id)
        return beat.address if beat is not None else None

    async def _timed_heartbeat(self, msg: Msg) -> None:
        started = time.perf_counter()
        try:
            await self._on_heartbeat(msg)
        finally:
            if self.on_heartbeat is not None:
                self.on_heartbeat(time.perf_counter() - started)

    async def _on_heartbeat(self, msg: Msg) -> None:
        agent_id = msg.subject.rsplit(".", 1)[-1]  # the subject, which nats.conf ties to the user
        # Only a beat (rpc.is_beat), well formed, of this agent counts: nats-server delivers its
        # answers to JetStream requests on any reply subject named, so a message on this subject
        # is no proof that the agent sent it.
        if not is_beat(msg.headers):  # a stored message the server reflected here
            log.debug("a message on %s that is no beat: not counted", msg.subject)
            return
        try:
            beat = self._decoder.decode(msg.data)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            log.warning("heartbeat on %s is malformed (%s): not counted", msg.subject, e)
            return
        if beat.agent_id != agent_id:
            log.warning("heartbeat on %s names agent %r: not counted", msg.subject, beat.agent_id)
            return
        self.last_seen[agent_id] = self.clock()
        self.marked.discard(agent_id)
        if beat.pace_s is not None:
            self._kept[agent_id] = beat.pace_s
            self._keep_pace(agent_id, beat.pace_s)
        if self.agents is not None:
            applied, ack = self.beats.receive(beat)
            if ack is not None:
                self._tasks.spawn(self._acknowledge(agent_id, ack), f"ack beats of {agent_id}")
            if applied is None:
                return  # the last beat it could apply stays, until a full one comes
            beat = applied
        before = self.last_beat.get(agent_id)
        if before is None or before.kernels != beat.kernels:
            self.changed_beats.add(agent_id)
        self.last_beat[agent_id] = beat

    def floor_s(self) -> float:
        """The floor under the agents' intervals for the fleet this watcher hears now.  It
        rises at once, and comes down only once the fleet is a tenth below what needs it: a
        fleet going back and forth across a step (200 and 201 agents) re-tells nobody."""
        live = len(self.last_seen) - len(self.marked)
        floor = pace_floor(live, self.beats_per_s)
        if floor < self._floor and pace_floor(live * 11 // 10, self.beats_per_s) >= self._floor:
            return self._floor
        if floor != self._floor:
            self._say_floor(live, floor)
        self._floor = floor
        return floor

    def _say_floor(self, live: int, floor: float) -> None:
        if floor >= MAX_BEAT_FLOOR_S and live / floor > self.beats_per_s:
            log.warning(
                "%d agents beat every %.0f s: %.1f heartbeats/s, over --heartbeats-per-second"
                " %g (the floor stops at %.0f s, so a lost agent is found within minutes)",
                live, floor, live / floor, self.beats_per_s, MAX_BEAT_FLOOR_S,
            )  # fmt: skip
        else:
            log.info("heartbeat floor for %d agents: %.0f s (0: none)", live, floor)

    def silence_deadline_s(self, agent_id: str) -> float:
        """How long ``agent_id`` may be silent: by the longer of the fleet's floor and the one
        its last beat kept."""
        return self._deadline_of(agent_id, self.floor_s())

    def _deadline_of(self, agent_id: str, fleet_floor: float) -> float:
        return silence_deadline(max(fleet_floor, self._kept.get(agent_id, 0.0)), self.deadline_s)

    def _keep_pace(self, agent_id: str, pace_s: float) -> None:
        """Tell an agent whose beat shows another floor than the fleet's now (the leader only;
        again after RETELL_S while its beats still show another, a reply lost say)."""
        floor = self.floor_s()
        if pace_s == floor or self.agents is None or not self.acts():
            return
        now = self.clock()
        told = self._told.get(agent_id)
        if told is not None and told[0] == floor and now - told[1] < RETELL_S:
            return
        self._told[agent_id] = (floor, now)
        self._tasks.spawn(self._tell_pace(agent_id, floor), f"pace of {agent_id}")

    async def _tell_pace(self, agent_id: str, floor_s: float) -> None:
        assert self.agents is not None
        try:
            await self.agents.call(
                agent_id, rpc.BEAT_PACE, rpc.BeatPace(floor_s=floor_s), wait_s=5.0
            )
        except AgentCallFailed as e:  # its next beats show the old floor: told again later
            log.info("agent %s: pace not told (%s)", agent_id, e)

    async def _acknowledge(self, agent_id: str, ack: rpc.BeatsAcked) -> None:
        assert self.agents is not None
        try:
            await self.agents.call(agent_id, rpc.BEATS_ACKED, ack, wait_s=5.0)
        except AgentCallFailed as e:  # it sends full beats meanwhile; the next is acknowledged
            log.info("agent %s: beats not acknowledged (%s)", agent_id, e)

    async def check(self) -> list[str]:
        """Mark every agent silent for the deadline lost; return the ones marked now.  After a
        stall of this watcher (``stall_s`` since its last round) nobody is judged: every agent
        gets a deadline from now, as at start."""
        now = self.clock()
        before, self._checked_at = self._checked_at, now
        if before is not None and now - before >= self.stall_s:
            log.warning(
                "liveness: no round for %.1fs (this process was paused or starved): every"
                " agent gets its full deadline (%gs unpaced) from now",
                now - before,
                self.deadline_s,
            )
            for agent_id in self.last_seen:
                self.last_seen[agent_id] = now
            return []
        if not self.acts():
            return []
        floor = self.floor_s()
        silent = {}
        for agent_id, seen in self.last_seen.items():
            deadline = self._deadline_of(agent_id, floor)
            if now - seen >= deadline and agent_id not in self.marked:
                silent[agent_id] = deadline
        marked: list[str] = []
        for agent_id, deadline in silent.items():
            try:
                lost = await self.mark_lost(agent_id, f"no heartbeat for {deadline:g}s")
            except NotLeading:
                return marked  # it stepped down meanwhile: the new leader judges
            if lost:
                marked.append(agent_id)
            self.marked.add(agent_id)
        return marked

    async def _tell(self, agent_id: str) -> None:
        """Tell the agent its liveness subject changed: alive after all, it reads the subject
        at its next beat and re-registers (a notice lost, it reads it within 30 s and a beat)."""
        try:
            await self.nc.publish(agent_rpc(agent_id, rpc.LIVENESS_CHANGED), b"")
        except Exception as e:  # the connection is going: the agent's own look finds it
            log.info("agent %s not told it was marked lost: %s", agent_id, e)

    async def mark_lost(self, agent_id: str, detail: str) -> bool:
        """Append AgentLost (``heartbeat-timeout: <detail>``), fenced; False if it already was
        lost or is not registered, NotLeading if this manager no longer leads."""
        for _ in range(_ATTEMPTS):
            try:
                agent = await self.repository.get(Agent, agent_id)
            except NotFound:
                log.warning("agent %s sent heartbeats but never registered: ignored", agent_id)
                return False
            try:
                liveness: AgentLiveness | None = await self.repository.get(AgentLiveness, agent_id)
            except NotFound:
                liveness = None
            # Already lost when the agent wrote nothing since its last loss (one loss is one
            # fact; an agent back re-registers before anything else).
            if liveness is not None and loaded_seq(liveness) > loaded_seq(agent):
                return False
            why = info(Reason.HEARTBEAT_TIMEOUT, detail)
            liveness = AgentLiveness.mark_lost(liveness, agent_id, why)
            try:
                await self.repository.save(liveness, also=self.fence())
            except ConcurrencyError as e:
                if e.subject == manager_term():  # the fence: another manager leads now
                    raise NotLeading(f"agent {agent_id} not marked lost: {e}") from None
                continue  # another writer of the liveness subject: decide again
            log.warning("agent %s lost: %s", agent_id, why)
            await self._tell(agent_id)
            return True
        raise RuntimeError(f"agent {agent_id} kept changing while being marked lost; retry")
