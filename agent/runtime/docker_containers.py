"""Facts about containers from the engine's listings and inspects (times, exits, slots, ports,
networks, the KernelContainer), and the watcher of this agent's containers' ``die`` events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import docker
import docker.errors

from agent.runtime.base import (
    LABEL_AGENT,
    LABEL_ASKED_AT,
    LABEL_ASKED_SEQ,
    LABEL_CPU,
    LABEL_GPUS,
    LABEL_KERNEL,
    LABEL_MEM,
    LABEL_SESSION,
    LABEL_SLOTS,
    ExitCallback,
    ExitInfo,
    KernelContainer,
    Published,
)
from agent.runtime.docker_client import API_VERSION, _Conn
from domain.image_ref import canonical_or_same


def _timestamp(text: str | None) -> float:
    """Docker's RFC 3339 time with nanoseconds -> unix time; its zero time (never) -> 0."""
    if not text or text.startswith("0001-"):
        return 0.0
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if m is None:
        return 0.0
    zone = "+00:00" if m[3] == "Z" else m[3]
    frac = (m[2] or "0")[:6].ljust(6, "0")  # datetime keeps microseconds
    return datetime.fromisoformat(f"{m[1]}.{frac}{zone}").timestamp()


def _exit_info(state: Mapping[str, Any]) -> ExitInfo:
    started, finished = _timestamp(state.get("StartedAt")), _timestamp(state.get("FinishedAt"))
    return ExitInfo(
        exit_code=int(state.get("ExitCode") or 0),
        oom_killed=bool(state.get("OOMKilled")),
        ran_s=max(0.0, finished - started) if started and finished else 0.0,
        finished_at=finished,
    )


def _slots(labels: Mapping[str, str]) -> dict[str, float]:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return {str(k): float(v) for k, v in json.loads(labels.get(LABEL_SLOTS) or "{}").items()}
    return {}


def _inspect_ports(attrs: Mapping[str, Any]) -> tuple[Published, ...]:
    ports = (attrs.get("NetworkSettings") or {}).get("Ports") or {}
    return tuple(
        Published(int(key.split("/")[0]), b["HostIp"], int(b["HostPort"]))
        for key, bindings in sorted(ports.items())
        if key.endswith("/tcp")
        for b in bindings or []
        if b.get("HostPort")
    )


def _summary_ports(c: Mapping[str, Any]) -> tuple[Published, ...]:
    return tuple(
        sorted(
            Published(int(p["PrivatePort"]), p.get("IP", ""), int(p["PublicPort"]))
            for p in c.get("Ports") or []
            if p.get("PublicPort") and p.get("Type", "tcp") == "tcp"
        )
    )


def _network_mode(c: Mapping[str, Any]) -> str:
    """The network a container (as listed) was created on."""
    return str((c.get("HostConfig") or {}).get("NetworkMode") or "")


def _networks(c: Mapping[str, Any]) -> set[str]:
    """The networks a container (as listed) is connected to now."""
    return set((c.get("NetworkSettings") or {}).get("Networks") or {})


def _kernel(
    labels: Mapping[str, str],
    container_id: str,
    image: str,
    running: bool,
    ports: tuple[Published, ...],
    exit: ExitInfo | None,
) -> KernelContainer:
    return KernelContainer(
        kernel_id=labels[LABEL_KERNEL],
        session_id=labels.get(LABEL_SESSION, ""),
        container_id=container_id,
        image=canonical_or_same(image),  # the engine may list a short form: one name per image
        running=running,
        cpu=_amount(labels, LABEL_CPU, float),
        mem_bytes=int(_amount(labels, LABEL_MEM, int)),
        slots=_slots(labels),
        gpu_ids=tuple(g for g in (labels.get(LABEL_GPUS) or "").split(",") if g),
        ports=ports,
        exit=exit,
        **_asked(labels),
    )


def _amount(labels: Mapping[str, str], label: str, kind: type[float] | type[int]) -> float:
    """What a container was given, from its label; 0 when it does not read as a finite amount
    >= 0 (anyone with the engine's socket can label a container: a bad label must not stop
    every listing, and so every heartbeat and sync; the container is listed holding nothing)."""
    try:
        value = kind(labels.get(label) or 0)
    except ValueError:
        return 0
    return value if math.isfinite(value) and value >= 0 else 0


def _asked(labels: Mapping[str, str]) -> dict[str, Any]:
    """The create's sequence and time from the labels; none when either does not read (a
    label edited by hand spares nothing, it does not stop the listing)."""
    seq, at = int(_amount(labels, LABEL_ASKED_SEQ, int)), _amount(labels, LABEL_ASKED_AT, float)
    return {"asked_seq": seq, "asked_at": at} if seq > 0 and at > 0 else {}


def _kernel_from_inspect(attrs: Mapping[str, Any]) -> KernelContainer:
    state = attrs.get("State") or {}
    running = bool(state.get("Running"))
    return _kernel(
        (attrs.get("Config") or {}).get("Labels") or {},
        attrs["Id"],
        (attrs.get("Config") or {}).get("Image", ""),
        running,
        _inspect_ports(attrs),
        None if running else _exit_info(state),
    )


class _ExitWatcher:
    """The engine's ``die`` events of this agent's containers, in a thread, to the loop."""

    def __init__(
        self, base_url: str, agent_id: str, loop: asyncio.AbstractEventLoop, on_exit: ExitCallback
    ) -> None:
        self.base_url = base_url
        self.agent_id = agent_id
        self.loop = loop
        self.on_exit = on_exit
        self.stopped = threading.Event()
        self.conn: _Conn | None = None
        self.thread = threading.Thread(target=self.run, name=f"exits {agent_id}", daemon=True)

    def stop(self) -> None:
        self.stopped.set()
        if self.conn is not None:
            self.conn.abort()

    def run(self) -> None:
        # From now on; after a broken stream, replay from the last event seen (a repeat is fine:
        # the agent dedups by container id).
        since = int(time.time()) - 1  # whole seconds (a die in this second is repeated)
        backoff = 0.2
        filters = {"type": "container", "event": "die", "label": f"{LABEL_AGENT}={self.agent_id}"}
        while not self.stopped.is_set():
            self.conn = conn = _Conn(self.base_url)
            if self.stopped.is_set():
                conn.close()
                break
            # Inspections on a client of their own: conn has the one stream to end at stop.
            inspector = docker.APIClient(base_url=self.base_url, version=API_VERSION)
            try:
                for event in conn.api.events(since=since, filters=filters, decode=True):
                    backoff = 0.2
                    since = max(since, int(event.get("time") or 0))
                    self._report(inspector, event)
            except Exception:
                pass  # the engine went away or restarted: reconnect below
            finally:
                conn.close()
                inspector.close()
            self.stopped.wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def _report(self, api: docker.APIClient, event: Mapping[str, Any]) -> None:
        try:
            kernel = _kernel_from_inspect(api.inspect_container(event["id"]))
        except docker.errors.NotFound:  # removed at once (destroy): the event says enough
            attrs = (event.get("Actor") or {}).get("Attributes") or {}
            if LABEL_KERNEL not in attrs:
                return
            exit_code = int(attrs.get("exitCode") or 0)
            kernel = _kernel(
                attrs, event["id"], attrs.get("image", ""), False, (), ExitInfo(exit_code)
            )
        except Exception:  # not a kernel's container (no label), or the engine went away
            return
        if kernel.exit is None:  # running again already (restarted): no end to report
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed
            self.loop.call_soon_threadsafe(self.on_exit, kernel)
