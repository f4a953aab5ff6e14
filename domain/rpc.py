"""What agent and manager say to each other over NATS, besides events: the agent's request/reply
payloads (``hoist.agent.<id>.<verb>``), its heartbeat (``hoist.heartbeat.<id>``) and pull
progress (``hoist.progress.<agent id>.<task id>``).  All JSON via msgspec.

Requests are validated strictly (unknown fields refused), so a typo is an error naming the
field instead of a silently ignored option.  Every failure reply is
``{"error": {"code": ..., "message": ...}}`` and means nothing was changed; ``code`` is one of
``ERROR_CODES``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from domain import limits
from domain.errors import InvalidField
from domain.events import (
    AwareTime,
    Bytes,
    ClusterMode,
    KernelSpec,
    PublishedPorts,
    Resources,
    Seconds,
)
from domain.image_ref import canonical, canonical_all
from domain.limits import (
    MAX_EXEC_S,
    MAX_LIST,
    Argv,
    ClusterSize,
    DotfileContent,
    DotfileMode,
    DotfilePath,
    Env,
    ExitCode,
    Id,
    Image,
    Owner,
    Reason,
    Slots,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

# --- verbs: hoist.agent.<agent id>.<verb> -------------------------------------------------
CHECK_AND_PULL = "check-and-pull"
CREATE_KERNEL = "create-kernel"
DESTROY_KERNEL = "destroy-kernel"
SYNC_KERNELS = "sync-kernels"
PRELOAD = "preload"
UNLOAD = "unload"
PULL_STATUS = "pull-status"
PULL_CANCEL = "pull-cancel"
PIN_IMAGES = "pin-images"
IMAGE_GC = "image-gc"
LOGS = "logs"
EXEC = "exec"
STREAM_READ = "stream-read"
VOLUMES = "volumes"
VOLUME_REMOVE = "volume-remove"
BEATS_ACKED = "beats-acked"
BEAT_PACE = "beat-pace"
# A notice, never a request: the manager wrote on the agent's liveness subject (it marked the
# agent lost), so the agent reads that subject at its next beat.  It carries nothing to trust.
LIVENESS_CHANGED = "liveness-changed"
VERBS = (
    CHECK_AND_PULL,
    CREATE_KERNEL,
    DESTROY_KERNEL,
    SYNC_KERNELS,
    PRELOAD,
    UNLOAD,
    PULL_STATUS,
    PULL_CANCEL,
    PIN_IMAGES,
    IMAGE_GC,
    LOGS,
    EXEC,
    STREAM_READ,
    VOLUMES,
    VOLUME_REMOVE,
    BEATS_ACKED,
    BEAT_PACE,
)

# create-kernel's refusal when the image is not on the agent: the manager sends the kernel
# back to check-and-pull (its other refusals fail the kernel).
IMAGE_MISSING = "image-missing"
ERROR_CODES = (
    "invalid-request",  # the payload does not match the verb's schema (message names the field)
    "create-failed",  # the runtime could not create or start the container
    IMAGE_MISSING,  # create-kernel: the image is not on this agent (check-and-pull it)
    "insufficient-resources",  # the kernel does not fit in the agent's free capacity
    "not-found",  # no such kernel container, stream or volume on this agent
    "conflict",  # e.g. a volume in use, or owned by another user
    "internal",  # a bug or an unreachable runtime: see the agent's log
)

Images = Annotated[list[Image], msgspec.Meta(min_length=1, max_length=256)]
ManifestDigest = Annotated[str, msgspec.Meta(pattern=r"^sha256:[0-9a-f]{64}$")]
KernelIds = Annotated[list[Id], msgspec.Meta(max_length=MAX_LIST)]
ImageList = Annotated[list[Image], msgspec.Meta(max_length=MAX_LIST)]
BeatEpoch = Annotated[str, msgspec.Meta(max_length=64, pattern=r"^[0-9a-f]*$")]
# JetStream's sequences are uint64; msgspec bounds an int within int64, which no stream reaches
_MAX_SEQ = 2**63 - 1
BeatSeq = Annotated[int, msgspec.Meta(ge=0, le=_MAX_SEQ)]
LogSeq = Annotated[int, msgspec.Meta(ge=0, le=_MAX_SEQ)]  # a sequence of the event stream
MAX_BEAT_FLOOR_S = 60.0  # the longest interval a manager may ask of an agent (domain.beats)
BeatFloor = Annotated[float, msgspec.Meta(ge=0, le=MAX_BEAT_FLOOR_S)]


class _Request(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class _Reply(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pass


# --- requests and replies ------------------------------------------------------------------


class CheckAndPull(_Request, frozen=True, kw_only=True):
    """Make ``images`` present; reply ``{image: ImagePresent | PullTask}`` (a pull runs as
    a task the caller follows, so the reply does not wait for it).
    ``kernel_ids``: the kernels that wait for the pull (pull-cancel names them when they no
    longer do); none: someone who never says (an admin's pull), so the pull is never
    cancelled for want of waiters."""

    images: Images
    kernel_ids: KernelIds = []


class Preload(_Request, frozen=True, kw_only=True):
    """Like check-and-pull, and the agent records ImagePreloaded once each image is there.
    ``pinned``: image GC keeps it until it is unloaded (a preload job); a prepull policy
    preloads unpinned and pins with pin-images only while it wants the image."""

    images: Images
    reason: Reason = "preload: requested"
    pinned: bool = True
    # Image -> the manifest digest wanted: an image held under another digest is pulled again
    # (a prepull policy's tag pushed again since; the registry's digest now).
    digests: Annotated[dict[Image, ManifestDigest], msgspec.Meta(max_length=256)] = {}


class ImagePresent(msgspec.Struct, frozen=True, kw_only=True):
    present: bool = True
    digest: str
    size: Bytes


class PullTask(_Reply, frozen=True, kw_only=True):
    """The image is being pulled in the background (the same task for every caller)."""

    task_id: str


class KernelDotfile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One of the owner's dotfiles (domain.dotfiles), written into the kernel's home."""

    path: DotfilePath  # relative to the home
    content: DotfileContent  # base64 in JSON
    mode: DotfileMode = 0o644


KernelDotfiles = Annotated[list[KernelDotfile], msgspec.Meta(max_length=limits.MAX_DOTFILES)]


class CreateKernel(_Request, frozen=True, kw_only=True):
    """Start a container for the kernel; idempotent (a kernel never gets two containers).

    ``spec.env`` already holds the cluster's ``HOIST_*`` variables.  The kernels of a session of
    several (``cluster_size`` > 1) on one agent share a private network where each is reachable
    by its ``hostname`` (``main1``, ``sub1``, ...); a single-kernel session's kernel joins the
    agent's shared network instead.  ``extra_hosts`` maps the hostnames of kernels on other
    agents (multi-node) to their agents' addresses.  ``owner`` labels the volumes the kernel
    creates."""

    kernel_id: Id
    session_id: Id
    image: Image
    resources: Resources
    owner: Owner = "unknown"
    spec: KernelSpec = KernelSpec()
    hostname: Id = "main1"
    cluster_mode: ClusterMode = "multi-node"
    extra_hosts: Annotated[dict[Id, str], msgspec.Meta(max_length=128)] = {}
    # How many kernels the session has, on all agents (added later: absent, it decodes as 1,
    # so an older manager's multi-kernel sessions get no private network; upgrade it first).
    cluster_size: ClusterSize = 1
    # The stream sequence of the session's record the asking manager had (0: unknown): a sync
    # from a view that has not folded that far spares the container (SyncKernels.view_seq).
    seq: LogSeq = 0
    dotfiles: KernelDotfiles = []


class KernelCreated(_Reply, frozen=True, kw_only=True):
    container_id: str
    existed: bool = False  # an earlier create already made it
    ports: PublishedPorts = []  # where the kernel's ports are reachable


class DestroyKernel(_Request, frozen=True, kw_only=True):
    kernel_id: Id


class KernelDestroyed(_Reply, frozen=True, kw_only=True):
    destroyed: bool  # False: there was no container (already gone)


class SyncKernels(_Request, frozen=True, kw_only=True):
    """The manager's truth about this agent's kernels, by status (the log decides; the agent
    brings its containers in line).

    The agent destroys containers of kernels in none of the lists and of the ``terminating``
    ones, and reports ``running``/``terminating`` kernels it has no live container for as
    terminated."""

    preparing: KernelIds = []
    pulling: KernelIds = []
    creating: KernelIds = []  # create-kernel may be in flight: never destroyed by a sync
    running: KernelIds = []
    terminating: KernelIds = []
    # The last stream sequence the manager's view had folded (None: an older manager).  A
    # container of a kernel in no list whose create came from a later record is spared: the
    # view lags behind the manager that asked for it (another one: a follower, a paused leader).
    view_seq: LogSeq | None = None


class KernelExit(msgspec.Struct, frozen=True, kw_only=True):
    """How a kernel's process ended."""

    exit_code: ExitCode
    oom_killed: bool = False
    ran_s: Seconds = 0.0


class KernelsSynced(_Reply, frozen=True, kw_only=True):
    running: list[str]  # kernels with a live container here
    terminating: list[str]  # kernels whose container is being destroyed right now
    terminated: list[str]  # kernels the manager lists that have no (live) container here
    destroyed: list[str] = []  # containers of kernels the manager did not know, now removed
    spared: list[str] = []  # such containers created from a record past the view: left alone
    exits: dict[str, KernelExit] = {}  # of ``terminated`` kernels whose process ended here


class Unload(_Request, frozen=True, kw_only=True):
    """Remove images no kernel uses or is about to use; their preload pins go with them."""

    images: Images
    reason: Reason = "unload-requested"


class PinImages(_Request, frozen=True, kw_only=True):
    """What image GC must keep, from the manager's view; each list replaces the previous one
    (None: unchanged).  ``policy``: images prepull policies want here; ``expected``: images
    of this agent's kernels that are scheduled, pulling, prepared or being created."""

    policy: ImageList | None = None
    expected: ImageList | None = None


class ImagesPinned(_Reply, frozen=True, kw_only=True):
    policy: int
    expected: int


class BeatsAcked(_Request, frozen=True, kw_only=True):
    """The manager holds this agent's full beat ``seq`` of ``epoch``: send the changes since it;
    ``seq`` None: it holds nothing it can apply changes to, send a full beat (domain.beats)."""

    epoch: BeatEpoch
    seq: BeatSeq | None = None


class BeatPace(_Request, frozen=True, kw_only=True):
    """Beat at least every ``floor_s`` seconds (0: at the agent's own interval): the leading
    manager keeps a large fleet's beats per second bounded (domain.beats.pace_floor)."""

    floor_s: BeatFloor


class BeatPaced(_Reply, frozen=True, kw_only=True):
    interval_s: float  # the agent's interval now: the larger of its own and the floor


class BeatBase(_Reply, frozen=True, kw_only=True):
    base: int | None  # the full beat the agent's changes count from now; None: full beats


class ImageGc(_Request, frozen=True, kw_only=True):
    """Run one image GC pass now (it also runs on its own every interval)."""


class GcRemoval(msgspec.Struct, frozen=True, kw_only=True):
    image: str
    size_bytes: int
    reason: str


class GcReport(_Reply, frozen=True, kw_only=True):
    disk: int  # bytes of what GC measured against (the engine's filesystem, or --disk)
    used_before: int
    used_after: int
    removed: list[GcRemoval]
    kept: dict[str, str]  # image -> why GC may not remove it
    note: str  # e.g. why the low watermark was not reached; "" when it was (or no GC was due)
    # What was measured: the engine's filesystem (its path, statvfs), or "--disk" (the images'
    # sizes against the agent's --disk, where the engine's filesystem is not on this host).
    measured: str = ""


class UnloadResult(_Reply, frozen=True, kw_only=True):
    removed: bool
    reason: str | None = None  # why not: "in-use: kernel k1", "pulling: task ...", "not-present"


class Logs(_Request, frozen=True, kw_only=True):
    """Open a stream of the kernel container's output (stdout and stderr, as written): the
    last ``tail`` lines (None: all), then, with ``follow``, what it writes until it ends.
    Works for an ended kernel until its container is removed."""

    kernel_id: Id
    tail: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] | None = None
    follow: bool = False


