"""A simulated runtime: no threads, no I/O, only asyncio sleeps, so 100+ agents fit in one process.

Images have configured sizes (split into layers), pulls advance at a bandwidth in ticks, creates
take a delay; randomness (bandwidth jitter, failure rates) comes from one seeded random.Random so
a benchmark run can be repeated. Failures are injected per image or by rate.

A kernel runs its command through agent.runtime.dummy_shell (``sleep``, ``echo``, ``exit``,
``sh -c 'a; b'``; None runs until destroyed); its end is an ExitInfo pushed to watch_exits.
Logs, execs, published ports (host ports from a counter) and volumes are simulated; with
``output_bps`` every running kernel writes lines at that rate (one task for all of them).

The host (images, containers, volumes) lives in memory, or with ``state_file`` also on disk
(agent.runtime.dummy_state): a restarted agent finds it as it was, as a docker agent finds the
Docker Engine's, whose containers ran on while the agent was away: a kernel's command goes on
from where it would be now (agent.runtime.dummy_shell.Replay).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import posixpath
import random
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, TypeVar

from agent.runtime import dummy_state
from agent.runtime.base import (
    Capacity,
    ContainerSpec,
    ExecRun,
    ExitCallback,
    ExitInfo,
    Filesystem,
    ImageInUse,
    ImageMissing,
    ImageNotFound,
    KernelContainer,
    KernelCreateError,
    KernelExists,
    KernelNotFound,
    ProgressCallback,
    Published,
    PulledImage,
    PullError,
    PullProgress,
    TransientPullError,
    Unauthorized,
    Volume,
    VolumeInUse,
    validate_create,
)
from agent.runtime.dummy_shell import DEFAULT_HOME, Files, Output, Replay, Step, parse, run
from domain.image_ref import canonical_or_same, familiar

_V = TypeVar("_V")

FailureKind = Literal["not-found", "unauthorized", "transient", "stall"]
_ERRORS: dict[str, type[PullError]] = {
    "not-found": ImageNotFound,
    "unauthorized": Unauthorized,
    "transient": TransientPullError,
}


@dataclass(frozen=True)
class PullFailure:
    """How pulls of one image fail: ``kind``; ``times`` = only the first N attempts (None: all).
    A stall hangs after ``stall_at`` of the bytes until the pull is cancelled."""

    kind: FailureKind
    reason: str = "injected failure"
    times: int | None = None
    stall_at: float = 0.5

    def __post_init__(self) -> None:
        if self.kind not in (*_ERRORS, "stall"):
            raise ValueError(f"PullFailure.kind must be one of {[*_ERRORS, 'stall']}")


@dataclass
class DummyConfig:
    image_sizes: dict[str, int] = field(default_factory=dict)
    # Size of images not in image_sizes; None: such images are not found in the "registry".
    default_size: int | None = 100 * 1024 * 1024
    layers: int = 3
    bandwidth_bps: float | None = 100 * 1024 * 1024  # None: pulls are instant
    jitter: float = 0.0  # bandwidth varies by +-jitter (fraction), per pull
    tick_s: float = 0.1  # progress granularity
    create_delay_s: float = 0.0
    destroy_delay_s: float = 0.0
    seed: int | None = None
    pull_failures: dict[str, PullFailure] = field(default_factory=dict)
    pull_failure_rate: float = 0.0  # transient failures at random
    create_failures: set[str] = field(default_factory=set)  # images whose creates fail
    create_failure_rate: float = 0.0
    preloaded: set[str] = field(default_factory=set)
    capacity: Capacity = field(default_factory=lambda: Capacity(8.0, 32 * 1024**3, 500 * 1024**3))
    slots: dict[str, float] = field(default_factory=dict)  # the host's devices, e.g. {"gpu": 2}
    output_bps: float = 0.0  # every running kernel writes lines at this rate (0: only its own)
    log_limit_bytes: int = 256 * 1024  # output kept per kernel or exec (the oldest is dropped)

    def __post_init__(self) -> None:
        if self.output_bps < 0:
            raise ValueError("output_bps must be >= 0")
        if self.log_limit_bytes < 1:
            raise ValueError("log_limit_bytes must be >= 1")
        if self.bandwidth_bps is not None and self.bandwidth_bps <= 0:
            raise ValueError("bandwidth_bps must be > 0 (or None for instant pulls)")
        if self.layers < 1:
            raise ValueError("layers must be >= 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")


@dataclass
class DummyHost:
    """What survives an agent restart: pass the same host to the restarted runtime."""

    images: dict[str, PulledImage] = field(default_factory=dict)
    kernels: dict[str, DummyKernel] = field(default_factory=dict)
    volumes: dict[str, str] = field(default_factory=dict)  # name -> owner
    next_port: int = 30000  # the last host port published
    exit_listeners: list[ExitCallback] = field(default_factory=list)


@dataclass(eq=False)
class DummyKernel:
    """A simulated container: its process is a task running the command (None: no task)."""

    kernel_id: str
    session_id: str
    container_id: str
    image: str
    cpu: float
    mem_bytes: int
    spec: ContainerSpec
    ports: tuple[Published, ...]
    out: Output
    started: float = field(default_factory=lambda: asyncio.get_running_loop().time())
    started_at: float = field(default_factory=time.time)  # the same instant, unix time
    task: asyncio.Task[None] | None = None
    exit: ExitInfo | None = None
    execs: set[DummyExec] = field(default_factory=set)
    lines: int = 0  # lines written at DummyConfig.output_bps
    # Set by tests: not running, yet no exit (a container created but never started, or paused).
    stopped: bool = False
    # The last container(), kept while its running and exit still hold: the agent lists every
    # kernel at each heartbeat, and a process simulating hundreds of hosts spent a third of its
    # time building the same snapshots again (bench/lifecycle.py --scale).
    _snapshot: KernelContainer | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.exit is None and not self.stopped

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """What its processes see: HOME as Docker sets it (root's unless given), the spec's."""
        return {"HOME": DEFAULT_HOME, **self.spec.env, **(extra or {})}

    def files(self) -> Files:
        """Its simulated filesystem: its dotfiles (spec.home_files) in its home."""
        home = self.env().get("HOME") or DEFAULT_HOME
        return Files(home, {posixpath.join(home, f.path): f.content for f in self.spec.home_files})

    def container(self) -> KernelContainer:
        snap = self._snapshot
        if snap is None or snap.running != self.running or snap.exit != self.exit:
            self._snapshot = snap = self._container()
        return snap

    def _container(self) -> KernelContainer:
        return KernelContainer(
            self.kernel_id,
            self.session_id,
            self.container_id,
            canonical_or_same(self.image),
            running=self.running,
            cpu=self.cpu,
            mem_bytes=self.mem_bytes,
            slots=dict(self.spec.slots),
            gpu_ids=tuple(self.spec.gpu_ids),  # as the docker runtime's hoist.gpus label
            ports=self.ports,
            exit=self.exit,
            asked_seq=self.spec.asked_seq,  # and its hoist.asked-seq / hoist.asked-at labels
            asked_at=self.spec.asked_at,
        )


def _engine_name(image: str) -> str:
    """How a Docker Engine names an image it holds: Docker Hub's short form (``python:latest``),
    whatever it was asked as; the runtime hands the agent canonical names, as the docker one."""
    return familiar(canonical_or_same(image))


def _configured(table: Mapping[str, _V] | set[str], image: str) -> _V | bool | None:
    """What the config says of ``image``, whichever way the config spells it."""
    name = _engine_name(image)
    for key in table:
        if _engine_name(key) == name:
            return True if isinstance(table, set) else table[key]
    return None


def _canonical(image: PulledImage) -> PulledImage:
    return replace(image, image=canonical_or_same(image.image))


def _digest(image: str) -> str:
    return "sha256:" + hashlib.sha256(image.encode()).hexdigest()


class DummyRuntime:
    def __init__(
        self,
        agent_id: str,
        config: DummyConfig | None = None,
        host: DummyHost | None = None,
        address: str = "127.0.0.1",
        state_file: Path | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.address = address  # where published ports are "reachable"
        self._listeners: list[ExitCallback] = []  # this runtime's, dropped at close
        self._ticker: asyncio.Task[None] | None = None
        self.execs: list[list[str]] = []  # for tests: every command exec'd
        self.volume_listings = 0  # for tests: volume_names calls
        self.config = config or DummyConfig()
        self.rng = random.Random(self.config.seed)
        self.state_file = state_file
        saved = dummy_state.load(state_file) if state_file and host is None else None
        self.host = host or DummyHost()
        self.images = self.host.images
        self.kernels = self.host.kernels
        self.pull_attempts: dict[str, int] = {}  # for tests: how often each image was pulled
        if saved is not None:
            self._restore(saved)
        for image in map(_engine_name, self.config.preloaded):
            if image not in self.images:
                self.images[image] = PulledImage(image, _digest(image), self._size(image) or 0)
        self._save()

    # -- the host on disk (state_file) -----------------------------------------------------------

    def _restore(self, saved: dummy_state.SavedHost) -> None:
        # Keyed as the engine names them (a file saved before canonical names holds others).
        for i in saved.images:
            name = _engine_name(i.image)
            self.images[name] = replace(i, image=name)
        self.host.volumes.update(saved.volumes)
        self.host.next_port = max(self.host.next_port, saved.next_port)
        now = time.time()
        for k in saved.kernels:
            out = Output(self.config.log_limit_bytes)
            out.data, out.start = bytearray(k.log), k.log_start
            ran_s = max(0.0, now - k.started_at)
            kernel = DummyKernel(
                **{name: getattr(k, name) for name in dummy_state.KERNEL_FIELDS},
                out=out,
                started=asyncio.get_running_loop().time() - ran_s,
            )
            self.kernels[k.kernel_id] = kernel
            if k.exit is not None:
                out.close()
            elif k.spec.command is not None and not k.stopped:
                # Its process ran on while the agent was away: on from where it is now.
                replay = Replay(ran_s, quiet_s=k.saved_at - k.started_at)
                steps = parse(k.spec.command, kernel.env())
                kernel.task = asyncio.get_running_loop().create_task(
                    self._run(kernel, steps, replay)
                )
        if self.kernels:
            self._ensure_ticker()

    def _save(self) -> None:
        if self.state_file is None:
            return
        now = time.time()
        saved = dummy_state.SavedHost(
            images=list(self.images.values()),
            kernels=[
                dummy_state.SavedKernel(
                    **{name: getattr(k, name) for name in dummy_state.KERNEL_FIELDS},
                    log=bytes(k.out.data),
                    log_start=k.out.start,
                    saved_at=now,
                )
                for k in self.kernels.values()
            ],
            volumes=dict(self.host.volumes),
            next_port=self.host.next_port,
        )
        dummy_state.save(self.state_file, saved)

    def _size(self, image: str) -> int | None:
        size = _configured(self.config.image_sizes, image)
        return self.config.default_size if size is None else int(size)

    async def capacity(self) -> Capacity:
        return self.config.capacity

    async def filesystem(self) -> Filesystem | None:
        return None  # simulated: image GC counts the images' sizes against --disk

    def _layer_sizes(self, size: int) -> list[int]:
        n = self.config.layers
        return [size // n + (size % n if i == 0 else 0) for i in range(n)]

    async def pull(
        self, image: str, on_progress: ProgressCallback, auth: dict[str, str] | None = None
    ) -> PulledImage:
        if not image:
            raise ValueError("image must be a non-empty reference")
        name = _engine_name(image)
        attempt = self.pull_attempts[name] = self.pull_attempts.get(name, 0) + 1
        size = self._size(image)
        if size is None:
            raise ImageNotFound(image, f"manifest for {image} not found: manifest unknown")
        failure = _configured(self.config.pull_failures, image)
        assert failure is None or isinstance(failure, PullFailure)
        if failure and failure.times is not None and attempt > failure.times:
            failure = None
        if failure is None and self.rng.random() < self.config.pull_failure_rate:
            failure = PullFailure("transient", "injected random failure", stall_at=0.5)
        cfg = self.config
        bandwidth = cfg.bandwidth_bps
        if bandwidth is not None and cfg.jitter:
            bandwidth *= 1 + self.rng.uniform(-cfg.jitter, cfg.jitter)
        step = max(1, int(bandwidth * cfg.tick_s)) if bandwidth is not None else None
        fail_at = int(size * failure.stall_at) if failure else None
        done = 0
        layers = [
            (f"{hashlib.sha256(f'{image}/{i}'.encode()).hexdigest()[:12]}", layer_size)
            for i, layer_size in enumerate(self._layer_sizes(size))
        ]
        # Announce every layer with its size first (Docker announces them too, sizes later), so
        # a progress view knows the whole pull from the start and its percentage never drops.
        for layer, layer_size in layers:
            on_progress(PullProgress(image, layer, "Waiting", 0, layer_size))
        for layer, layer_size in layers:
            current = 0
            while current < layer_size:
                chunk = layer_size - current if step is None else min(step, layer_size - current)
                if fail_at is not None and failure is not None and done + chunk >= fail_at:
                    current += fail_at - done
                    on_progress(PullProgress(image, layer, "Downloading", current, layer_size))
                    if failure.kind == "stall":
                        await asyncio.Event().wait()  # until cancelled
                    raise _ERRORS[failure.kind](image, failure.reason)
                # Sleep for this chunk (zero when instant), then report it.
                await asyncio.sleep(0 if bandwidth is None else chunk / bandwidth)
                current += chunk
                done += chunk
                on_progress(PullProgress(image, layer, "Downloading", current, layer_size))
            on_progress(PullProgress(image, layer, "Pull complete", layer_size, layer_size))
        pulled = self.images[name] = PulledImage(name, _digest(name), size)
        self._save()
        return _canonical(pulled)

    async def has_image(self, image: str) -> PulledImage | None:
        held = self.images.get(_engine_name(image))
        return None if held is None else _canonical(held)

    async def list_images(self) -> list[PulledImage]:
        return [_canonical(i) for i in self.images.values()]

    async def remove_image(self, image: str) -> bool:
        name = _engine_name(image)
        if any(_engine_name(k.image) == name for k in self.kernels.values()):
            raise ImageInUse(image, "a kernel container uses it")
        removed = self.images.pop(name, None) is not None
        self._save()
        return removed

    # -- kernels -------------------------------------------------------------------------------

    async def create(
        self,
        kernel_id: str,
        session_id: str,
        image: str,
        cpu: float,
        mem_bytes: int,
        spec: ContainerSpec | None = None,
    ) -> str:
        validate_create(kernel_id, session_id, cpu, mem_bytes)
        spec = spec or ContainerSpec()
        if kernel_id in self.kernels:
            raise KernelExists(kernel_id, self.kernels[kernel_id].container_id)
        if _engine_name(image) not in self.images:
            raise ImageMissing(kernel_id, image)
        await asyncio.sleep(self.config.create_delay_s)
        if _configured(self.config.create_failures, image) or (
            self.config.create_failure_rate and self.rng.random() < self.config.create_failure_rate
        ):
            raise KernelCreateError(kernel_id, "injected create failure")
        if kernel_id in self.kernels:  # a concurrent create won during the delay
            raise KernelExists(kernel_id, self.kernels[kernel_id].container_id)
        wants_gpu = spec.slots.get("gpu", 0) > 0 or bool(spec.gpu_ids)
        if wants_gpu and self.config.slots.get("gpu", 0) <= 0:
            # What Docker says when a device request finds no driver.
            raise KernelCreateError(
                kernel_id, 'could not select device driver "" with capabilities: [[gpu]]'
            )
        for mount in spec.mounts:
            owner = self.host.volumes.get(mount.volume)
            if owner is not None and owner != spec.owner:
                raise KernelCreateError(
                    kernel_id, f"volume {mount.volume} belongs to another owner"
                )
        for mount in spec.mounts:
            self.host.volumes.setdefault(mount.volume, spec.owner)  # saved with the kernel
        ports = []
        for port in spec.ports:
            self.host.next_port += 1
            ports.append(Published(port, self.address, self.host.next_port))
        kernel = DummyKernel(
            kernel_id=kernel_id,
            session_id=session_id,
            container_id=f"{self.rng.getrandbits(256):064x}",
            image=image,
            cpu=cpu,
            mem_bytes=mem_bytes,
            spec=spec,
            ports=tuple(ports),
            out=Output(self.config.log_limit_bytes),
        )
        self.kernels[kernel_id] = kernel
        if spec.command is not None:
            steps = parse(spec.command, kernel.env())
            kernel.task = asyncio.get_running_loop().create_task(self._run(kernel, steps))
        self._ensure_ticker()
        self._save()
        return kernel.container_id

    async def _run(
        self, kernel: DummyKernel, steps: list[Step], replay: Replay | None = None
    ) -> None:
        code = await run(steps, kernel.out.write, kernel.env(), replay, kernel.files())
        loop = asyncio.get_running_loop()
        ran_s = loop.time() - kernel.started
        if replay is not None and replay.t < replay.ran_s:  # it ended while the agent was away
            ran_s = replay.t
        kernel.exit = ExitInfo(
            exit_code=code,
            ran_s=round(ran_s, 6),
            finished_at=min(time.time(), kernel.started_at + ran_s),
        )
        kernel.out.close()
        self._save()
        for run_ in list(kernel.execs):
            await run_.kill()  # they die with the container
        container = kernel.container()
        for callback in list(self.host.exit_listeners):
            loop.call_soon(callback, container)

    async def destroy(self, kernel_id: str) -> bool:
        if kernel_id not in self.kernels:
            return False
        await asyncio.sleep(self.config.destroy_delay_s)
        kernel = self.kernels.pop(kernel_id, None)
        if kernel is None:
            return False
        if kernel.task is not None:
            kernel.task.cancel()  # removed, not ended: no exit is reported
        for run_ in list(kernel.execs):
            await run_.kill()
        kernel.out.close()
        self._save()
        return True

    async def list_kernels(self) -> list[KernelContainer]:
        return [k.container() for k in self.kernels.values()]

    def watch_exits(self, on_exit: ExitCallback) -> None:
        self.host.exit_listeners.append(on_exit)
        self._listeners.append(on_exit)

    def _kernel(self, kernel_id: str) -> DummyKernel:
        kernel = self.kernels.get(kernel_id)
        if kernel is None:
            raise KernelNotFound(kernel_id)
        return kernel

    def logs(self, kernel_id: str, tail: int | None, follow: bool) -> AsyncIterator[bytes]:
        out = self._kernel(kernel_id).out  # raises now, not at the first read
        return out.read(out.tail_offset(tail), follow)

    async def exec(
        self,
        kernel_id: str,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecRun:
        kernel = self._kernel(kernel_id)
        if not kernel.running:
            raise KernelCreateError(kernel_id, f"container {kernel.container_id} is not running")
        run_ = DummyExec(
            parse(command, kernel.env(env)),
            kernel.env(env),
            self.config.log_limit_bytes,
            kernel.files(),
        )
        kernel.execs.add(run_)
        run_.task.add_done_callback(lambda _: kernel.execs.discard(run_))
        self.execs.append(list(command))
        return run_

    # -- volumes -------------------------------------------------------------------------------

    def _users(self, volume: str) -> tuple[str, ...]:
        return tuple(
            sorted(
                k.kernel_id
                for k in self.kernels.values()
                if any(m.volume == volume for m in k.spec.mounts)
            )
        )

    async def list_volumes(self) -> list[Volume]:
        return [Volume(name, owner, self._users(name)) for name, owner in self.host.volumes.items()]

    async def volume_names(self) -> list[str]:
        self.volume_listings += 1
        return sorted(self.host.volumes)

    async def remove_volume(self, name: str) -> bool:
        if name not in self.host.volumes:
            return False
        if users := self._users(name):
            raise VolumeInUse(name, users)
        del self.host.volumes[name]
        self._save()
        return True

    # -- output at a rate (DummyConfig.output_bps) ----------------------------------------------

    def _ensure_ticker(self) -> None:
        if self.config.output_bps > 0 and (self._ticker is None or self._ticker.done()):
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        """One task writes every running kernel's lines (not one per kernel: 1000s of them)."""
        loop = asyncio.get_running_loop()
        last = loop.time()
        due: dict[str, float] = {}
        while True:
            await asyncio.sleep(self.config.tick_s)
            now = loop.time()
            budget = self.config.output_bps * (now - last)
            last = now
            for kernel in list(self.kernels.values()):
                if not kernel.running:
                    continue
                owed = due.get(kernel.kernel_id, 0.0) + budget
                line = f"{kernel.kernel_id} output line {kernel.lines:012d} ".ljust(79, ".")
                n = int(owed // (len(line) + 1))
                if n:
                    chunk = "".join(
                        f"{kernel.kernel_id} output line {kernel.lines + i:012d} ".ljust(79, ".")
                        + "\n"
                        for i in range(n)
                    )
                    kernel.lines += n
                    kernel.out.write(chunk.encode())
                due[kernel.kernel_id] = owed - n * (len(line) + 1)
            for kid in due.keys() - self.kernels.keys():
                del due[kid]

    async def close(self) -> None:
        for callback in self._listeners:
            with contextlib.suppress(ValueError):
                self.host.exit_listeners.remove(callback)
        self._listeners.clear()
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self._save()  # with the output written since the last change


class DummyExec:
    """A command "running" in a dummy kernel (base.ExecRun)."""

    def __init__(
        self, steps: list[Step], env: Mapping[str, str], limit: int, files: Files | None = None
    ) -> None:
        self.out = Output(limit)
        self.code: int | None = None
        self.files = files
        self.task = asyncio.get_running_loop().create_task(self._run(steps, env))

    async def _run(self, steps: list[Step], env: Mapping[str, str]) -> None:
        try:
            self.code = await run(steps, self.out.write, env, files=self.files)
        finally:
            if self.code is None:
                self.code = 137  # killed
            self.out.close()

    def output(self) -> AsyncIterator[bytes]:
        return self.out.read(0, follow=True)

    async def wait(self) -> int:
        await asyncio.wait([self.task])
        assert self.code is not None
        return self.code

    async def kill(self) -> None:
        self.task.cancel()
        await asyncio.wait([self.task])
        if self.code is None:  # cancelled before it started: its finally never ran
            self.code = 137
            self.out.close()
