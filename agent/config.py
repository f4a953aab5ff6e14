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
        if not self.heartbeat_interval_s > 0:
            raise ValueError(
                f"heartbeat interval (--heartbeat-interval) must be > 0 seconds,"
                f" got {self.heartbeat_interval_s}"
            )

    def auth_for(self, image: str) -> dict[str, str] | None:
        return self.registry_auth.get(registry_of(image))


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