class Exec(_Request, frozen=True, kw_only=True):
    """Run ``command`` in the kernel's running container; its output is a stream whose last
    chunk carries the exit code.  Killed after ``timeout`` seconds (exit code 124, as
    coreutils' timeout)."""

    kernel_id: Id
    command: Argv
    env: Env = {}
    workdir: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)] | None = None
    timeout: Annotated[float, msgspec.Meta(gt=0, le=MAX_EXEC_S)] = 60.0


class StreamOpened(_Reply, frozen=True, kw_only=True):
    """A stream of output to read with stream-read; it is dropped when nobody has read it
    for ``idle_s`` seconds."""

    stream_id: str
    idle_s: float


class StreamRead(_Request, frozen=True, kw_only=True):
    """The stream's bytes from ``cursor`` (0: its start), waiting up to ``wait`` seconds for
    some when there are none yet.  Back-pressure is the reader's pace: the agent keeps a
    bounded buffer per stream; bytes a reader fell too far behind to get are counted in
    ``dropped``, never waited for."""

    stream_id: Id
    cursor: Annotated[int, msgspec.Meta(ge=0)] = 0
    wait: Annotated[float, msgspec.Meta(ge=0, le=30)] = 0.0
    max_bytes: Annotated[int, msgspec.Meta(ge=1, le=512 * 1024)] = 256 * 1024


