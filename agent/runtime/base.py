"""What the agent process drives: pull images and run kernel containers on one host.

Two implementations: ``DockerRuntime`` (a real Docker Engine) and ``DummyRuntime`` (simulated,
for tests and benchmarks with 100+ agents in one process). The agent owns policy (dedup,
retries, timeouts, stall deadlines); a runtime does one thing at a time and says precisely why it
failed. A pull is aborted by cancelling the task awaiting it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from domain.limits import kernel_floor

# Container labels: which kernel/session a container runs, which agent owns it.
LABEL_KERNEL = "hoist.kernel"
LABEL_SESSION = "hoist.session"
LABEL_AGENT = "hoist.agent"
# What a container was given, so a restarted agent counts it against its capacity again.
LABEL_CPU = "hoist.cpu"
LABEL_MEM = "hoist.mem"
LABEL_SLOTS = "hoist.slots"  # JSON of the resource slots it was given, e.g. {"gpu": 1}
LABEL_GPUS = "hoist.gpus"  # comma-separated GPU ids the kernel was given
LABEL_OWNER = "hoist.owner"  # on volumes: whose they are
# The stream sequence its create-kernel came from and when (unix time): a restarted agent
# still spares it from a sync whose view lags behind that sequence (agent.spares).
LABEL_ASKED_SEQ = "hoist.asked-seq"
LABEL_ASKED_AT = "hoist.asked-at"

# What a kernel runs when the create names no command is the image's own entrypoint and cmd.
# The tests give kernels that must stay up this command explicitly.
SLEEP_FOREVER: tuple[str, ...] = ("sleep", "infinity")


@dataclass(frozen=True)
class VolumeMount:
    volume: str  # a named volume, created on first use, kept after the kernel
    path: str  # absolute path in the container
    read_only: bool = False


@dataclass(frozen=True)
class HomeFile:
    """A file the runtime writes into the kernel's home before its command starts (the
    owner's dotfiles, domain.dotfiles); its parent directories are made as needed."""

    path: str  # relative to the home: no leading '/', no '..' (domain.limits.DOTFILE_PATH)
    content: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class ContainerSpec:
    """What a kernel's container runs, besides its image and cpu/mem."""

    command: Sequence[str] | None = None  # argv; None: the image's entrypoint and cmd
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    ports: Sequence[int] = ()  # container ports to publish on the agent's address
    mounts: Sequence[VolumeMount] = ()
    hostname: str = "main1"  # the container's hostname; its name on the private network
    extra_hosts: Mapping[str, str] = field(default_factory=dict)  # hostname -> address
    slots: Mapping[str, float] = field(default_factory=dict)  # e.g. {"gpu": 1}
    owner: str = ""  # labels the volumes it creates; a volume of another owner is refused
    # True: the session's kernels on this agent get a network of their own where they reach
    # each other by hostname (a session of several kernels).  False: the kernel joins one
    # network the agent's single kernels share, where sessions do not reach each other.
    private_network: bool = False
    # The host's GPUs the agent gave this kernel (device indices or UUIDs): the runtime asks
    # the engine for exactly these, so two kernels never share one.
    gpu_ids: tuple[str, ...] = ()
    # The stream sequence the create-kernel came from and its unix time (0: none given),
    # kept with the container (LABEL_ASKED_SEQ, LABEL_ASKED_AT).
    asked_seq: int = 0
    asked_at: float = 0.0
    home_files: tuple[HomeFile, ...] = ()  # written into the home before the command starts


@dataclass(frozen=True, order=True)  # listed in order: port, host, host_port
class Published:
    port: int  # in the container
    host: str
    host_port: int


@dataclass(frozen=True)
class ExitInfo:
    """How a kernel's process ended (exit code 128+N: killed by signal N)."""

    exit_code: int
    oom_killed: bool = False
    ran_s: float = 0.0  # from start to end
    finished_at: float = 0.0  # unix time


@dataclass(frozen=True)
class Volume:
    name: str
    owner: str
    used_by: tuple[str, ...] = ()  # kernel ids whose containers mount it


class ExecRun(Protocol):
    """A command running in a kernel's container."""

    def output(self) -> AsyncIterator[bytes]:
        """Its stdout and stderr as written, chunk by chunk, until it ends."""
        ...

    async def wait(self) -> int:
        """Its exit code, once it ended."""
        ...

    async def kill(self) -> None: ...


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
    slots: Mapping[str, float] = field(default_factory=dict)
    gpu_ids: tuple[str, ...] = ()  # the GPUs it was given (a label), for a restarted agent
    ports: tuple[Published, ...] = ()
    exit: ExitInfo | None = None  # set once the process ended (running False)
    asked_seq: int = 0  # as ContainerSpec's, read back (0: none, or an unreadable label)
    asked_at: float = 0.0


