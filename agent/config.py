"""An agent's configuration: identity, capacity overrides, pull policy, registry credentials."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agent.gc import GcPolicy
from agent.pulls import PullPolicy
from domain.limits import MAX_SLOT, SLOT_NAME
from domain.subjects import check_token

RuntimeName = Literal["docker", "dummy"]
RUNTIMES: tuple[RuntimeName, ...] = ("docker", "dummy")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(value: str | int, field_name: str) -> int:
    """Bytes from ``536870912``, ``512m``, ``512MiB``, ``2g``, ``1.5G`` (powers of 1024)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{field_name} must be >= 0 bytes, got {value}")
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(
            f"{field_name} must be bytes or a size like 512m, 2g, 1.5GiB; got {value!r}"
        )
    return int(float(m[1]) * _UNITS[m[2].lower()])


@dataclass(frozen=True)
class AgentConfig:
    agent_id: str
    resource_group: str
    runtime: RuntimeName = "docker"
    # Capacity offered; None: what the host has (the runtime measures it).
    cpu: float | None = None
    mem: int | None = None
    disk: int | None = None
    heartbeat_interval_s: float = 2.0
    pulls: PullPolicy = field(default_factory=PullPolicy)
    gc: GcPolicy = field(default_factory=GcPolicy)
    # Registry host ("127.0.0.1:5000", "docker.io") -> docker auth config {username, password}.
    registry_auth: dict[str, dict[str, str]] = field(default_factory=dict)
    # Other resource slots offered (--slot gpu=2), scheduled and reserved like cpu.
    slots: dict[str, float] = field(default_factory=dict)
    address: str = "127.0.0.1"  # where this agent's published ports are reachable
    keep_exited_s: float = 3600.0  # an ended kernel's container (and logs) is kept this long
    stream_idle_s: float = 30.0  # a logs/exec stream nobody reads this long is closed
    # The host's GPUs the agent hands out, one kernel each (--gpu-ids: indices or UUIDs);
    # empty: "0".."N-1" for --slot gpu=N.
    gpu_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_token(self.agent_id, "agent id (--id)")
        check_token(self.resource_group, "resource group (--resource-group)")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime (--runtime) must be one of {RUNTIMES}, got {self.runtime!r}")
        if self.cpu is not None and not self.cpu > 0:
            raise ValueError(f"cpu (--cpu) must be > 0 cores, got {self.cpu}")
        if self.mem is not None and self.mem <= 0:
            raise ValueError(f"mem (--mem) must be > 0 bytes, got {self.mem}")
        if self.disk is not None and self.disk < 0:
            raise ValueError(f"disk (--disk) must be >= 0 bytes, got {self.disk}")
        for name, amount in self.slots.items():
            if not re.fullmatch(SLOT_NAME, name):
                raise ValueError(
                    f"slot name (--slot) must be lower-case letters, digits, '.', '_', '-'"
                    f" starting with a letter, got {name!r}"
                )
            if not 0 < amount <= MAX_SLOT:
                raise ValueError(f"slot {name} (--slot) must be > 0 and <= {MAX_SLOT:g}")
        self._check_gpus()
        if not self.address or not re.fullmatch(r"[A-Za-z0-9.:_-]+", self.address):
            raise ValueError(f"address (--address) must be a host name or IP, got {self.address!r}")
        if not self.stream_idle_s > 0:
            raise ValueError(f"stream_idle_s must be > 0 seconds, got {self.stream_idle_s}")
        if self.keep_exited_s < 0:
            raise ValueError(f"--keep-exited must be >= 0 seconds, got {self.keep_exited_s}")
        if not self.heartbeat_interval_s > 0:
            raise ValueError(
                f"heartbeat interval (--heartbeat-interval) must be > 0 seconds,"
                f" got {self.heartbeat_interval_s}"
            )

    def _check_gpus(self) -> None:
        gpus = self.slots.get("gpu")
        if gpus is not None and gpus != int(gpus):
            raise ValueError(f"slot gpu (--slot) must be a whole number of GPUs, got {gpus:g}")
        if not self.gpu_ids:
            # frozen: the default is filled in once, here
            object.__setattr__(self, "gpu_ids", tuple(str(i) for i in range(int(gpus or 0))))
            return
        object.__setattr__(self, "gpu_ids", tuple(self.gpu_ids))
        if gpus is None:
            raise ValueError("--gpu-ids needs --slot gpu=N (N: how many ids it names)")
        if len(self.gpu_ids) != int(gpus):
            raise ValueError(
                f"--gpu-ids names {len(self.gpu_ids)} GPUs but --slot gpu={gpus:g}: give one id"
                " per GPU"
            )
        for gpu in self.gpu_ids:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9:._-]*", gpu):
                raise ValueError(
                    f"--gpu-ids: a GPU id is an index or UUID (letters, digits, ':', '.', '_',"
                    f" '-'), got {gpu!r}"
                )
        if len(set(self.gpu_ids)) != len(self.gpu_ids):
            raise ValueError(f"--gpu-ids names a GPU twice: {','.join(self.gpu_ids)}")

    def auth_for(self, image: str) -> dict[str, str] | None:
        return self.registry_auth.get(registry_of(image))


def parse_slot(value: str) -> tuple[str, float]:
    """``gpu=2`` -> ("gpu", 2.0) (checked by AgentConfig)."""
    name, sep, amount = value.partition("=")
    try:
        if not sep:
            raise ValueError
        return name.strip(), float(amount)
    except ValueError:
        raise ValueError(f"--slot must be NAME=AMOUNT, e.g. gpu=2; got {value!r}") from None


def parse_gpu_ids(value: str) -> tuple[str, ...]:
    """``0,1`` or ``GPU-uuid1,GPU-uuid2`` -> the ids (checked by AgentConfig)."""
    return tuple(part.strip() for part in value.split(","))


def registry_of(image: str) -> str:
    """The registry host of an image reference (docker's rule: a first path component with a
    '.' or ':' or equal to 'localhost' is a host; otherwise Docker Hub)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def load_registry_auth(path: Path) -> dict[str, dict[str, str]]:
    """Credentials per registry host from a JSON file: either ``{host: {"username",
    "password"}}`` or a docker ``config.json`` (``{"auths": {host: {"auth": base64}}}``)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"registry auth file (--registry-auth) {path}: {e}") from None
    entries = raw.get("auths", raw) if isinstance(raw, dict) else None
    if not isinstance(entries, dict):
        raise ValueError(
            f"registry auth file {path} must be a JSON object {{host: {{username, password}}}}"
        )
    out: dict[str, dict[str, str]] = {}
    for host, entry in entries.items():
        if not isinstance(entry, dict):
            raise ValueError(f"registry auth file {path}: entry {host!r} must be an object")
        if "auth" in entry and "username" not in entry:
            user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            entry = {"username": user, "password": password}
        if not entry.get("username") or "password" not in entry:
            raise ValueError(
                f"registry auth file {path}: entry {host!r} needs username and password"
            )
        host = re.sub(r"^https?://", "", host).rstrip("/").removesuffix("/v1")
        out[host] = {
            "username": entry["username"],
            "password": entry["password"],
            "serveraddress": host,
        }
    return out