class StreamChunk(_Reply, frozen=True, kw_only=True):
    data: bytes  # base64 in JSON
    cursor: int  # where the next read starts
    dropped: int = 0  # bytes between the asked cursor and this chunk that the buffer lost
    done: bool = False  # nothing will follow
    exit_code: ExitCode | None = None  # an exec's, with done
    # Why the stream ended early (with done), e.g. "timed out after 1s".  Not ``error``: that
    # key is every failure envelope's ({"error": {"code", "message"}}).
    reason: str | None = None


class ListVolumes(_Request, frozen=True, kw_only=True):
    owner: Owner | None = None  # None: every owner's


class VolumeInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    owner: str
    used_by: list[str] = []  # kernels whose containers mount it now


class VolumesListed(_Reply, frozen=True, kw_only=True):
    volumes: list[VolumeInfo]


class RemoveVolume(_Request, frozen=True, kw_only=True):
    name: Id
    owner: Owner | None = None  # refused when the volume is another owner's


class VolumeRemoved(_Reply, frozen=True, kw_only=True):
    removed: bool  # False: there was no such volume here


class PullStatus(_Request, frozen=True, kw_only=True):
    task_id: Id


class PullCancel(_Request, frozen=True, kw_only=True):
    """``kernel_ids`` no longer wait for ``image`` (cancelled, destroyed): the agent stops its
    pull when no other kernel waits for it and nobody asked for it without naming a kernel
    (a preload, an admin's pull).  Idempotent: kernels that are no waiters (any more) change
    nothing."""

    image: Image
    kernel_ids: Annotated[list[Id], msgspec.Meta(min_length=1, max_length=MAX_LIST)]
    reason: Reason = "no kernel waits for it"


