"""A simulated runtime: no threads, no I/O, only asyncio sleeps, so 100+ agents fit in one process.

Images have configured sizes (split into layers), pulls advance at a bandwidth in ticks, creates
take a delay; randomness (bandwidth jitter, failure rates) comes from one seeded random.Random so
a benchmark run can be repeated. Failures are injected per image or by rate.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from agent.runtime.base import (
    Capacity,
    ImageInUse,
    ImageNotFound,
    KernelContainer,
    KernelCreateError,
    KernelExists,
    ProgressCallback,
    PulledImage,
    PullError,
    PullProgress,
    TransientPullError,
    Unauthorized,
    validate_create,
)

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

    def __post_init__(self) -> None:
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
    kernels: dict[str, KernelContainer] = field(default_factory=dict)


def _digest(image: str) -> str:
    return "sha256:" + hashlib.sha256(image.encode()).hexdigest()


class DummyRuntime:
    def __init__(
        self, agent_id: str, config: DummyConfig | None = None, host: DummyHost | None = None
    ) -> None:
        self.agent_id = agent_id
        self.config = config or DummyConfig()
        self.rng = random.Random(self.config.seed)
        self.host = host or DummyHost()
        self.images = self.host.images
        self.kernels = self.host.kernels
        self.pull_attempts: dict[str, int] = {}  # for tests: how often each image was pulled
        for image in self.config.preloaded - self.images.keys():
            self.images[image] = PulledImage(image, _digest(image), self._size(image) or 0)

    def _size(self, image: str) -> int | None:
        return self.config.image_sizes.get(image, self.config.default_size)

    async def capacity(self) -> Capacity:
        return self.config.capacity

    def _layer_sizes(self, size: int) -> list[int]:
        n = self.config.layers
        return [size // n + (size % n if i == 0 else 0) for i in range(n)]

    async def pull(
        self, image: str, on_progress: ProgressCallback, auth: dict[str, str] | None = None
    ) -> PulledImage:
        if not image:
            raise ValueError("image must be a non-empty reference")
        attempt = self.pull_attempts[image] = self.pull_attempts.get(image, 0) + 1
        size = self._size(image)
        if size is None:
            raise ImageNotFound(image, f"manifest for {image} not found: manifest unknown")
        failure = self.config.pull_failures.get(image)
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
        pulled = PulledImage(image, _digest(image), size)
        self.images[image] = pulled
        return pulled

    async def has_image(self, image: str) -> PulledImage | None:
        return self.images.get(image)

    async def list_images(self) -> list[PulledImage]:
        return list(self.images.values())

    async def remove_image(self, image: str) -> bool:
        if any(k.image == image for k in self.kernels.values()):
            raise ImageInUse(image, "a kernel container uses it")
        return self.images.pop(image, None) is not None

    async def create(
        self,
        kernel_id: str,
        session_id: str,
        image: str,
        cpu: float,
        mem_bytes: int,
        command: Sequence[str] | None = None,
    ) -> str:
        validate_create(kernel_id, session_id, cpu, mem_bytes)
        if kernel_id in self.kernels:
            raise KernelExists(kernel_id, self.kernels[kernel_id].container_id)
        if image not in self.images:
            raise KernelCreateError(kernel_id, f"image {image} is not on this host: pull it")
        await asyncio.sleep(self.config.create_delay_s)
        if image in self.config.create_failures or (
            self.config.create_failure_rate and self.rng.random() < self.config.create_failure_rate
        ):
            raise KernelCreateError(kernel_id, "injected create failure")
        if kernel_id in self.kernels:  # a concurrent create won during the delay
            raise KernelExists(kernel_id, self.kernels[kernel_id].container_id)
        container_id = f"{self.rng.getrandbits(256):064x}"
        self.kernels[kernel_id] = KernelContainer(
            kernel_id, session_id, container_id, image, running=True, cpu=cpu, mem_bytes=mem_bytes
        )
        return container_id

    async def destroy(self, kernel_id: str) -> bool:
        if kernel_id not in self.kernels:
            return False
        await asyncio.sleep(self.config.destroy_delay_s)
        return self.kernels.pop(kernel_id, None) is not None

    async def list_kernels(self) -> list[KernelContainer]:
        return list(self.kernels.values())

    async def close(self) -> None:
        pass