@dataclass(frozen=True)
class Capacity:
    cpu: float
    mem_bytes: int
    disk_bytes: int


@dataclass(frozen=True)
class Filesystem:
    """The filesystem the engine keeps its images on, as ``statvfs`` measures it."""

    path: str  # e.g. the Docker Engine's root dir, /var/lib/docker
    total: int  # bytes
    available: int  # bytes an unprivileged writer may still use (f_bavail)


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


class ImageMissing(KernelCreateError):
    """The image is not on this host (removed since the manager last heard of it): nothing was
    created; check-and-pull brings it back."""

    def __init__(self, kernel_id: str, image: str) -> None:
        super().__init__(kernel_id, f"image {image} is not on this host: pull it")
        self.image = image


class KernelExists(KernelCreateError):
    """This agent already has a container for the kernel (a repeated create)."""

    def __init__(self, kernel_id: str, container_id: str) -> None:
        super().__init__(kernel_id, f"already has container {container_id}")
        self.container_id = container_id


class KernelNotFound(Exception):
    """This agent has no container for the kernel."""

    def __init__(self, kernel_id: str) -> None:
        super().__init__(f"no container for kernel {kernel_id} on this agent")
        self.kernel_id = kernel_id


class VolumeInUse(Exception):
    """remove_volume refused: a container mounts it."""

    def __init__(self, name: str, kernels: Sequence[str]) -> None:
        super().__init__(f"volume {name} is mounted by kernels {', '.join(kernels)}")
        self.name = name


class ImageInUse(Exception):
    """remove_image refused: a container still uses the image."""

    def __init__(self, image: str, detail: str) -> None:
        super().__init__(f"image {image} is in use: {detail}")
        self.image = image


ProgressCallback = Callable[[PullProgress], None]
ExitCallback = Callable[[KernelContainer], None]  # a kernel's process ended (``exit`` is set)


def validate_create(kernel_id: str, session_id: str, cpu: float, mem_bytes: int) -> None:
    """What every runtime checks before it creates a container (ValueError naming the field)."""
    if not kernel_id or not session_id:
        raise ValueError("kernel_id and session_id must be non-empty")
    if (floor := kernel_floor(cpu, mem_bytes)) is not None:  # the session door's rule too
        key, why = floor
        raise ValueError(f"{key}: {why}")


class Runtime(Protocol):
    """The agent's view of a host. All methods run on the event loop and never block it."""

    async def capacity(self) -> Capacity: ...

    async def filesystem(self) -> Filesystem | None:
        """Where the engine's images are, measured now; None where this host cannot measure it
        (a remote engine, a simulated one): image GC then counts the images against --disk."""
        ...

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
        spec: ContainerSpec | None = None,
    ) -> str:
        """Start a container for the kernel; returns its id (``list_kernels`` tells its
        published ports). Raises ValueError for bad resources, KernelExists, KernelCreateError
        (with the engine's own reason, e.g. no driver for a ``gpu`` slot)."""
        ...

    async def destroy(self, kernel_id: str) -> bool:
        """Kill and remove the kernel's container; True if there was one."""
        ...

    async def list_kernels(self) -> list[KernelContainer]:
        """This agent's kernel containers, running or not (for sync and after a restart);
        an ended one carries its ``exit``."""
        ...

    def watch_exits(self, on_exit: ExitCallback) -> None:
        """Call ``on_exit`` (on the loop) soon after a kernel's process ends, once per end.
        The agent also polls ``list_kernels``, so a missed call only delays the report."""
        ...

    def logs(self, kernel_id: str, tail: int | None, follow: bool) -> AsyncIterator[bytes]:
        """The container's output (the last ``tail`` lines, None: all); with ``follow``, then
        what it writes until it ends.  Raises KernelNotFound.  Closing the iterator stops it."""
        ...

    async def exec(
        self,
        kernel_id: str,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecRun:
        """Start ``command`` in the kernel's running container. Raises KernelNotFound, or
        KernelCreateError when it cannot start (e.g. the container is not running)."""
        ...

    async def list_volumes(self) -> list[Volume]: ...

    async def volume_names(self) -> list[str]:
        """The names of this agent's volumes, cheaply (for the heartbeat; no ``used_by``)."""
        ...

    async def remove_volume(self, name: str) -> bool:
        """True if removed, False if absent; raises VolumeInUse."""
        ...

    async def close(self) -> None: ...
