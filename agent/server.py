"""The agent process: registers, heartbeats, and serves its request/reply subjects.

``AgentServer(nc, config, runtime)``; ``await agent.start()`` registers (AgentRegistered, or
AgentReregistered when the aggregate exists) with what the runtime really holds, then serves
``hoist.agent.<id>.<verb>`` (verbs and payloads: domain.rpc; handlers: agent.verbs) and
heartbeats on ``hoist.heartbeat.<id>`` (agent.heartbeats); ``await agent.stop()`` ends both
and cancels pulls in flight.  The work is done by the parts it composes: room and GPU
accounting (agent.room), kernel containers (agent.kernels), their exits (agent.exits),
containers the manager does not know (agent.strays, agent.spares), image GC
(agent.image_gc), the image verbs (agent.image_verbs) and a kernel's output and volumes
(agent.kernel_io).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from agent.config import AgentConfig
from agent.exits import Exits
from agent.facts import AgentFacts, Registration
from agent.heartbeats import Heartbeats
from agent.image_gc import ImageGc
from agent.image_verbs import ImageVerbs
from agent.kernel_io import KernelIo
from agent.kernel_locks import KernelLocks
from agent.kernels import Kernels
from agent.metrics import AgentMetrics
from agent.pulls import PullManager
from agent.room import Room
from agent.runtime.base import PulledImage, Runtime
from agent.spares import Spares
from agent.strays import Strays
from agent.streams import Streams
from agent.verbs import Handler, answer, verb_handlers
from agent.volume_names import VolumeNames
from domain import events as ev
from domain import rpc
from domain.subjects import AGENT_RPC, EVENT_STREAM, EVENTS_ALL, agent_progress
from eventstore.repository import Repository
from eventstore.store import EventStore
from transport.client import Client
from transport.connection import subscriptions_ready, unsubscribe_all
from transport.tasks import Tasks, every

log = logging.getLogger(__name__)


class AgentServer:
    def __init__(
        self, nc: Client, config: AgentConfig, runtime: Runtime, store: EventStore | None = None
    ) -> None:
        self.nc = nc
        self.config = config
        self.id = config.agent_id
        self.runtime = runtime
        self.store = store or EventStore(nc, EVENT_STREAM, [EVENTS_ALL])
        self.facts = AgentFacts(
            Repository(self.store, actor=f"agent:{self.id}"), self.id, self._report
        )
        self.pulls = PullManager(
            self.id, runtime, self, self._publish_progress, config.pulls, config.auth_for
        )
        self.metrics = AgentMetrics(lambda: len(self.pulls.active))
        self.first_registration: bool | None = None
        self.streams = Streams(self.id, idle_s=config.stream_idle_s)
        self._tasks = Tasks()  # the loops, one per request in flight, preload follow-ups
        self._sub: Subscription | None = None
        self._heartbeats: asyncio.Task[None] | None = None
        self._liveness_notice = f"{AGENT_RPC}.{self.id}.{rpc.LIVENESS_CHANGED}"

        self.room = Room(self.id, config.gpu_ids, KernelLocks())
        self.spares = Spares()
        self.volume_names = VolumeNames(self.id, runtime)
        self.image_gc = ImageGc(
            self.id,
            runtime,
            self.facts,
            self.pulls,
            self.metrics,
            config.gc,
            lambda: self.room.capacity,
        )
        self.kernels = Kernels(
            self.id,
            runtime,
            self.facts,
            self.pulls,
            self.room,
            self.spares,
            self.image_gc,
            self.volume_names,
        )
        self.exits = Exits(self.id, self.facts, self.kernels, self._tasks, config.keep_exited_s)
        self.strays = Strays(self.id, self.kernels, self.exits)
        self.heartbeats = Heartbeats(
            nc, config, runtime, self.facts, self.pulls, self.room, self.exits, self.volume_names
        )
        self.image_verbs = ImageVerbs(
            runtime, self.facts, self.pulls, self.image_gc, self.metrics, self._tasks
        )
        self.kernel_io = KernelIo(self.kernels, self.streams, self.volume_names)
        self.handlers: dict[str, Handler] = verb_handlers(
            self.image_verbs,
            self.kernels,
            self.strays,
            self.kernel_io,
            self.heartbeats,
            self.image_gc,
        )

    # -- what tests and the agent's process read -------------------------------------------------

    @property
    def capacity(self) -> ev.Capacity | None:
        return self.room.capacity

    @capacity.setter
    def capacity(self, capacity: ev.Capacity) -> None:
        self.room.capacity = capacity

    @property
    def pace_s(self) -> float:
        return self.heartbeats.pace_s

    def beat_interval_s(self) -> float:
        return self.heartbeats.interval_s()

    async def send_heartbeat(self) -> rpc.Heartbeat:
        return await self.heartbeats.send()

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        measured = await self.runtime.capacity()
        cfg = self.config
        self.room.capacity = ev.Capacity(
            cpu=cfg.cpu if cfg.cpu is not None else measured.cpu,
            mem=cfg.mem if cfg.mem is not None else measured.mem_bytes,
            disk=cfg.disk if cfg.disk is not None else measured.disk_bytes,
            slots=dict(cfg.slots),
        )
        kernels = await self.runtime.list_kernels()
        self.room.recover(kernels)
        self.first_registration = await self.facts.register()
        if not self.first_registration:
            await self.exits.skip_recorded(kernels)
        # Exits are facts on our subject: watch once registered (list_kernels at each
        # heartbeat is the backstop, and reports what ended while no agent ran).
        self.runtime.watch_exits(self.exits.on_exit)
        self.streams.start()
        if (aggregate := self.facts.aggregate) is not None:  # pins survive a restart
            self.image_gc.preloaded = {
                image for image, pinned in aggregate.preloaded.items() if pinned
            }
        log.info(
            "agent %s %s in %s: %s",
            self.id,
            "registered" if self.first_registration else "re-registered",
            cfg.resource_group,
            self.room.capacity,
        )
        self._sub = await self.nc.subscribe(f"{AGENT_RPC}.{self.id}.*", cb=self._on_request)
        await subscriptions_ready(self.nc)  # "ready" must mean requests find us
        await self.heartbeats.send()
        self.heartbeats.spread()
        self._heartbeats = self._tasks.spawn(
            every(
                self.heartbeats.wait_s,
                self.heartbeats.beat,
                f"agent {self.id}: heartbeat",
                wake=self.heartbeats.repaced,
            ),
            name="heartbeats",
        )
        self._tasks.spawn(
            every(cfg.gc.interval_s, self.image_gc.run, f"agent {self.id}: image gc"),
            name="image gc",
        )

    async def stop(self) -> None:
        # First: an exit reported from now on spawns nothing (the tasks are about to stop).
        self.exits.stopping = True
        await unsubscribe_all([self._sub])
        self._sub = None
        await self._tasks.stop()
        await self.streams.stop()
        await self.pulls.close()
        await self.runtime.close()

    async def _report(self) -> Registration:
        assert self.room.capacity is not None, "start() measures capacity first"
        images = await self.runtime.list_images()
        return Registration(
            resource_group=self.config.resource_group,
            capacity=self.room.capacity,
            runtime=self.config.runtime,
            images={
                i.image: ev.HeldImage(digest=i.digest, size_bytes=i.size_bytes) for i in images
            },
        )

    # -- request/reply -------------------------------------------------------------------------

    async def _on_request(self, msg: Msg) -> None:
        if msg.subject == self._liveness_notice:
            # Never answered (only the manager role may publish here, and the notice carries
            # nothing): what the liveness subject holds is read from the log.
            self.heartbeats.liveness_changed()
            return
        # One task per request: a slow create must not hold up a pull-status.
        self._tasks.spawn(self._serve(msg))

    async def _serve(self, msg: Msg) -> None:
        await answer(self.handlers, msg)

    # -- pull facts (agent.pulls.PullEvents): recorded, and the image's last use is its arrival

    async def pull_started(self, image: str, task_id: str) -> None:
        await self.facts.pull_started(image, task_id)

    async def pulled(self, task_id: str, image: PulledImage, duration_s: float) -> None:
        self.image_gc.used(image.image)
        self._pull_metric(task_id, "pulled", image.size_bytes)
        await self.facts.pulled(task_id, image, duration_s)

    async def pull_failed(
        self, image: str, task_id: str, reason: str, cancelled: bool = False
    ) -> None:
        self._pull_metric(task_id, "cancelled" if cancelled else "failed", reason=reason)
        await self.facts.pull_failed(image, task_id, reason, cancelled)

    def _pull_metric(self, task_id: str, outcome: str, size: int = 0, reason: str = "") -> None:
        task = self.pulls.get(task_id)
        if task is not None:
            self.metrics.pull_ended(task.requested_at, outcome, size or task.total, reason)

    # -- progress ------------------------------------------------------------------------------

    async def _publish_progress(self, progress: rpc.PullProgress) -> None:
        subject = agent_progress(self.id, progress.task_id)
        data = rpc.encode(progress)
        if progress.done:
            # The final state must land in the stream: wait for its ack (best effort).
            with contextlib.suppress(Exception):
                await self.nc.request(subject, data, timeout=2)
                return
        await self.nc.publish(subject, data)
