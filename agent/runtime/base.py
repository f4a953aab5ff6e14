"""What the agent process drives: pull images and run kernel containers on one host.

Two implementations: ``DockerRuntime`` (a real Docker Engine) and ``DummyRuntime`` (simulated,
for tests and benchmarks with 100+ agents in one process). The agent owns policy (dedup,
retries, timeouts, stall deadlines); a runtime does one thing at a time and says precisely why it
failed. A pull is aborted by cancelling the task awaiting it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

# Container labels: which kernel/session a container runs, which agent owns it.
LABEL_KERNEL = "hoist.kernel"
LABEL_SESSION = "hoist.session"
LABEL_AGENT = "hoist.agent"
# What a container was given, so a restarted agent counts it against its capacity again.
LABEL_CPU = "hoist.cpu"
LABEL_MEM = "hoist.mem"

DEFAULT_COMMAND: tuple[str, ...] = ("sleep", "infinity")


@dataclass(frozen=True)
class PullProgress:
    """One layer's download state. ``current`` never decreases for a layer and ends at ``total``
    once the layer is downloaded; ``total`` is 0 while unknown (or for a layer already present)."""

    image: str
    layer: str
    status: str  # the runtime's wording: "Downloading", "Download complete", "Pull complete", ...
    current: int
    total: int


@dataclass(frozen=True)
class PulledImage:
    image: str  # the reference as asked for, e.g. "127.0.0.1:5000/hoist/big:1"
    digest: str  # "sha256:..." of the manifest (the repo digest); the image id if none
    size_bytes: int  # unpacked size on the host


@dataclass(frozen=True)
class KernelContainer:
    kernel_id: str
    session_id: str
    container_id: str
    image: str
    running: bool
    cpu: float = 0.0  # cores it was given
    mem_bytes: int = 0


@dataclass(frozen=True)
class Capacity:
    cpu: float
    mem_bytes: int
    disk_bytes: int


@dataclass
class ImageProgress:
    """Per-image sums of per-layer progress (fold PullProgress into it): what the agent reports."""

    layers: dict[str, PullProgress] = field(default_factory=dict)

    def add(self, p: PullProgress) -> None:
        self.layers[p.layer] = p

    @property
    def current(self) -> int:
        return sum(p.current for p in self.layers.values())

    @property
    def total(self) -> int:
        return sum(p.total for p in self.layers.values())


class PullError(Exception):
    """A pull failed; ``reason`` is a short text for ImagePullFailed."""

    retryable = False

    def __init__(self, image: str, reason: str) -> None:
        super().__init__(f"pull of {image} failed: {reason}")
        self.image = image
        self.reason = reason


class ImageNotFound(PullError):
    """The registry has no such repository or tag: permanent, never retry."""


class Unauthorized(PullError):
    """The registry refused the credentials (or wants some): permanent, fix the config."""


class TransientPullError(PullError):
    """Network trouble, registry 5xx, a broken stream: worth retrying with backoff."""

    retryable = True


class KernelCreateError(Exception):
    """A container could not be created or started; ``reason`` says why."""

    def __init__(self, kernel_id: str, reason: str) -> None:
        super().__init__(f"kernel {kernel_id}: {reason}")
        self.kernel_id = kernel_id
        self.reason = reason


class KernelExists(KernelCreateError):
    """This agent already has a container for the kernel (a repeated create)."""

    def __init__(self, kernel_id: str, container_id: str) -> None:
        super().__init__(kernel_id, f"already has container {container_id}")
        self.container_id = container_id


class ImageInUse(Exception):
    """remove_image refused: a container still uses the image."""

    def __init__(self, image: str, detail: str) -> None:
        super().__init__(f"image {image} is in use: {detail}")
        self.image = image


ProgressCallback = Callable[[PullProgress], None]


def validate_create(kernel_id: str, session_id: str, cpu: float, mem_bytes: int) -> None:
    """What every runtime checks before it creates a container (ValueError naming the field)."""
    if not kernel_id or not session_id:
        raise ValueError("kernel_id and session_id must be non-empty")
    if not cpu > 0:
        raise ValueError(f"cpu must be > 0 (cores), got {cpu!r}")
    if mem_bytes < 6 * 1024 * 1024:  # Docker's minimum memory limit
        raise ValueError(f"mem_bytes must be at least 6 MiB (6291456), got {mem_bytes!r}")


class Runtime(Protocol):
    """The agent's view of a host. All methods run on the event loop and never block it."""

    async def capacity(self) -> Capacity: ...

    async def pull(
        self, image: str, on_progress: ProgressCallback, auth: dict[str, str] | None = None
    ) -> PulledImage:
        """Download ``image``; ``on_progress`` is called on the loop thread, per layer update.

        Raises ImageNotFound / Unauthorized (permanent) or TransientPullError. Cancel the task to
        abort (a stalled pull): the download stops and CancelledError propagates.
        ``auth`` is a docker auth config: {"username", "password"} (+ "serveraddress").
        """
        ...

    async def has_image(self, image: str) -> PulledImage | None: ...

    async def list_images(self) -> list[PulledImage]: ...

    async def remove_image(self, image: str) -> bool:
        """True if removed, False if absent; raises ImageInUse if a container uses it."""
        ...

    async def create(
        self,
        kernel_id: str,
        session_id: str,
        image: str,
        cpu: float,
        mem_bytes: int,
        command: Sequence[str] | None = None,
    ) -> str:
        """Start a container for the kernel (``command`` defaults to sleeping forever); returns
        its id. Raises ValueError for bad resources, KernelExists, KernelCreateError."""
        ...

    async def destroy(self, kernel_id: str) -> bool:
        """Kill and remove the kernel's container; True if there was one."""
        ...

    async def list_kernels(self) -> list[KernelContainer]:
        """This agent's kernel containers, running or not (for sync and after a restart)."""
        ...

    async def close(self) -> None: ...
