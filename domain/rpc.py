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
from domain.events import AwareTime, Bytes, Resources
from domain.limits import MAX_LIST, Id, Image, Reason

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
PIN_IMAGES = "pin-images"
IMAGE_GC = "image-gc"
VERBS = (
    CHECK_AND_PULL,
    CREATE_KERNEL,
    DESTROY_KERNEL,
    SYNC_KERNELS,
    PRELOAD,
    UNLOAD,
    PULL_STATUS,
    PIN_IMAGES,
    IMAGE_GC,
)

ERROR_CODES = (
    "invalid-request",  # the payload does not match the verb's schema (message names the field)
    "create-failed",  # the runtime could not create or start the container
    "insufficient-resources",  # the kernel does not fit in the agent's free capacity
    "internal",  # a bug or an unreachable runtime: see the agent's log
)

Images = Annotated[list[Image], msgspec.Meta(min_length=1, max_length=256)]
KernelIds = Annotated[list[Id], msgspec.Meta(max_length=MAX_LIST)]
ImageList = Annotated[list[Image], msgspec.Meta(max_length=MAX_LIST)]


class _Request(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class _Reply(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pass


# --- requests and replies ------------------------------------------------------------------


class CheckAndPull(_Request, kw_only=True):
    """Make ``images`` present; reply ``{image: ImagePresent | PullTask}`` (seed 000)."""

    images: Images


class Preload(_Request, kw_only=True):
    """Like check-and-pull, and the agent records ImagePreloaded once each image is there.
    ``pinned``: image GC keeps it until it is unloaded (a preload job); a prepull policy
    preloads unpinned and pins with pin-images only while it wants the image."""

    images: Images
    reason: Reason = "preload: requested"
    pinned: bool = True


class ImagePresent(msgspec.Struct, frozen=True, kw_only=True):
    present: bool = True
    digest: str
    size: Bytes


class PullTask(_Reply, kw_only=True):
    """The image is being pulled in the background (the same task for every caller)."""

    task_id: str


class CreateKernel(_Request, kw_only=True):
    """Start a container for the kernel; idempotent (a kernel never gets two containers)."""

    kernel_id: Id
    session_id: Id
    image: Image
    resources: Resources


class KernelCreated(_Reply, kw_only=True):
    container_id: str
    existed: bool = False  # an earlier create already made it


class DestroyKernel(_Request, kw_only=True):
    kernel_id: Id


class KernelDestroyed(_Reply, kw_only=True):
    destroyed: bool  # False: there was no container (already gone)


class SyncKernels(_Request, kw_only=True):
    """The manager's truth about this agent's kernels, by status (seed 002).

    The agent destroys containers of kernels in none of the lists and of the ``terminating``
    ones, and reports ``running``/``terminating`` kernels it has no live container for as
    terminated."""

    preparing: KernelIds = []
    pulling: KernelIds = []
    creating: KernelIds = []  # create-kernel may be in flight: never destroyed by a sync
    running: KernelIds = []
    terminating: KernelIds = []


class KernelsSynced(_Reply, kw_only=True):
    running: list[str]  # kernels with a live container here
    terminating: list[str]  # kernels whose container is being destroyed right now
    terminated: list[str]  # kernels the manager lists that have no (live) container here
    destroyed: list[str] = []  # containers of kernels the manager did not know, now removed


class Unload(_Request, kw_only=True):
    """Remove images no kernel uses or is about to use; their preload pins go with them."""

    images: Images
    reason: Reason = "unload-requested"


class PinImages(_Request, kw_only=True):
    """What image GC must keep, from the manager's view; each list replaces the previous one
    (None: unchanged).  ``policy``: images prepull policies want here; ``expected``: images
    of this agent's kernels that are scheduled, pulling, prepared or being created."""

    policy: ImageList | None = None
    expected: ImageList | None = None


class ImagesPinned(_Reply, kw_only=True):
    policy: int
    expected: int


class ImageGc(_Request, kw_only=True):
    """Run one image GC pass now (it also runs on its own every interval)."""


class GcRemoval(msgspec.Struct, frozen=True, kw_only=True):
    image: str
    size_bytes: int
    reason: str


class GcReport(_Reply, kw_only=True):
    disk: int  # bytes for images
    used_before: int
    used_after: int
    removed: list[GcRemoval]
    kept: dict[str, str]  # image -> why GC may not remove it
    note: str  # e.g. why the low watermark was not reached; "" when it was (or no GC was due)


class UnloadResult(_Reply, kw_only=True):
    removed: bool
    reason: str | None = None  # why not: "in-use: kernel k1", "pulling: task ...", "not-present"


class PullStatus(_Request, kw_only=True):
    task_id: Id


PullState = Literal["queued", "pulling", "done", "failed"]


class PullStatusReply(_Reply, kw_only=True):
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
    PIN_IMAGES: PinImages,
    IMAGE_GC: ImageGc,
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
    kernels: list[LiveKernel]
    free: FreeCapacity
    images: list[str]  # images held
    pulls: dict[str, str]  # image -> task id of pulls queued or in flight


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
    return decode(data, cls, what=verb)


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
