"""The dummy runtime's host on disk: its pulled images, containers (with their output so far),
volumes and port counter in one JSON file, so a restarted dummy agent finds its host as a
restarted docker agent finds the Docker Engine's: images still pulled, containers still there.

Written whole (a temporary file renamed over the old one) after each change of images,
containers or volumes, and at close with the containers' latest output.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from agent.runtime.base import ContainerSpec, ExitInfo, Published, PulledImage

VERSION = 1


# What a saved kernel and a live one (dummy.DummyKernel) hold alike, copied field by field.
KERNEL_FIELDS = (
    "kernel_id",
    "session_id",
    "container_id",
    "image",
    "cpu",
    "mem_bytes",
    "spec",
    "ports",
    "started_at",
    "exit",
    "stopped",
)


class SavedKernel(msgspec.Struct, kw_only=True):
    kernel_id: str
    session_id: str
    container_id: str
    image: str
    cpu: float
    mem_bytes: int
    spec: ContainerSpec
    ports: tuple[Published, ...] = ()
    started_at: float  # unix time its process started
    exit: ExitInfo | None = None
    stopped: bool = False
    log: bytes = b""  # the output kept (base64 in the file) ...
    log_start: int = 0  # ... and the absolute offset of its first byte
    saved_at: float = 0.0  # unix time the log was saved: output written after it is lost


class SavedHost(msgspec.Struct, kw_only=True):
    version: int = VERSION
    images: list[PulledImage] = msgspec.field(default_factory=list)
    kernels: list[SavedKernel] = msgspec.field(default_factory=list)
    volumes: dict[str, str] = msgspec.field(default_factory=dict)
    next_port: int = 30000


def load(path: Path) -> SavedHost | None:
    """The host saved at ``path``; None if there is none yet."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        host = msgspec.json.decode(raw, type=SavedHost)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ValueError(
            f"--dummy-state {path}: not a dummy host ({e}); move it away to start an empty one"
        ) from None
    if host.version != VERSION:
        raise ValueError(
            f"--dummy-state {path}: version {host.version}, this agent reads {VERSION}; move it"
            " away to start an empty one"
        )
    return host


def save(path: Path, host: SavedHost) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_bytes(msgspec.json.encode(host))
    os.replace(tmp, path)  # a reader (or a crash) never sees half a file