PullState = Literal["queued", "pulling", "done", "failed", "cancelled"]


class PullCancelled(_Reply, frozen=True, kw_only=True):
    """The image's pull after the request: ``task_id`` None when none is in flight;
    ``cancelled`` True when it is being stopped (by this request or an earlier one);
    ``waiting``: the kernels still waiting for it."""

    task_id: str | None = None
    state: PullState | None = None
    cancelled: bool = False
    waiting: list[str] = []


class PullStatusReply(_Reply, frozen=True, kw_only=True):
    """``known`` False: this agent process never ran the task (e.g. it restarted since)."""

    task_id: str
    known: bool
    image: str | None = None
    state: PullState | None = None
    reason: str | None = None  # why it failed
    current: Bytes = 0
    total: Bytes = 0


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    message: str


class ErrorReply(msgspec.Struct, frozen=True, kw_only=True):
    error: ErrorBody


REQUESTS: dict[str, type[_Request]] = {
    CHECK_AND_PULL: CheckAndPull,
    CREATE_KERNEL: CreateKernel,
    DESTROY_KERNEL: DestroyKernel,
    SYNC_KERNELS: SyncKernels,
    PRELOAD: Preload,
    UNLOAD: Unload,
    PULL_STATUS: PullStatus,
    PULL_CANCEL: PullCancel,
    PIN_IMAGES: PinImages,
    IMAGE_GC: ImageGc,
    LOGS: Logs,
    EXEC: Exec,
    STREAM_READ: StreamRead,
    VOLUMES: ListVolumes,
    VOLUME_REMOVE: RemoveVolume,
    BEATS_ACKED: BeatsAcked,
    BEAT_PACE: BeatPace,
}


# --- heartbeat: hoist.heartbeat.<agent id> (core NATS, not stored) --------------------------


class LiveKernel(msgspec.Struct, frozen=True, kw_only=True):
    kernel_id: str
    session_id: str
    container_id: str
    status: Literal["running", "exited"]


class FreeCapacity(msgspec.Struct, frozen=True, kw_only=True):
    cpu: float  # cores not reserved by this agent's kernels
    mem: int  # bytes
    disk: int  # bytes (capacity minus the images held)
    slots: Slots = {}  # other resource slots not reserved


