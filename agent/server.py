"""The agent process: registers, heartbeats, and serves its request/reply subjects.

``AgentServer(nc, config, runtime)``; ``await agent.start()`` registers (AgentRegistered, or
AgentReregistered when the aggregate exists) with what the runtime really holds, then serves
``hoist.agent.<id>.<verb>`` (verbs and payloads: domain.rpc) and heartbeats on
``hoist.heartbeat.<id>``; ``await agent.stop()`` ends both and cancels pulls in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import secrets
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from agent.config import AgentConfig
from agent.facts import AgentFacts, Registration
from agent.gc import GcImage, plan_gc
from agent.metrics import AgentMetrics
from agent.pulls import PullManager, PullTask
from agent.runtime.base import (
    ContainerSpec,
    ExecRun,
    ImageInUse,
    ImageMissing,
    KernelContainer,
    KernelCreateError,
    KernelExists,
    KernelNotFound,
    PulledImage,
    Runtime,
    VolumeInUse,
    VolumeMount,
)
from agent.streams import Streams
from domain import events as ev
from domain import limits, rpc
from domain.beats import BeatSender
from domain.image_ref import canonical_or_same
from domain.quota import fmt_mem
from domain.subjects import (
    AGENT_RPC,
    EVENT_STREAM,
    EVENTS_ALL,
    agent_progress,
    check_token,
    heartbeat,
    is_inbox,
)
from eventstore.repository import Repository
from eventstore.store import EventStore
from transport.client import Client
from transport.connection import subscriptions_ready, unsubscribe_all
from transport.tasks import Tasks, every

log = logging.getLogger(__name__)
# A create that does not fit waits this long for other kernels' creates and destroys in flight
# (agent.server._room_for), looking again every ROOM_POLL_S.
ROOM_WAIT_S = 5.0
ROOM_POLL_S = 0.02
# After the last create or destroy in flight ended, the manager's destroy of a kernel cancelled
# while its create ran is still on its way (it is sent once that create's reply is recorded).
ROOM_GRACE_S = 0.2
# The ImageRemoved an agent records when a create finds an image the log says it holds gone.
MISSING_AT_CREATE = "missing: not on this host when a kernel was created (removed outside Hoist)"
_BEAT = {rpc.BEAT_HEADER: "1"}

RECORD_WAIT_S = 10.0  # a check-and-pull reply waits this long for ImagePullStarted to be stored
VOLUMES_TTL_S = 30.0  # the heartbeat's volume names are listed again after this long
# A heartbeat waits this long for the runtime's listings; past it (an engine under load, a
# container it cannot read) it sends the last listing: an agent that is alive must not be
# marked lost, which would end its running kernels.
LISTING_WAIT_S = 5.0
# A container the agent destroyed: an exit reported for it this long after is no exit (a die
# event of the kill can come after the destroy returned).
TOMBSTONE_S = 60.0
# How long after its create-kernel a container a lagging view does not know is spared
# (CreateKernel.seq): another manager's view folds a create within a second, a new leader's its
# predecessor's creates as it takes over.  Bounded, so that a sequence no view reaches (a buggy
# sender, a stream recreated with lower sequences) cannot keep an orphan alive.
SPARE_S = 60.0
# Whether the manager marked this agent lost is read from the log after the manager's notice
# (rpc.LIVENESS_CHANGED), when the connection came back, and at the first beat this long after
# the last read (a notice is at most once: one lost in a network blip is found here; seconds,
# not beats, so a paced agent finds it as soon).  Reading it at every beat cost the stream a
# read per agent per beat, 500/s for 1,000 agents.
LOOK_EVERY_S = 30.0


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
        self.capacity: ev.Capacity | None = None
        self.reserved: dict[str, ev.Resources] = {}  # kernel id -> what its container was given
        # kernel id -> the GPUs (config.gpu_ids) its container was given: never two kernels one
        self.gpus: dict[str, tuple[str, ...]] = {}
        # What image GC must keep besides images in use or being pulled (agent.gc):
        self.preloaded: set[str] = set()  # pinned by preload jobs (ImagePreloaded pinned)
        self.policy_pins: set[str] = set()  # prepull policies (the manager's pin-images)
        self.expected: set[str] = set()  # kernels scheduled here (the manager's pin-images)
        self.leases: dict[str, float] = {}  # image -> monotonic end of its check-and-pull lease
        self.last_used: dict[str, float] = {}  # image -> epoch s: pulled or a container made
        self._gc_lock = asyncio.Lock()
        self.terminating: set[str] = set()  # kernels whose destroy is in flight
        # One lock per kernel with a create or destroy in flight, with how many hold or wait for
        # it: the entry goes with the last of them (an agent sees kernels without end).
        self._kernel_locks: dict[str, asyncio.Lock] = {}
        self._kernel_lock_users: defaultdict[str, int] = defaultdict(int)
        self._waiting_for_room: set[str] = set()  # creates in _room_for
        self._work_ended_at = -math.inf  # when a create or destroy here last ended
        self._sub: Subscription | None = None
        self._look = True  # read the liveness subject at the next beat
        self._liveness_notice = f"{AGENT_RPC}.{self.id}.{rpc.LIVENESS_CHANGED}"
        self._looked_at = time.monotonic()
        self._reconnects = 0  # the connection's count when the subject was last read
        self._heartbeats: asyncio.Task[None] | None = None
        self._tasks = Tasks()  # the loops, one per request in flight, preload follow-ups
        self.first_registration: bool | None = None
        self.streams = Streams(self.id, idle_s=config.stream_idle_s)
        # Containers whose KernelExited is recorded (or being recorded): once per container.
        # container id -> when it was noted (a count, self._notes): a listing begun after that
        # which lacks the container shows it removed for good, and only then is it forgotten.
        self._exits_noted: dict[str, int] = {}
        self._notes = 0
        # Containers this agent destroyed -> when (monotonic): their exits are never recorded.
        self._destroyed: dict[str, float] = {}
        self._stopping = False  # exit callbacks are ignored from then on
        self._expiring: set[str] = set()  # ended kernels whose container is being removed
        # kernel id -> the log sequence its create-kernel came from (CreateKernel.seq): a sync
        # from a view behind it spares the container.  The first create's sequence and time
        # are also its container's labels, which a restarted agent reads back (_recall_asked).
        self._asked_at: dict[str, tuple[int, float]] = {}  # (seq, monotonic time)
        # Containers made or read back by this process: their labels are never read again,
        # so a pruned entry is not seeded anew (each is spared SPARE_S at most, once).
        self._recalled: set[str] = set()
        self._volume_names: tuple[float, list[str]] | None = None  # (monotonic, names) cache
        self._last_listing: tuple[list[KernelContainer], list[PulledImage]] | None = None
        # Beats carry the kernels' changes once the manager acknowledged a full one (a new
        # epoch per process: a restarted agent starts with full beats)
        self.beats = BeatSender(secrets.token_hex(8))
        self.pace_s = 0.0  # the floor under the interval the leading manager asked (BeatPace)
        self._repaced = asyncio.Event()  # a new floor: beat now (the manager sees it kept)
        # The next wait's share of the interval, below 1 once after a start or a new floor
        # (_spread); a new floor to spread after the beat it wakes
        self._phase = 1.0
        self._spread_after_beat = False
        self._verbs: dict[str, Callable[[Any], Awaitable[object]]] = {
            rpc.CHECK_AND_PULL: self.check_and_pull,
            rpc.PRELOAD: self.preload,
            rpc.CREATE_KERNEL: self.create_kernel,
            rpc.DESTROY_KERNEL: self.destroy_kernel,
            rpc.SYNC_KERNELS: self.sync_kernels,
            rpc.UNLOAD: self.unload,
            rpc.PULL_STATUS: self.pull_status,
            rpc.PULL_CANCEL: self.pull_cancel,
            rpc.PIN_IMAGES: self.pin_images,
            rpc.BEATS_ACKED: self.beats_acked,
            rpc.BEAT_PACE: self.beat_pace,
            rpc.IMAGE_GC: self.image_gc,
            rpc.LOGS: self.logs,
            rpc.EXEC: self.exec,
            rpc.STREAM_READ: self.stream_read,
            rpc.VOLUMES: self.volumes,
            rpc.VOLUME_REMOVE: self.volume_remove,
        }

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        measured = await self.runtime.capacity()
        cfg = self.config
        self.capacity = ev.Capacity(
            cpu=cfg.cpu if cfg.cpu is not None else measured.cpu,
            mem=cfg.mem if cfg.mem is not None else measured.mem_bytes,
            disk=cfg.disk if cfg.disk is not None else measured.disk_bytes,
            slots=dict(cfg.slots),
        )
        # Containers that outlived a restart of this agent still hold what they were given
        # (an ended one holds nothing: its process is gone).
        kernels = await self.runtime.list_kernels()
        for k in kernels:
            if not k.running or k.exit is not None:
                continue
            if k.cpu and k.mem_bytes:
                self.reserved[k.kernel_id] = ev.Resources(
                    cpu=k.cpu, mem=k.mem_bytes, slots=dict(k.slots)
                )
            if k.gpu_ids:
                self.gpus[k.kernel_id] = tuple(k.gpu_ids)
        self.first_registration = await self.facts.register()
        if not self.first_registration:
            await self._note_recorded_exits(kernels)
        # Exits are facts on our subject: watch once registered (list_kernels at each
        # heartbeat is the backstop, and reports what ended while no agent ran).
        self.runtime.watch_exits(self._on_exit)
        self.streams.start()
        if (aggregate := self.facts.aggregate) is not None:  # pins survive a restart
            self.preloaded = {image for image, pinned in aggregate.preloaded.items() if pinned}
        log.info(
            "agent %s %s in %s: %s",
            self.id,
            "registered" if self.first_registration else "re-registered",
            cfg.resource_group,
            self.capacity,
        )
        self._sub = await self.nc.subscribe(f"{AGENT_RPC}.{self.id}.*", cb=self._on_request)
        await subscriptions_ready(self.nc)  # "ready" must mean requests find us
        await self.send_heartbeat()
        self._spread()
        self._heartbeats = self._tasks.spawn(
            every(self._beat_wait_s, self._beat, f"agent {self.id}: heartbeat", wake=self._repaced),
            name="heartbeats",
        )
        self._tasks.spawn(
            every(cfg.gc.interval_s, self.image_gc, f"agent {self.id}: image gc"), name="image gc"
        )

    async def stop(self) -> None:
        # First: an exit reported from now on spawns nothing (the tasks are about to stop).
        self._stopping = True
        await unsubscribe_all([self._sub])
        self._sub = None
        await self._tasks.stop()
        await self.streams.stop()
        await self.pulls.close()
        await self.runtime.close()

    async def _report(self) -> Registration:
        assert self.capacity is not None, "start() measures capacity first"
        images = await self.runtime.list_images()
        return Registration(
            resource_group=self.config.resource_group,
            capacity=self.capacity,
            runtime=self.config.runtime,
            images={
                i.image: ev.HeldImage(digest=i.digest, size_bytes=i.size_bytes) for i in images
            },
        )

    # -- heartbeats ----------------------------------------------------------------------------
    # (rpc.is_beat: the header tells a beat from a stored message the server reflected here)

    async def send_heartbeat(self) -> rpc.Heartbeat:
        listed_after = self._notes
        try:
            kernels, images = await asyncio.wait_for(
                asyncio.gather(self.runtime.list_kernels(), self.runtime.list_images()),
                LISTING_WAIT_S,
            )
            self._last_listing = (kernels, images)
            fresh = True
        except Exception as e:  # a slow or failing engine: still say we are alive
            if self._last_listing is None:
                raise
            log.warning(
                "agent %s: listing for the heartbeat failed (%r): last one sent", self.id, e
            )
            kernels, images = self._last_listing
            fresh = False
        body = self.beats.body(
            [
                rpc.LiveKernel(
                    kernel_id=k.kernel_id,
                    session_id=k.session_id,
                    container_id=k.container_id,
                    # Only an exit is an end: a container never started (or paused) is no
                    # kernel kept for its logs (sync-kernels destroys it).
                    status="exited" if k.exit is not None else "running",
                )
                for k in kernels
            ]
        )
        beat = rpc.Heartbeat(
            agent_id=self.id,
            sent_at=datetime.now(UTC),
            kernels=body.kernels,
            epoch=self.beats.epoch,
            seq=body.seq,
            base=body.base,
            gone=body.gone,
            free=self._free(disk_used=sum(i.size_bytes for i in images)),
            images=sorted(i.image for i in images),
            pulls={image: task.task_id for image, task in self.pulls.active.items()},
            address=self.config.address,
            volumes=await self._volumes_held(),
            pace_s=self.pace_s,
        )
        await self.nc.publish(heartbeat(self.id), rpc.encode(beat), headers=_BEAT)
        if fresh:
            self._housekeep(kernels, listed_after)
        return beat

    def _free(self, disk_used: int = 0) -> rpc.FreeCapacity:
        assert self.capacity is not None
        reserved = self.reserved.values()
        return rpc.FreeCapacity(
            cpu=round(self.capacity.cpu - sum(r.cpu for r in reserved), 6),
            mem=self.capacity.mem - sum(r.mem for r in reserved),
            disk=max(0, self.capacity.disk - disk_used),
            slots={
                name: round(amount - sum(r.slots.get(name, 0.0) for r in reserved), 6)
                for name, amount in self.capacity.slots.items()
            },
        )

    async def _volumes_held(self) -> list[str]:
        cached = self._volume_names
        if cached is None or time.monotonic() - cached[0] > VOLUMES_TTL_S:
            # Names only (docker: one call; list_volumes asks which containers use each one).
            try:
                names = sorted(await self.runtime.volume_names())
            except Exception as e:  # the beat goes out anyway, with the names it had
                log.warning("agent %s: volumes not listed (%r)", self.id, e)
                return cached[1] if cached is not None else []
            self._volume_names = cached = (time.monotonic(), names)
        return cached[1]

    # -- kernels that ended ----------------------------------------------------------------------

    def _on_exit(self, kernel: KernelContainer) -> None:
        """runtime.watch_exits: a kernel's process ended."""
        self._housekeep([kernel])

    def _note(self, container_id: str) -> None:
        self._notes += 1
        self._exits_noted[container_id] = self._notes

    async def _note_recorded_exits(self, kernels: list[KernelContainer]) -> None:
        """After a restart: the kept containers whose exit an earlier agent process recorded
        are noted, so their exits are not recorded again.  A recorded KernelExited names no
        container: one matches an ended container of the same kernel and session with the
        same exit code and run time (to the microsecond, from the engine's timestamps)."""
        ended = [k for k in kernels if k.exit is not None]
        if not ended:
            return
        try:
            recorded = await self.facts.recorded_exits()
        except Exception as e:  # not fatal: the manager ignores a repeated exit
            log.warning("agent %s: exits recorded before could not be read: %s", self.id, e)
            return
        for k in ended:
            assert k.exit is not None
            key = (k.kernel_id, k.session_id, k.exit.exit_code, max(0.0, float(k.exit.ran_s)))
            if key in recorded:
                self._note(k.container_id)

    def _housekeep(self, kernels: list[KernelContainer], listed_after: int | None = None) -> None:
        """Record exits not yet recorded; remove ended containers kept long enough.

        ``listed_after``: ``kernels`` is a full listing begun when ``self._notes`` was that;
        then noted containers it lacks are forgotten (only those noted before it began: one
        that ended and was noted while the listing was under way may be missing from it)."""
        if self._stopping:
            return
        now = time.monotonic()
        self._destroyed = {c: t for c, t in self._destroyed.items() if now - t < TOMBSTONE_S}
        self._asked_at = {k: a for k, a in self._asked_at.items() if now - a[1] < SPARE_S}
        # An exit of a container we destroyed (or are destroying) is our kill, not an end.
        ended = [
            k
            for k in kernels
            if k.exit is not None
            and k.container_id not in self._destroyed
            and k.kernel_id not in self.terminating
        ]
        for k in ended:
            if k.container_id in self._exits_noted:
                continue
            self._note(k.container_id)
            # Its process is gone: what it was given is free again.
            self._release(k.kernel_id)
            self._tasks.spawn(self._record_exit(k), name=f"exit {k.kernel_id}")
        if listed_after is not None:
            present = {k.container_id for k in kernels}
            self._exits_noted = {
                c: n for c, n in self._exits_noted.items() if c in present or n > listed_after
            }
        horizon = time.time() - self.config.keep_exited_s
        for k in ended:
            assert k.exit is not None
            if k.exit.finished_at <= horizon and k.kernel_id not in self._expiring:
                self._expiring.add(k.kernel_id)
                self._tasks.spawn(self._expire(k.kernel_id), name=f"expire {k.kernel_id}")

    async def _record_exit(self, k: KernelContainer) -> None:
        assert k.exit is not None
        try:
            await self.facts.kernel_exited(
                k.kernel_id, k.session_id, k.exit.exit_code, k.exit.ran_s, k.exit.oom_killed
            )
        except Exception:
            # The next listing tries again (the store may be back by then).
            self._exits_noted.pop(k.container_id, None)
            raise
        log.info("agent %s: kernel %s exited: code %s", self.id, k.kernel_id, k.exit.exit_code)

    async def _expire(self, kernel_id: str) -> None:
        try:
            if await self._destroy(kernel_id):
                log.info("agent %s: removed the ended kernel %s's container", self.id, kernel_id)
        finally:
            self._expiring.discard(kernel_id)

    def _spread(self) -> None:
        """Make the next wait a random share of the interval.  Agents started or paced at the
        same moment (a rack powered on, a manager that paces the whole fleet at once) would
        otherwise beat together from then on: with 1,000 agents, a thousand beats within the
        same two seconds of every interval, and every create in flight then waited for them
        (bench/lifecycle.py --scale)."""
        self._phase = random.uniform(0.05, 1.0)

    def _beat_wait_s(self) -> float:
        return self.beat_interval_s() * self._phase

    async def _beat(self) -> None:
        """One round of the heartbeat loop (a failed one is logged; the next may get through)."""
        if self._spread_after_beat:
            self._spread_after_beat = False
            self._spread()
        else:
            self._phase = 1.0
        await self.send_heartbeat()
        # Marked lost while alive (e.g. a network partition): say we are back.  Only at a beat:
        # an agent whose beats do not go out is not back.
        reconnects = self.nc.stats["reconnects"]
        now = time.monotonic()
        if self._look or reconnects != self._reconnects or now - self._looked_at >= LOOK_EVERY_S:
            self._look, self._looked_at, self._reconnects = False, now, reconnects
            try:
                await self.facts.refresh()
            except BaseException:
                self._look = True  # read again at the next beat
                raise

    # -- request/reply -------------------------------------------------------------------------

    async def _on_request(self, msg: Msg) -> None:
        if msg.subject == self._liveness_notice:
            # Never answered (only the manager role may publish here, and the notice carries
            # nothing): what the liveness subject holds is read from the log.
            self._look = True
            return
        # One task per request: a slow create must not hold up a pull-status.
        self._tasks.spawn(self._serve(msg))

    async def _serve(self, msg: Msg) -> None:
        if not is_inbox(msg.reply):
            return  # a reply subject is the requester's to choose: only inboxes are answered
        verb = msg.subject.rsplit(".", 1)[-1]
        reply: object
        try:
            handler = self._verbs.get(verb)
            request = rpc.decode_request(verb, msg.data)
            assert handler is not None
            reply = await handler(request)
            if isinstance(reply, dict) and verb in _IMAGE_KEYED:
                reply = _as_asked(reply, msg.data)
        except rpc.RequestError as e:
            reply = e.reply()
        except Exception as e:
            log.exception("agent %s: %s", self.id, verb)
            message = f"{verb} failed: {type(e).__name__}: {limits.quote(str(e))}"
            reply = rpc.RequestError("internal", message).reply()
        await msg.respond(rpc.encode_reply(reply))

    async def check_and_pull(
        self, request: rpc.CheckAndPull | rpc.Preload
    ) -> dict[str, rpc.ImagePresent | rpc.PullTask]:
        lease = time.monotonic() + self.config.gc.lease_s
        for image in request.images:
            # A kernel is about to use it: GC keeps it for the lease (pin-images renews it).
            self.leases[image] = max(lease, self.leases.get(image, 0.0))
        kernel_ids = request.kernel_ids if isinstance(request, rpc.CheckAndPull) else []
        return await self._present_or_pull(request.images, kernel_ids)

    async def _present_or_pull(
        self, images: list[str], kernel_ids: Sequence[str] = ()
    ) -> dict[str, rpc.ImagePresent | rpc.PullTask]:
        """Each image held, or its pull (the one in flight, or a new one) with ``kernel_ids``
        waiting for it (none: an anonymous caller, whose pull is never cancelled)."""
        out: dict[str, rpc.ImagePresent | rpc.PullTask] = {}
        started = []
        for i, image in enumerate(images):
            if image not in self.pulls.active:
                try:
                    held = await self.runtime.has_image(image)
                except ValueError as e:
                    raise rpc.RequestError("invalid-request", f"images[{i}]: {e}") from None
                if held is not None:
                    out[image] = rpc.ImagePresent(digest=held.digest, size=held.size_bytes)
                    continue
            task = self.pulls.request(image, kernel_ids)  # the task in flight, if there is one
            out[image] = rpc.PullTask(task_id=task.task_id)
            started.append(task.recorded.wait())
        # Reply once ImagePullStarted is stored, so the manager can follow the task in the log.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(RECORD_WAIT_S):  # wait_for can lose a cancel on 3.11
                await asyncio.gather(*started)
        return out

    async def preload(self, request: rpc.Preload) -> dict[str, rpc.ImagePresent | rpc.PullTask]:
        if request.pinned:
            self.preloaded.update(request.images)
        out = await self._present_or_pull(request.images)  # no lease: no kernel waits for it
        for image, answer in out.items():
            if isinstance(answer, rpc.ImagePresent):
                await self.facts.image_preloaded(image, request.reason, request.pinned)
            elif (task := self.pulls.get(answer.task_id)) is not None:
                self._tasks.spawn(self._preloaded_when_pulled(task, request.reason, request.pinned))
        return out

    async def _preloaded_when_pulled(self, task: PullTask, reason: str, pinned: bool) -> None:
        await task.ended.wait()  # ImagePulled is recorded by then
        if task.state == "done":
            await self.facts.image_preloaded(task.image, reason, pinned)

    async def beats_acked(self, request: rpc.BeatsAcked) -> rpc.BeatBase:
        return rpc.BeatBase(base=self.beats.acked(request))

    def beat_interval_s(self) -> float:
        """Its own interval, or the manager's floor when that is longer."""
        return max(self.config.heartbeat_interval_s, self.pace_s)

    async def beat_pace(self, request: rpc.BeatPace) -> rpc.BeatPaced:
        if request.floor_s != self.pace_s:
            self.pace_s = request.floor_s
            # A beat at once, not after the wait under way: the manager judges this agent by
            # the floor its last beat kept until it sees the new one.  The wait after it is
            # spread: the manager paces every agent at once.
            self._spread_after_beat = True
            self._repaced.set()
            log.info(
                "agent %s: beats every %gs (%s)",
                self.id,
                self.beat_interval_s(),
                "the manager's pace" if self.pace_s else "its own interval again",
            )
        return rpc.BeatPaced(interval_s=self.beat_interval_s())

    async def pin_images(self, request: rpc.PinImages) -> rpc.ImagesPinned:
        if request.policy is not None:
            self.policy_pins = set(request.policy)
        if request.expected is not None:
            self.expected = set(request.expected)
        return rpc.ImagesPinned(policy=len(self.policy_pins), expected=len(self.expected))

    # -- pull facts (agent.pulls.PullEvents): recorded, and the image's last use is its arrival

    async def pull_started(self, image: str, task_id: str) -> None:
        await self.facts.pull_started(image, task_id)

    async def pulled(self, task_id: str, image: PulledImage, duration_s: float) -> None:
        self.last_used[image.image] = time.time()
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

    async def pull_cancel(self, request: rpc.PullCancel) -> rpc.PullCancelled:
        """The kernels no longer wait for the image: its pull stops if nobody else waits."""
        task = self.pulls.release(request.image, request.kernel_ids, request.reason)
        if task is None:
            return rpc.PullCancelled()
        cancelled = task.cancel_reason is not None
        return rpc.PullCancelled(
            task_id=task.task_id,
            state="cancelled" if cancelled else task.state,
            cancelled=cancelled,
            waiting=sorted(task.kernels),
        )

    async def pull_status(self, request: rpc.PullStatus) -> rpc.PullStatusReply:
        task = self.pulls.get(request.task_id)
        if task is None:
            return rpc.PullStatusReply(task_id=request.task_id, known=False)
        return rpc.PullStatusReply(
            task_id=task.task_id,
            known=True,
            image=task.image,
            state=task.state,
            reason=task.reason,
            current=task.current,
            total=task.total,
        )

    async def create_kernel(self, request: rpc.CreateKernel) -> rpc.KernelCreated:
        kernel_id = request.kernel_id
        _check_id(kernel_id, "kernel_id")
        _check_id(request.session_id, "session_id")
        async with self._kernel_lock(kernel_id):
            existing = await self._container(kernel_id)
            if existing is not None and existing.exit is None and not existing.running:
                # Never started (an agent that died between create and start) or paused: not
                # the kernel's running container, and it would be forever: made again.
                log.warning(
                    "agent %s: kernel %s has a container that is not running (%s): replacing it",
                    self.id,
                    kernel_id,
                    existing.container_id[:12],
                )
                await self._destroy_locked(kernel_id)
                existing = None
            asked_wall = time.time()  # the label's, taken with the memory's
            if request.seq:
                self._asked_at[kernel_id] = (request.seq, time.monotonic())
            if existing is not None:
                self._recalled.add(existing.container_id)  # the labels keep the first create's
                return rpc.KernelCreated(
                    container_id=existing.container_id, existed=True, ports=_ports(existing)
                )
            if not request.seq:  # a new container: nothing of an earlier one's is spared
                self._asked_at.pop(kernel_id, None)
            res = request.resources
            gpus = _whole_gpus(res)
            await self._room_for(kernel_id, res)
            gpu_ids = self._pick_gpus(kernel_id, gpus)
            # Reserved before the create: a concurrent create sees it, and an exit reported
            # while the create returns frees it.
            self.reserved[kernel_id] = res
            if gpu_ids:
                self.gpus[kernel_id] = gpu_ids
            if request.spec.mounts:
                self._volume_names = None
            try:
                container_id = await self.runtime.create(
                    kernel_id,
                    request.session_id,
                    request.image,
                    res.cpu,
                    res.mem,
                    _spec(request, gpu_ids, asked_wall),
                )
            except KernelExists as e:
                self._release(kernel_id)
                return rpc.KernelCreated(container_id=e.container_id, existed=True)
            except ImageMissing as e:
                self._release(kernel_id)
                await self._record_missing(request.image)
                raise rpc.RequestError(rpc.IMAGE_MISSING, e.reason) from None
            except KernelCreateError as e:
                self._release(kernel_id)
                raise rpc.RequestError("create-failed", e.reason) from None
            except ValueError as e:
                self._release(kernel_id)
                raise rpc.RequestError("invalid-request", f"resources: {e}") from None
            except BaseException:
                self._release(kernel_id)
                raise
            self._recalled.add(container_id)  # its labels say what memory says
            self.last_used[request.image] = time.time()
            made = await self._container(kernel_id)
            ports = _ports(made) if made is not None else []
            return rpc.KernelCreated(container_id=container_id, ports=ports)

    async def _record_missing(self, image: str) -> None:
        """The log says this agent holds ``image`` but the engine has it no more (removed
        outside Hoist): record ImageRemoved before the manager hears of it, so it stops
        placing kernels here as if it were (best effort: the reply goes anyway).  Not when a
        pull of it is running or brought it back meanwhile: its ImagePulled says so."""
        try:
            if image in self.pulls.active or await self.runtime.has_image(image) is not None:
                return
            await self.facts.image_removed(canonical_or_same(image), MISSING_AT_CREATE)
        except Exception as e:
            log.warning("agent %s: could not record %s gone (%r)", self.id, image, e)

    async def _room_for(self, kernel_id: str, res: ev.Resources) -> None:
        """``_check_fits``, waiting up to ROOM_WAIT_S while another kernel's create or destroy
        is in flight: a kernel cancelled while its create ran has its room free in the log
        already, and the manager's destroy of it follows the create here, so the kernel
        placed in that room next waits for it instead of failing for want of room."""
        deadline = time.monotonic() + ROOM_WAIT_S
        # How long a destroy may take to follow the last work that ended (before this create
        # came, too: the manager's destroy may still be on its way).
        quiet_until = self._work_ended_at + ROOM_GRACE_S
        self._waiting_for_room.add(kernel_id)
        try:
            while True:
                try:
                    self._check_fits(kernel_id, res)
                    return
                except rpc.RequestError:
                    now = time.monotonic()
                    # Only work under way frees room: creates waiting here too do not.
                    if any(
                        self._in_flight(k)
                        for k in self._kernel_locks
                        if k not in self._waiting_for_room
                    ):
                        quiet_until = now + ROOM_GRACE_S
                    elif now >= quiet_until:
                        raise  # nothing was under way, or no destroy followed what was
                    if now >= deadline:
                        raise
                await asyncio.sleep(ROOM_POLL_S)
        finally:
            self._waiting_for_room.discard(kernel_id)

    def _check_fits(self, kernel_id: str, res: ev.Resources) -> None:
        free = self._free()
        short = [
            f"{name} {amount:g} (free {free.slots.get(name, 0.0):g})"
            for name, amount in sorted(res.slots.items())
            if amount > 0 and amount > free.slots.get(name, 0.0) + 1e-9
        ]
        if res.cpu > free.cpu + 1e-9 or res.mem > free.mem:
            asked = f"cpu {res.cpu:g}, mem {fmt_mem(res.mem)}"
            short.insert(0, f"{asked} (free cpu {free.cpu:g}, mem {fmt_mem(free.mem)})")
        if short:
            raise rpc.RequestError(
                "insufficient-resources",
                f"kernel {kernel_id} asks {'; '.join(short)} on agent {self.id}:"
                " schedule it elsewhere",
            )

    def _pick_gpus(self, kernel_id: str, count: int) -> tuple[str, ...]:
        """``count`` of the agent's GPUs no kernel holds (in --gpu-ids order)."""
        if not count:
            return ()
        held = {gpu for ids in self.gpus.values() for gpu in ids}
        free = [gpu for gpu in self.config.gpu_ids if gpu not in held]
        if len(free) < count:
            raise rpc.RequestError(
                "insufficient-resources",
                f"kernel {kernel_id} asks gpu {count} (free GPUs {len(free)}) on agent {self.id}:"
                " schedule it elsewhere",
            )
        return tuple(free[:count])

    def _release(self, kernel_id: str) -> None:
        """What the kernel's container was given is free again."""
        self.reserved.pop(kernel_id, None)
        self.gpus.pop(kernel_id, None)

    async def destroy_kernel(self, request: rpc.DestroyKernel) -> rpc.KernelDestroyed:
        return rpc.KernelDestroyed(destroyed=await self._destroy(request.kernel_id))

    async def _destroy(self, kernel_id: str) -> bool:
        async with self._kernel_lock(kernel_id):
            return await self._destroy_locked(kernel_id)

    async def _destroy_locked(self, kernel_id: str) -> bool:
        """Destroy the kernel's container (its lock held)."""
        # Which container goes, so that an exit reported for it later (the kill's die event
        # can come after the destroy returned) is never recorded.
        k = await self._container(kernel_id)
        if k is not None:
            self._destroyed[k.container_id] = time.monotonic()
        self.terminating.add(kernel_id)
        try:
            return await self.runtime.destroy(kernel_id)
        finally:
            self.terminating.discard(kernel_id)
            self._release(kernel_id)
            self._asked_at.pop(kernel_id, None)

    @contextlib.asynccontextmanager
    async def _kernel_lock(self, kernel_id: str) -> AsyncIterator[None]:
        lock = self._kernel_locks.setdefault(kernel_id, asyncio.Lock())
        self._kernel_lock_users[kernel_id] += 1
        try:
            async with lock:
                yield
        finally:
            self._kernel_lock_users[kernel_id] -= 1
            if not self._kernel_lock_users[kernel_id]:
                del self._kernel_lock_users[kernel_id], self._kernel_locks[kernel_id]
            self._work_ended_at = time.monotonic()

    async def _container(self, kernel_id: str) -> KernelContainer | None:
        for k in await self.runtime.list_kernels():
            if k.kernel_id == kernel_id:
                return k
        return None

    async def sync_kernels(self, request: rpc.SyncKernels) -> rpc.KernelsSynced:
        """Reconcile with the manager's truth (seed 002)."""
        known = {
            *request.preparing,
            *request.pulling,
            *request.creating,
            *request.running,
            *request.terminating,
        }
        should_end = {*request.running, *request.terminating}
        to_end = set(request.terminating)
        view = request.view_seq
        running: list[str] = []
        destroy: list[str] = []
        unknown: list[str] = []
        spared: list[str] = []
        busy: list[str] = []
        exits: dict[str, rpc.KernelExit] = {}
        listed_after = self._notes
        kernels = await self.runtime.list_kernels()
        self._recall_asked(kernels)
        for k in kernels:
            kid = k.kernel_id
            ended = k.exit is not None  # kept for its logs; not running without an exit is not
            if k.exit is not None:
                exits[kid] = rpc.KernelExit(
                    exit_code=k.exit.exit_code,
                    oom_killed=k.exit.oom_killed,
                    ran_s=max(0.0, k.exit.ran_s),
                )
            if kid in self.terminating:
                busy.append(kid)
            elif self._in_flight(kid):
                # A create-kernel is in flight: the manager asked for it, its view lags.
                running.append(kid)
            elif kid in to_end:
                destroy.append(kid)
            elif ended:
                pass  # kept (with its logs) until keep_exited_s, known or not: terminated
            elif kid not in known:
                # spared running or not (a start that failed too): at most SPARE_S
                (spared if self._past(kid, view) else unknown).append(kid)
            elif not k.running:
                destroy.append(kid)  # never started, or paused: not the kernel running
            else:
                running.append(kid)
        self._housekeep(kernels, listed_after)
        kept = await asyncio.gather(
            *(self._destroy(kid) for kid in destroy),
            *(self._destroy_stray(kid, view) for kid in unknown),
        )
        # Kept: a create asked again from past the view while the sync waited for the lock
        strays = list(zip(unknown, kept[len(destroy) :], strict=True))
        spared += [kid for kid, was_kept in strays if was_kept]
        unknown = [kid for kid, was_kept in strays if not was_kept]
        if unknown:
            log.warning(
                "agent %s: destroyed containers the manager does not know: %s", self.id, unknown
            )
        if spared:
            log.info(
                "agent %s: kept containers created past the manager's view (seq %s): %s",
                self.id,
                view,
                spared,
            )
        have = {*running, *busy}
        terminated = sorted(k for k in should_end if k not in have)
        return rpc.KernelsSynced(
            running=sorted(running),
            terminating=sorted(k for k in busy if k in known),
            terminated=terminated,
            destroyed=sorted(unknown),
            spared=sorted(spared),
            exits={k: exits[k] for k in terminated if k in exits},
        )

    async def _destroy_stray(self, kernel_id: str, view_seq: int | None) -> bool:
        """Destroy a container of a kernel the manager does not know, unless a create-kernel
        from past its view took the kernel's lock first (then kept: True)."""
        async with self._kernel_lock(kernel_id):
            if self._past(kernel_id, view_seq):
                return True
            await self._destroy_locked(kernel_id)
            return False

    def _recall_asked(self, kernels: list[KernelContainer]) -> None:
        """The sequences of creates this process did not hear (it restarted since), from the
        containers' labels, once per container: a restarted agent spares what it spared
        before, for what is left of SPARE_S since the create by the wall clock (which a
        restart does not reset); a create dated ahead of the clock (set back since) counts
        from now, more than SPARE_S ahead not at all."""
        now_wall, now = time.time(), time.monotonic()
        listed = {k.container_id for k in kernels}
        for k in kernels:
            if k.container_id in self._recalled:
                continue
            self._recalled.add(k.container_id)
            if k.asked_seq and k.kernel_id not in self._asked_at:
                age = now_wall - k.asked_at
                if -SPARE_S < age < SPARE_S:
                    self._asked_at[k.kernel_id] = (k.asked_seq, now - max(0.0, age))
        self._recalled &= listed  # what is gone is not listed again

    def _past(self, kernel_id: str, view_seq: int | None) -> bool:
        """Whether the kernel's create came from a record past ``view_seq`` (a view that has
        not folded it yet: another manager's create, seen by a lagging or paused one) less than
        SPARE_S ago; never without one (an older manager)."""
        seq, at = self._asked_at.get(kernel_id, (0, 0.0))
        return view_seq is not None and seq > view_seq and time.monotonic() - at < SPARE_S

    def _in_flight(self, kernel_id: str) -> bool:
        """A create (or destroy) of the kernel holds its lock now."""
        lock = self._kernel_locks.get(kernel_id)
        return lock is not None and lock.locked()

    async def unload(self, request: rpc.Unload) -> dict[str, rpc.UnloadResult]:
        out: dict[str, rpc.UnloadResult] = {}
        kernels = await self.runtime.list_kernels()
        for i, image in enumerate(request.images):
            users = sorted(k.kernel_id for k in kernels if k.image == image)
            task = self.pulls.active.get(image)
            if users:
                why = f"in-use: kernels {_first(users)}"  # ended ones' are kept for their logs
                out[image] = rpc.UnloadResult(removed=False, reason=why)
                continue
            if task is not None:
                out[image] = rpc.UnloadResult(removed=False, reason=f"pulling: task {task.task_id}")
                continue
            if (why := self._about_to_use(image)) is not None:
                out[image] = rpc.UnloadResult(removed=False, reason=why)
                continue
            try:
                removed = await self.runtime.remove_image(image)
            except ImageInUse as e:
                out[image] = rpc.UnloadResult(removed=False, reason=f"in-use: {e}")
                continue
            except ValueError as e:
                raise rpc.RequestError("invalid-request", f"images[{i}]: {e}") from None
            self.preloaded.discard(image)
            self.leases.pop(image, None)
            if removed:
                await self.facts.image_removed(image, request.reason)
                self.metrics.gc_removals.labels("unload").inc()
                out[image] = rpc.UnloadResult(removed=True)
            else:
                out[image] = rpc.UnloadResult(removed=False, reason="not-present")
        return out

    # -- output streams (agent.streams) and volumes -------------------------------------------

    async def _live(self, kernel_id: str) -> KernelContainer:
        _check_id(kernel_id, "kernel_id")
        k = await self._container(kernel_id)
        if k is None:
            raise rpc.RequestError(
                "not-found", f"agent {self.id} has no container for kernel {kernel_id}"
            )
        return k

    async def logs(self, request: rpc.Logs) -> rpc.StreamOpened:
        # A kernel without a container is refused here, on every runtime: the docker runtime's
        # logs is an async generator, which raises KernelNotFound only at its first read (in
        # the stream, too late for a refusal).
        k = await self._live(request.kernel_id)
        try:
            output = self.runtime.logs(request.kernel_id, request.tail, request.follow)
        except KernelNotFound as e:  # removed since (a runtime that checks at once)
            raise rpc.RequestError("not-found", str(e)) from None
        try:
            stream = self.streams.logs(output, k.session_id)  # counts against its session
        except rpc.RequestError:
            aclose = getattr(output, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            raise
        return rpc.StreamOpened(stream_id=stream.id, idle_s=self.streams.idle_s)

    async def exec(self, request: rpc.Exec) -> rpc.StreamOpened:
        k = await self._live(request.kernel_id)
        if k.exit is not None:
            raise rpc.RequestError(
                "conflict",
                f"kernel {k.kernel_id} has ended (exit code {k.exit.exit_code}): exec needs it"
                " running (its logs stay readable until its container is removed)",
            )
        if not k.running:
            raise rpc.RequestError(
                "conflict",
                f"kernel {k.kernel_id}'s container is not running (never started, or paused):"
                " exec needs it running",
            )

        async def start() -> ExecRun:
            try:
                return await self.runtime.exec(
                    request.kernel_id, request.command, request.env, request.workdir
                )
            except KernelNotFound as e:
                raise rpc.RequestError("not-found", str(e)) from None
            except KernelCreateError as e:
                raise rpc.RequestError("conflict", f"exec failed: {e.reason}") from None

        stream = await self.streams.exec(start, request.timeout, k.session_id)
        return rpc.StreamOpened(stream_id=stream.id, idle_s=self.streams.idle_s)

    async def stream_read(self, request: rpc.StreamRead) -> rpc.StreamChunk:
        stream = self.streams.get(request.stream_id)
        return await stream.read(request.cursor, request.wait, request.max_bytes)

    async def volumes(self, request: rpc.ListVolumes) -> rpc.VolumesListed:
        held = await self.runtime.list_volumes()
        self._volume_names = (time.monotonic(), sorted(v.name for v in held))
        return rpc.VolumesListed(
            volumes=[
                rpc.VolumeInfo(name=v.name, owner=v.owner, used_by=list(v.used_by))
                for v in sorted(held, key=lambda v: v.name)
                if request.owner is None or v.owner == request.owner
            ]
        )

    async def volume_remove(self, request: rpc.RemoveVolume) -> rpc.VolumeRemoved:
        found = [v for v in await self.runtime.list_volumes() if v.name == request.name]
        if not found:
            return rpc.VolumeRemoved(removed=False)
        if request.owner is not None and found[0].owner != request.owner:
            raise rpc.RequestError("conflict", f"volume {request.name} belongs to another owner")
        self._volume_names = None
        try:
            removed = await self.runtime.remove_volume(request.name)
        except VolumeInUse as e:
            raise rpc.RequestError("conflict", str(e)) from None
        return rpc.VolumeRemoved(removed=removed)

    # -- image GC (agent.gc) --------------------------------------------------------------------

    def _about_to_use(self, image: str) -> str | None:
        if image in self.expected:
            return "about-to-use: a kernel scheduled on this agent needs it"
        if self.leases.get(image, 0.0) > time.monotonic():
            return "about-to-use: asked for by check-and-pull"
        return None

    async def _kept(self) -> dict[str, str]:
        """Images GC must not remove, and why."""
        kept: dict[str, str] = {}
        for k in await self.runtime.list_kernels():
            kept.setdefault(k.image, f"in-use: kernel {k.kernel_id}")
            self.last_used[k.image] = time.time()  # in use is used now
        for image, task in self.pulls.active.items():
            kept.setdefault(image, f"pulling: task {task.task_id}")
        for image in {*self.expected, *self.leases}:
            if (why := self._about_to_use(image)) is not None:
                kept.setdefault(image, why)
        for image in self.preloaded:
            kept.setdefault(image, "pinned: preloaded")
        for image in self.policy_pins:
            kept.setdefault(image, "pinned: a prepull policy wants it")
        return kept

    async def image_gc(self, request: rpc.ImageGc | None = None) -> rpc.GcReport:
        """One GC pass: decide with agent.gc.plan_gc, remove, record ImageRemoved each."""
        assert self.capacity is not None
        async with self._gc_lock:
            now = time.monotonic()
            self.leases = {i: t for i, t in self.leases.items() if t > now}
            held = await self.runtime.list_images()
            first_seen = time.time()
            images = [
                GcImage(i.image, i.size_bytes, self.last_used.setdefault(i.image, first_seen))
                for i in held
            ]
            kept = await self._kept()
            plan = plan_gc(images, self.capacity.disk, self.config.gc, kept)
            removed: list[rpc.GcRemoval] = []
            for image, reason in plan.removals:
                # Asked for since the plan (a check-and-pull, a preload)? Then it stays.
                if image.image in self.pulls.active or self._about_to_use(image.image):
                    continue
                if image.image in self.preloaded or image.image in self.policy_pins:
                    continue
                try:
                    gone = await self.runtime.remove_image(image.image)
                except ImageInUse:
                    continue  # a container appeared meanwhile: it is in use
                self.last_used.pop(image.image, None)
                if gone:
                    await self.facts.image_removed(image.image, reason)
                    self.metrics.gc_removals.labels("space").inc()
                    removed.append(
                        rpc.GcRemoval(image=image.image, size_bytes=image.size_bytes, reason=reason)
                    )
            if removed:
                log.info("agent %s: image gc removed %s", self.id, [r.image for r in removed])
            return rpc.GcReport(
                disk=self.capacity.disk,
                used_before=plan.used,
                used_after=plan.used - sum(r.size_bytes for r in removed),
                removed=removed,
                kept={i.image: kept[i.image] for i in images if i.image in kept},
                note=plan.note,
            )

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


def _whole_gpus(res: ev.Resources) -> int:
    amount = res.slots.get("gpu", 0.0)
    if amount != int(amount):
        raise rpc.RequestError(
            "invalid-request",
            f"resources.gpu must be a whole number of GPUs (one GPU is not shared), got {amount:g}",
        )
    return int(amount)


def _spec(
    request: rpc.CreateKernel, gpu_ids: tuple[str, ...] = (), asked_at: float = 0.0
) -> ContainerSpec:
    spec = request.spec
    return ContainerSpec(
        command=spec.command,
        env=dict(spec.env),
        workdir=spec.workdir,
        ports=list(spec.ports),
        mounts=[VolumeMount(m.volume, m.path, m.read_only) for m in spec.mounts],
        hostname=request.hostname,
        extra_hosts=dict(request.extra_hosts),
        slots=dict(request.resources.slots),
        owner=request.owner,
        private_network=request.cluster_size > 1,
        gpu_ids=gpu_ids,
        asked_seq=request.seq,
        asked_at=asked_at if request.seq else 0.0,
    )


def _ports(k: KernelContainer) -> list[ev.PublishedPort]:
    return [ev.PublishedPort(port=p.port, host=p.host, host_port=p.host_port) for p in k.ports]


def _first(ids: list[str], shown: int = 3) -> str:
    """``a, b, c and 18 more``: a reason stays one readable line."""
    head = ", ".join(ids[:shown])
    return head if len(ids) <= shown else f"{head} and {len(ids) - shown} more"


def _check_id(value: str, field: str) -> None:
    try:
        check_token(value, field)
    except ValueError as e:
        raise rpc.RequestError("invalid-request", str(e)) from None


# Verbs answered per image: keyed by canonical references inside, by the caller's own spelling
# on the wire (a caller that asked for "python" finds its answer under "python").
_IMAGE_KEYED = frozenset({rpc.CHECK_AND_PULL, rpc.PRELOAD, rpc.UNLOAD})


def _as_asked(reply: dict[str, Any], data: bytes) -> dict[str, Any]:
    asked = msgspec.json.decode(data).get("images") or []
    return {image: reply[canonical_or_same(image)] for image in asked}
