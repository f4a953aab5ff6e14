"""The bounds of every value Hoist accepts: at the door (commands, queries, agent RPCs) and in the
log (events).  One place, so a value a command accepts is one every reader of the log can hold.

Why these numbers: an id is a NATS subject token; cpu and mem are far beyond any host that
exists (so no real request is refused) yet far inside what DuckDB's BIGINT/DOUBLE and msgspec's
int64 hold, also when thousands of them are summed; texts are long enough for any registry's
error message and short enough that a reply quoting one fits in a NATS message.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

MAX_ID = 128  # session, kernel, agent, task, request ids; resource groups (subject tokens)
MAX_OWNER = 128
MAX_IMAGE = 512  # Docker: 255 for the name, 128 for the tag, 71 for a digest, separators
MAX_REASON = 1024  # status_info, reasons
MAX_DETAIL = 16 * 1024  # a longer error text for a human
MAX_CPU = 4096.0  # cores of one kernel or one agent
MAX_MEM = 2**48  # bytes (256 TiB) of one kernel or one agent
MAX_BYTES = 2**60  # disk and image sizes
MAX_CLUSTER = 128  # kernels of one session
MAX_LIST = 1024  # items of any other list or map in a request
MAX_AGENT_IMAGES = 100_000  # images one agent reports holding
MAX_ARGS = 256  # argv items of a command
MAX_ARG = 8 * 1024  # characters of one argv item or environment value
MAX_ENV = 256  # environment variables of a kernel
MAX_ENV_NAME = 256  # characters of one environment variable's name
MAX_PATH = 1024  # a path inside a container
MAX_PORTS = 32  # ports one kernel exposes
MAX_MOUNTS = 32  # volumes one kernel mounts
MAX_LABELS = 32  # labels of one session
MAX_SLOT = 1_000_000.0  # units of one resource slot (gpu, ...) of one kernel or agent
MAX_EXEC_S = 3600.0  # seconds an exec may run
MAX_DEPTH = 16  # nesting of a JSON request
MAX_REQUEST = 256 * 1024  # bytes of one request
MAX_REPLY = 900 * 1024  # bytes of one reply: under nats.conf's max_payload (1 MB) with headers
# Dotfiles (domain.dotfiles): files a user keeps for their kernels' home.  Each at most 64 KiB,
# at most 32 per user, and together at most 384 KiB: they travel in one create-kernel message
# (base64 in JSON: 512 KiB, with the spec's at most MAX_REQUEST under nats' 1 MB max_payload).
MAX_DOTFILE = 64 * 1024
MAX_DOTFILES = 32
MAX_DOTFILES_BYTES = 384 * 1024
MAX_DOTFILE_PATH = 255  # bytes (UTF-8) of a path relative to the home
MAX_DOTFILE_MODE = 0o777  # permission bits only: no setuid, setgid or sticky bit
# What a create-kernel may carry besides MAX_REQUEST: the dotfiles in base64, with their paths.
MAX_DOTFILES_WIRE = 4 * -(-MAX_DOTFILES_BYTES // 3) + MAX_DOTFILES * (4 * MAX_DOTFILE_PATH + 64)
QUOTE = 80  # characters of a bad value an error message quotes
# The least one kernel may ask for: what a container engine can enforce.  Docker refuses a
# memory limit under 6 MiB, and a CPU limit under 0.01 cores is a CFS quota under the kernel's
# 1 ms minimum per 100 ms period (Docker's documented range starts at 0.01).  The session
# door (domain.contracts.sessions) and every agent runtime (agent.runtime.base) check these.
MIN_KERNEL_MEM = 6 * 2**20
MIN_KERNEL_CPU = 0.01

TOKEN = r"^[A-Za-z0-9_-]+\Z"  # \Z, not $: $ also matches before a final newline
# Printable text: no C0/C1 control characters (they would drive terminals and corrupt logs),
# no bidirectional overrides, zero-width or line-separator characters (they make a name look
# like another one in a table).
PRINTABLE = r"^[^\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]*\Z"

# An environment variable's name, as POSIX shells accept it.
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*\Z"
# An absolute path inside a container, printable, no ".." step.
ABS_PATH = r"^(?!.*/\.\.(?:/|\Z))/" + PRINTABLE.removeprefix("^")
# Where a volume is mounted: an absolute path, not "/" itself, no trailing or doubled "/".
MOUNT_PATH = r"^(?!.*//)(?!.*/\Z)(?!.*/\.\.(?:/|\Z))/" + PRINTABLE.removeprefix("^")
# A dotfile's path: relative to the home, '/'-separated, no empty, '.' or '..' step, printable.
DOTFILE_PATH = r"^(?!/)(?!.*//)(?!.*/\Z)(?!(?:.*/)?\.\.?(?:/|\Z))" + PRINTABLE.removeprefix("^")
# A session's name (`hoist run --name`), as Docker's container names: 1-63 characters.
SESSION_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z"
# A label's key and value, as Kubernetes': a key of 1-63 characters (a '/'-prefix allowed),
# a value of at most 63, both without spaces, so `k=v` on a command line is never ambiguous.
LABEL_KEY = r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}\Z"
LABEL_VALUE = r"^[A-Za-z0-9_.-]{0,63}\Z"
# A resource slot's name: lower-case letters, digits, '.', '_' and '-' (``gpu``, ``cuda.shares``).
SLOT_NAME = r"^[a-z][a-z0-9._-]*\Z"

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID, pattern=TOKEN)]
Owner = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_OWNER, pattern=PRINTABLE)]
Image = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_IMAGE, pattern=PRINTABLE)]
Reason = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REASON)]
Detail = Annotated[str, msgspec.Meta(max_length=MAX_DETAIL)]
Cpu = Annotated[float, msgspec.Meta(gt=0, le=MAX_CPU)]
Mem = Annotated[int, msgspec.Meta(gt=0, le=MAX_MEM)]
Size = Annotated[int, msgspec.Meta(ge=0, le=MAX_BYTES)]
ClusterSize = Annotated[int, msgspec.Meta(ge=1, le=MAX_CLUSTER)]
# argv items and environment values: any text but NUL, which no exec(2) argument can hold.
NO_NUL = r"^[^\x00]*\Z"
Arg = Annotated[str, msgspec.Meta(max_length=MAX_ARG, pattern=NO_NUL)]
Argv = Annotated[list[Arg], msgspec.Meta(min_length=1, max_length=MAX_ARGS)]
EnvName = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ENV_NAME, pattern=ENV_NAME)]
EnvValue = Annotated[str, msgspec.Meta(max_length=MAX_ARG, pattern=NO_NUL)]
Env = Annotated[dict[EnvName, EnvValue], msgspec.Meta(max_length=MAX_ENV)]
AbsPath = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_PATH, pattern=ABS_PATH)]
MountPath = Annotated[str, msgspec.Meta(min_length=2, max_length=MAX_PATH, pattern=MOUNT_PATH)]
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
SlotName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=SLOT_NAME)]
SlotAmount = Annotated[float, msgspec.Meta(ge=0, le=MAX_SLOT)]
Slots = Annotated[dict[SlotName, SlotAmount], msgspec.Meta(max_length=64)]
ExitCode = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
SessionName = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=SESSION_NAME)]
LabelKey = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=LABEL_KEY)]
LabelValue = Annotated[str, msgspec.Meta(max_length=63, pattern=LABEL_VALUE)]
Labels = Annotated[dict[LabelKey, LabelValue], msgspec.Meta(max_length=MAX_LABELS)]
DotfilePath = Annotated[
    str, msgspec.Meta(min_length=1, max_length=MAX_DOTFILE_PATH, pattern=DOTFILE_PATH)
]
DotfileContent = Annotated[bytes, msgspec.Meta(max_length=MAX_DOTFILE)]
DotfileMode = Annotated[int, msgspec.Meta(ge=0, le=MAX_DOTFILE_MODE)]


def kernel_floor(cpu: float, mem: int) -> tuple[str, str] | None:
    """(key, why) when one kernel asks for less cpu or mem than a runtime can enforce."""
    if not cpu >= MIN_KERNEL_CPU:
        return "cpu", f"must be at least {MIN_KERNEL_CPU:g} cores, got {cpu!r}"
    if mem < MIN_KERNEL_MEM:
        return "mem", (
            f"must be at least {MIN_KERNEL_MEM // 2**20} MiB ({MIN_KERNEL_MEM} bytes), got {mem!r}"
        )
    return None


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks the cut): for outside text (a
    runtime's error, a registry's message) put into an event, so no reader refuses the event."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def quote(value: object, limit: int = QUOTE) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error names a bad value, never echoes a
    megabyte of it back."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def depth(value: object, limit: int = MAX_DEPTH) -> int:
    """How deeply ``value`` (decoded JSON) nests, counting up to ``limit + 1`` at most and
    without recursion, so a hostile document cannot exhaust the stack."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if not isinstance(item, dict | list):
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, level + 1) for child in children)
    return deepest