# A heartbeat is a core NATS message with this header and no other.  nats-server answers a
# JetStream request on any reply subject named, unchecked, so a stored message (one an agent
# wrote, shaped as another agent's beat) can arrive on a heartbeat subject: with the server's
# own Nats-* headers, or none at all (``no_hdr``); neither passes for a beat.
BEAT_HEADER = "Hoist-Beat"


def is_beat(headers: Mapping[str, str] | None) -> bool:
    return bool(headers) and set(headers or ()) == {BEAT_HEADER}


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True):
    agent_id: str
    sent_at: AwareTime
    kernels: list[LiveKernel]  # all of them; with ``base``, the new or changed ones only
    free: FreeCapacity
    images: list[str]  # images held
    pulls: dict[str, str]  # image -> task id of pulls queued or in flight
    address: str = "127.0.0.1"  # where the agent's published ports are reachable
    volumes: list[str] = []  # named volumes held
    # Changes instead of whole lists (domain.beats): this agent process's beats, the beat's
    # number among them, and the acknowledged full beat the changes count from (None: full).
    epoch: BeatEpoch = ""  # "": an agent that always sends full beats
    seq: BeatSeq = 0
    base: BeatSeq | None = None
    gone: list[str] = []  # kernels removed since ``base``
    # The floor under its interval the manager asked for (BeatPace); None: an agent that
    # takes no pace (one before it), never asked.
    pace_s: BeatFloor | None = None


# --- progress: hoist.progress.<agent id>.<task id> (stream HOIST_PROGRESS, last per subject) --


