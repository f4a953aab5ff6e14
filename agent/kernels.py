"""Making and removing this agent's kernel containers (create-kernel, destroy-kernel)."""

from __future__ import annotations

import logging
import time

from agent.facts import AgentFacts
from agent.image_gc import ImageGc
from agent.kernel_locks import KernelLocks
from agent.pulls import PullManager
from agent.room import Room, whole_gpus
from agent.runtime.base import (
    ContainerSpec,
    HomeFile,
    ImageMissing,
    KernelContainer,
    KernelCreateError,
    KernelExists,
    Runtime,
    VolumeMount,
)
from agent.spares import Spares
from agent.volume_names import VolumeNames
from domain import events as ev
from domain import rpc
from domain.image_ref import canonical_or_same
from domain.subjects import check_token

log = logging.getLogger(__name__)

# The ImageRemoved an agent records when a create finds an image the log says it holds gone.
MISSING_AT_CREATE = "missing: not on this host when a kernel was created (removed outside Hoist)"
# A container the agent destroyed: an exit reported for it this long after is no exit (a die
# event of the kill can come after the destroy returned).
TOMBSTONE_S = 60.0


class Kernels:
    def __init__(
        self,
        agent_id: str,
        runtime: Runtime,
        facts: AgentFacts,
        pulls: PullManager,
        room: Room,
        spares: Spares,
        image_gc: ImageGc,
        volume_names: VolumeNames,
    ) -> None:
        self.agent_id = agent_id
        self.runtime = runtime
        self.facts = facts
        self.pulls = pulls
        self.room = room
        self.locks: KernelLocks = room.locks
        self.spares = spares
        self.image_gc = image_gc
        self.volume_names = volume_names
        self.terminating: set[str] = set()  # kernels whose destroy is in flight
        # Containers this agent destroyed -> when (monotonic): their exits are never recorded.
        self.destroyed: dict[str, float] = {}

    def prune_destroyed(self) -> None:
        now = time.monotonic()
        self.destroyed = {c: t for c, t in self.destroyed.items() if now - t < TOMBSTONE_S}

    async def container(self, kernel_id: str) -> KernelContainer | None:
        for k in await self.runtime.list_kernels():
            if k.kernel_id == kernel_id:
                return k
        return None

    async def create(self, request: rpc.CreateKernel) -> rpc.KernelCreated:
        kernel_id = request.kernel_id
        check_id(kernel_id, "kernel_id")
        check_id(request.session_id, "session_id")
        async with self.locks.hold(kernel_id):
            existing = await self.container(kernel_id)
            if existing is not None and existing.exit is None and not existing.running:
                # Never started (an agent that died between create and start) or paused: not
                # the kernel's running container, and it would be forever: made again.
                log.warning(
                    "agent %s: kernel %s has a container that is not running (%s): replacing it",
                    self.agent_id,
                    kernel_id,
                    existing.container_id[:12],
                )
                await self.destroy_locked(kernel_id)
                existing = None
            asked_wall = time.time()  # the label's, taken with the memory's
            if request.seq:
                self.spares.asked(kernel_id, request.seq)
            if existing is not None:
                self.spares.recalled.add(existing.container_id)  # labels keep the first create's
                return rpc.KernelCreated(
                    container_id=existing.container_id, existed=True, ports=ports_of(existing)
                )
            if not request.seq:  # a new container: nothing of an earlier one's is spared
                self.spares.forget(kernel_id)
            res = request.resources
            gpus = whole_gpus(res)
            await self.room.wait_for(kernel_id, res)
            gpu_ids = self.room.pick_gpus(kernel_id, gpus)
            # Reserved before the create: a concurrent create sees it, and an exit reported
            # while the create returns frees it.
            self.room.reserve(kernel_id, res, gpu_ids)
            if request.spec.mounts:
                self.volume_names.changed()
            try:
                container_id = await self.runtime.create(
                    kernel_id,
                    request.session_id,
                    request.image,
                    res.cpu,
                    res.mem,
                    container_spec(request, gpu_ids, asked_wall),
                )
            except KernelExists as e:
                self.room.release(kernel_id)
                return rpc.KernelCreated(container_id=e.container_id, existed=True)
            except ImageMissing as e:
                self.room.release(kernel_id)
                await self.record_missing(request.image)
                raise rpc.RequestError(rpc.IMAGE_MISSING, e.reason) from None
            except KernelCreateError as e:
                self.room.release(kernel_id)
                raise rpc.RequestError("create-failed", e.reason) from None
            except ValueError as e:
                self.room.release(kernel_id)
                raise rpc.RequestError("invalid-request", f"resources: {e}") from None
            except BaseException:
                self.room.release(kernel_id)
                raise
            self.spares.recalled.add(container_id)  # its labels say what memory says
            self.image_gc.used(request.image)
            made = await self.container(kernel_id)
            ports = ports_of(made) if made is not None else []
            return rpc.KernelCreated(container_id=container_id, ports=ports)

    async def record_missing(self, image: str) -> None:
        """The log says this agent holds ``image`` but the engine has it no more (removed
        outside Hoist): record ImageRemoved before the manager hears of it, so it stops
        placing kernels here as if it were (best effort: the reply goes anyway).  Not when a
        pull of it is running or brought it back meanwhile: its ImagePulled says so."""
        try:
            if image in self.pulls.active or await self.runtime.has_image(image) is not None:
                return
            await self.facts.image_removed(canonical_or_same(image), MISSING_AT_CREATE)
        except Exception as e:
            log.warning("agent %s: could not record %s gone (%r)", self.agent_id, image, e)

    async def destroy_kernel(self, request: rpc.DestroyKernel) -> rpc.KernelDestroyed:
        return rpc.KernelDestroyed(destroyed=await self.destroy(request.kernel_id))

    async def destroy(self, kernel_id: str) -> bool:
        async with self.locks.hold(kernel_id):
            return await self.destroy_locked(kernel_id)

    async def destroy_locked(self, kernel_id: str) -> bool:
        """Destroy the kernel's container (its lock held)."""
        # Which container goes, so that an exit reported for it later (the kill's die event
        # can come after the destroy returned) is never recorded.
        k = await self.container(kernel_id)
        if k is not None:
            self.destroyed[k.container_id] = time.monotonic()
        self.terminating.add(kernel_id)
        try:
            return await self.runtime.destroy(kernel_id)
        finally:
            self.terminating.discard(kernel_id)
            self.room.release(kernel_id)
            self.spares.forget(kernel_id)


def container_spec(
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
        home_files=tuple(HomeFile(f.path, f.content, f.mode) for f in request.dotfiles),
    )


def ports_of(k: KernelContainer) -> list[ev.PublishedPort]:
    return [ev.PublishedPort(port=p.port, host=p.host, host_port=p.host_port) for p in k.ports]


def check_id(value: str, field: str) -> None:
    try:
        check_token(value, field)
    except ValueError as e:
        raise rpc.RequestError("invalid-request", str(e)) from None