class LayerProgress(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    status: str
    current: Bytes
    total: Bytes  # 0 while unknown


class PullProgress(msgspec.Struct, frozen=True, kw_only=True):
    """The state of one pull; ``current``/``total`` sum the layers.  ``current`` never
    decreases; the last message has ``done`` True and, on failure, ``error``."""

    agent_id: str
    task_id: str
    image: str
    layers: list[LayerProgress]
    current: Bytes
    total: Bytes
    done: bool = False
    error: str | None = None
    cancelled: bool = False  # with done: stopped because no kernel waited (``error`` says so)


# --- encoding: the one way every request is decoded and every reply encoded ----------------

_encoder = msgspec.json.Encoder()
# Replies may hold values JSON lacks (SQL intervals, UUIDs, blobs): send their text.
_reply_encoder = msgspec.json.Encoder(enc_hook=str)
_LONG_QUOTED = re.compile(rf"`([^`]{{{limits.QUOTE},}})`")
REPLY_HINT = "the reply was cut to fit one NATS message: ask for fewer rows with limit"


class RequestError(ValueError):
    """A request was refused before anything changed; becomes an ErrorReply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def reply(self) -> ErrorReply:
        return ErrorReply(error=ErrorBody(code=self.code, message=self.message))


def decode_request(verb: str, data: bytes) -> Any:
    """The request struct for ``verb``, or RequestError("invalid-request") naming the field."""
    cls = REQUESTS.get(verb)
    if cls is None:
        raise RequestError(
            "invalid-request", f"unknown verb {limits.quote(verb)}; use one of {VERBS}"
        )
    return _canonical_images(decode(data, cls, what=verb, max_bytes=max_request(verb)))


def max_request(verb: str) -> int:
    """The most bytes a request of ``verb`` may be: a create-kernel carries the owner's
    dotfiles besides (their bounds keep it under NATS' max_payload)."""
    extra = limits.MAX_DOTFILES_WIRE if verb == CREATE_KERNEL else 0
    return limits.MAX_REQUEST + extra


def _canonical_images(request: Any) -> Any:
    """``request`` with its image references canonical (domain.image_ref), so the agent keys
    pulls, pins and leases by one name per image; RequestError naming a bad one."""
    try:
        if isinstance(request, Preload) and request.digests:
            digests = {canonical(i, "digests"): d for i, d in request.digests.items()}
            return msgspec.structs.replace(
                request, images=canonical_all(request.images), digests=digests
            )
        if isinstance(request, CheckAndPull | Preload | Unload):
            return msgspec.structs.replace(request, images=canonical_all(request.images))
        if isinstance(request, CreateKernel | PullCancel):
            return msgspec.structs.replace(request, image=canonical(request.image))
        if isinstance(request, PinImages):
            lists = {
                name: canonical_all(value, name)
                for name in ("policy", "expected")
                if (value := getattr(request, name)) is not None
            }
            return msgspec.structs.replace(request, **lists)
    except InvalidField as e:
        raise RequestError("invalid-request", str(e)) from None
    return request


def decode(data: bytes, cls: type[T], what: str = "", *, max_bytes: int = limits.MAX_REQUEST) -> T:
    """``data`` as ``cls``, or RequestError("invalid-request") naming the field (msgspec's
    path, e.g. ``$.resources.mem``).  Size and nesting are bounded first, so no payload can
    exhaust memory or the stack, and the message never echoes more than a short quote."""
    name = what or cls.__name__
    if len(data) > max_bytes:
        raise RequestError(
            "invalid-request", f"{name} request is {len(data)} bytes, more than {max_bytes}"
        )
    too_deep = RequestError(
        "invalid-request", f"{name} request nests deeper than {limits.MAX_DEPTH}"
    )
    try:
        value = msgspec.json.decode(data or b"{}", type=cls)
    except RecursionError:  # msgspec gave up on the nesting: deeper than any limit
        raise too_deep from None
    except msgspec.ValidationError as e:
        # msgspec says e.g. "Expected `array`, got `str` - at `$.images`": the field is named.
        raise RequestError("invalid-request", f"{name} request: {_cut(str(e))}") from None
    except msgspec.DecodeError as e:
        raise RequestError(
            "invalid-request", f"{name} request is not valid JSON: {_cut(str(e))}"
        ) from None
    # Only untyped parts (a dict of filters) can nest freely; typed fields fail validation.
    if limits.depth(value) > limits.MAX_DEPTH:
        raise too_deep
    return value


def _cut(message: str) -> str:
    """msgspec's message with the patterns Hoist uses said in words, and any long name it
    quotes (an unknown field, say) cut short."""
    for pattern, words in _PATTERN_WORDS.items():
        message = message.replace(f"`str` matching regex {pattern!r}", words)
    return _LONG_QUOTED.sub(lambda m: limits.quote(m.group(1)), message)


# msgspec names a failed pattern by its regex; a person reads these words instead.
_PATTERN_WORDS = {
    limits.PRINTABLE: "printable text (no control or invisible characters)",
    limits.TOKEN: "1-128 letters, digits, '_' or '-'",
    limits.ABS_PATH: "an absolute path (starting with '/', no '..' step, printable)",
    limits.MOUNT_PATH: "an absolute path other than '/' (no '..' step, no trailing or double '/')",
    limits.NO_NUL: "text without NUL characters",
    limits.ENV_NAME: "a variable name (letters, digits and '_', not starting with a digit)",
    limits.SLOT_NAME: "a slot name (lower-case letters, digits, '.', '_', '-'; e.g. gpu)",
}


def encode(value: object) -> bytes:
    return _encoder.encode(value)


def encode_reply(reply: object, hint: str = REPLY_HINT) -> bytes:
    """The bytes of one reply, at most ``MAX_REPLY``: a larger one keeps the first items of
    its largest list or map that fit, with ``"truncated": true`` and ``hint``; it is never
    dropped, and a value JSON cannot hold becomes an ``internal`` error (a bug)."""
    try:
        data = _reply_encoder.encode(reply)
        if len(data) <= limits.MAX_REPLY:
            return data
        return _truncated(msgspec.to_builtins(reply, enc_hook=str), len(data), hint)
    except Exception as e:
        log.exception("encoding a reply")
        return _encoder.encode(
            RequestError("internal", f"the reply could not be encoded: {type(e).__name__}").reply()
        )


def _truncated(reply: object, size: int, hint: str) -> bytes:
    if isinstance(reply, dict):
        sizes = {k: len(_reply_encoder.encode(v)) for k, v in reply.items()}
        key = max(
            (k for k, v in reply.items() if isinstance(v, list | dict) and v),
            key=sizes.__getitem__,
            default=None,
        )
        if key is not None:
            items = reply[key]
            whole = list(items.items()) if isinstance(items, dict) else items

            def fitted(n: int) -> bytes:
                kept = dict(whole[:n]) if isinstance(items, dict) else whole[:n]
                return _reply_encoder.encode({**reply, key: kept, "truncated": True, "hint": hint})

            low, high = 0, len(whole) - 1  # the most items that fit: binary search
            while low < high:
                mid = (low + high + 1) // 2
                if len(fitted(mid)) <= limits.MAX_REPLY:
                    low = mid
                else:
                    high = mid - 1
            data = fitted(low)
            if len(data) <= limits.MAX_REPLY:
                return data
    return _encoder.encode(
        RequestError(
            "too-large",
            f"the reply would be {size} bytes, more than {limits.MAX_REPLY} even cut short;"
            " select less (fewer or shorter columns)",
        ).reply()
    )
