"""The runtime on a real Docker Engine, through the (blocking) docker SDK.

Short calls run in worker threads (``asyncio.to_thread``). Streams (a pull, logs, an exec's
output, the engine's events) last long, so each gets its own thread and its own API client:
what it reads is handed to the event loop with ``call_soon_threadsafe``, and stopping it shuts
its socket down, which ends the stream at once (a pull: the daemon abandons the download).  A
log or exec stream hands its bytes over through a bounded buffer (``_Handoff``): at most about
``HANDOFF_BYTES`` wait per stream (then its thread waits for the reader, as on a pipe), and what
waits is taken as one chunk, so a big log is a few large chunks, not a callback per line.

A kernel's container joins a bridge network on this engine.  With ``private_network`` (a session
of several kernels) that is its session's own, ``hoist-<agent>.<session>``, with its hostname as
alias, so the session's kernels reach each other by name.  Else it is one network the agent's
single kernels share, ``hoist-net-<agent>``: an engine with the default address pools fits only
about 31 user-defined networks, so a network per session would cap an agent at about 31
sessions.  (Ids are letters, digits, '_' and '-', so the '.' keeps the two kinds of names apart
for any ids; the networks' labels say whose they are.)  The shared network gets no aliases from
us (the engine adds each hostname anyway: an equal hostname of several sessions just resolves
to several addresses, and a kernel's own hostname is its own in its /etc/hosts), and
inter-container traffic is off on it (where the engine manages iptables), so sessions stay apart
as on networks of their own.  The shared network goes with the last container on it.  A
session's network goes as soon as no running container is on it: a container that ends is
disconnected from it (its logs stay readable), so kept exited containers do not hold address
pools; ``prune_networks`` (also run by the first ``list_kernels``) removes what a crash left.
A container publishes its ports on the runtime's address with ports the engine picks, and mounts
named volumes ``hoist-<name>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import docker
import docker.errors
import docker.types
import requests
from docker.utils import parse_repository_tag

from agent.runtime.base import (
    LABEL_AGENT,
    LABEL_CPU,
    LABEL_GPUS,
    LABEL_KERNEL,
    LABEL_MEM,
    LABEL_OWNER,
    LABEL_SESSION,
    LABEL_SLOTS,
    Capacity,
    ContainerSpec,
    ExitCallback,
    ExitInfo,
    ImageInUse,
    ImageNotFound,
    KernelContainer,
    KernelCreateError,
    KernelExists,
    KernelNotFound,
    ProgressCallback,
    Published,
    PulledImage,
    PullError,
    PullProgress,
    TransientPullError,
    Unauthorized,
    Volume,
    VolumeInUse,
    validate_create,
)

LABEL_VOLUME = "hoist.volume"  # on volumes: the name Hoist knows it by (without the prefix)
VOLUME_PREFIX = "hoist-"  # Hoist only ever touches volumes named so

API_VERSION = "1.41"  # Docker 20.10+; pinned so that making a client does no I/O
DEFAULT_HOST = "unix:///var/run/docker.sock"

_UNAUTHORIZED = ("unauthorized", "authentication required", "no basic auth credentials", "denied")
_NOT_FOUND = ("not found", "manifest unknown", "name unknown", "invalid reference format")
_ICC = "com.docker.network.bridge.enable_icc"
# The engine's words when no address pool is left for a new network.
_NO_POOL = ("address pool", "non-overlapping")
_POOLS_HINT = (
    "(the engine fits about 31 user-defined networks by default): raise default-address-pools"
    " in /etc/docker/daemon.json"
)
# Statuses after which a layer's bytes are all downloaded.
_DOWNLOADED = {"Verifying Checksum", "Download complete", "Extracting", "Pull complete"}
# At most this many bytes of one log or exec stream wait for the reader (plus one chunk).
HANDOFF_BYTES = 1 << 20
# A stream's bytes that come fast are handed over at most every _BATCH_S unless this many wait.
_BATCH_BYTES = 64 * 1024
_BATCH_S = 0.005
# Container states in which a container is on its networks.
_UP = ("running", "paused", "restarting")


def classify(image: str, message: str, status_code: int | None = None) -> PullError:
    """Map a daemon error to permanent (not found, unauthorized) or transient."""
    text = message.lower()
    if status_code in (401, 403) or any(k in text for k in _UNAUTHORIZED):
        return Unauthorized(image, message)
    if status_code == 404 or any(k in text for k in _NOT_FOUND):
        return ImageNotFound(image, message)
    return TransientPullError(image, message)


def split_ref(image: str) -> tuple[str, str]:
    """``repo:tag`` or ``repo@sha256:...`` -> (repo, tag or digest); no tag means latest."""
    if not image or image != image.strip():
        raise ValueError(f"image must be a non-empty reference without spaces, got {image!r}")
    repo, tag = parse_repository_tag(image)
    return repo, tag or "latest"


def _repo_digest(attrs: dict[str, Any], image: str) -> str:
    repo = split_ref(image)[0]
    for rd in attrs.get("RepoDigests") or []:
        name, _, digest = rd.partition("@")
        if name == repo:
            return digest
    return attrs["Id"]


class _LayerTracker:
    """Turns the daemon's progress lines into per-layer PullProgress with monotonic bytes."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.layers: dict[str, PullProgress] = {}

    def update(self, line: dict[str, Any]) -> PullProgress | None:
        layer, status = line.get("id"), line.get("status", "")
        if not layer or status.startswith("Pulling from"):
            return None
        prev = self.layers.get(layer)
        current, total = (prev.current, prev.total) if prev else (0, 0)
        detail = line.get("progressDetail") or {}
        if status == "Downloading":
            total = detail.get("total") or total
            current = max(current, detail.get("current", 0))
        elif status in _DOWNLOADED:
            current = total  # Extracting reports unpacked bytes; the download is done
        if prev and (prev.status, prev.current, prev.total) == (status, current, total):
            return None
        self.layers[layer] = p = PullProgress(self.image, layer, status, current, total)
        return p


class _Pull:
    """One pull in its own thread; the loop side awaits ``result`` and may call ``abort``."""

    def __init__(
        self,
        base_url: str,
        image: str,
        auth: dict[str, str] | None,
        loop: asyncio.AbstractEventLoop,
        on_progress: ProgressCallback,
    ) -> None:
        self.image = image
        self.auth = auth
        self.loop = loop
        self.on_progress = on_progress
        self.api = docker.APIClient(base_url=base_url, version=API_VERSION)
        self.api.hooks["response"].append(self._keep_response)
        self.response: requests.Response | None = None
        self.aborted = False
        self.result: asyncio.Future[PulledImage] = loop.create_future()
        self.ended = asyncio.Event()

    def _keep_response(self, r: requests.Response, *args: Any, **kwargs: Any) -> None:
        self.response = r
        if self.aborted:
            self._shutdown()

    def _shutdown(self) -> None:
        # close() alone does not wake a thread blocked in recv(); shutdown() does.
        with contextlib.suppress(Exception):
            sock = self.response.raw.connection.sock  # type: ignore[union-attr]
            sock.shutdown(socket.SHUT_RDWR)

    def abort(self) -> None:
        self.aborted = True
        if self.response is not None:
            self._shutdown()

    def _emit(self, p: PullProgress) -> None:
        if not self.aborted:
            self.on_progress(p)

    def _settle(self, result: PulledImage | None, error: BaseException | None) -> None:
        if not self.result.done():
            if error is not None:
                self.result.set_exception(error)
            else:
                self.result.set_result(result)  # type: ignore[arg-type]
        self.ended.set()

    def run(self) -> None:
        result, error = None, None
        try:
            result = self._pull()
        except BaseException as e:
            error = e
        finally:
            self.api.close()
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self.loop.call_soon_threadsafe(self._settle, result, error)

    def _pull(self) -> PulledImage:
        repo, tag = split_ref(self.image)
        tracker, digest, complete = _LayerTracker(self.image), None, False
        try:
            stream = self.api.pull(
                repo, tag=tag, stream=True, decode=True, auth_config=self.auth or None
            )
            for line in stream:
                if "error" in line:
                    raise classify(self.image, line["error"])
                status = line.get("status", "")
                if status.startswith("Digest: "):
                    digest = status.removeprefix("Digest: ")
                elif status.startswith("Status: "):
                    complete = True
                elif (p := tracker.update(line)) is not None:
                    self.loop.call_soon_threadsafe(self._emit, p)
        except docker.errors.APIError as e:
            raise classify(self.image, str(e.explanation or e), e.status_code) from e
        except (requests.RequestException, OSError, ValueError) as e:
            if self.aborted:
                raise asyncio.CancelledError from e
            raise TransientPullError(self.image, f"connection to the docker daemon: {e}") from e
        if self.aborted:
            raise asyncio.CancelledError
        if not complete:
            raise TransientPullError(self.image, "the daemon ended the pull stream early")
        attrs = self.api.inspect_image(self.image)
        return PulledImage(self.image, digest or _repo_digest(attrs, self.image), attrs["Size"])


def _shutdown_response(r: requests.Response) -> None:
    """Wake a thread blocked reading ``r``: close() alone does not, shutdown() does. A plain
    response keeps its socket on the connection; a hijacked one (exec) in its file object."""
    socks: list[Any] = []
    with contextlib.suppress(Exception):
        socks.append(r.raw.connection.sock)  # type: ignore[union-attr]
    with contextlib.suppress(Exception):
        raw = r.raw._fp.fp.raw  # type: ignore[union-attr]
        socks.append(getattr(raw, "_sock", raw))
    for sock in socks:
        with contextlib.suppress(Exception):
            sock.shutdown(socket.SHUT_RDWR)


class _Conn:
    """An API client of its own for one blocking stream, which another thread can end."""

    def __init__(self, base_url: str) -> None:
        self.api = docker.APIClient(base_url=base_url, version=API_VERSION)
        self.api.hooks["response"].append(self._keep_response)
        # Every response: a stream call may make a short one first (logs inspects the tty).
        self.responses: list[requests.Response] = []
        self.aborted = False

    def _keep_response(self, r: requests.Response, *args: Any, **kwargs: Any) -> None:
        self.responses.append(r)
        if self.aborted:  # aborted before the request went out
            _shutdown_response(r)

    def abort(self) -> None:
        self.aborted = True
        for r in list(self.responses):
            _shutdown_response(r)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.api.close()


class _Handoff:
    """Bytes from a stream's thread to the loop, bounded: ``put`` waits while ``limit`` bytes or
    more wait for the reader, so the runtime never holds more than ``limit`` plus one chunk of a
    stream; ``get`` takes all that waits as one chunk (one loop callback per batch, not per
    chunk), and while bytes come fast, a few small ones at most every ``_BATCH_S`` (an
    occasional line still comes at once).  ``close`` (the reader went away) makes ``put``
    refuse at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int | None = None) -> None:
        self.loop = loop
        self.limit = limit or HANDOFF_BYTES
        self._cond = threading.Condition()
        self._buf = bytearray()
        self._ended = False
        self._error: BaseException | None = None
        self._closed = False
        self._notified = False  # a wake-up is on its way to the loop
        self._ready = asyncio.Event()
        self._taken_at = 0.0  # monotonic time of the last get that took bytes
        self.peak = 0  # the most bytes that waited at once (for tests)
        self.wakeups = 0  # loop callbacks made (for tests)

    # In the stream's thread.
    def put(self, chunk: bytes, aborted: Callable[[], bool] = lambda: False) -> bool:
        """False once the reader went away (or ``aborted()``): stop reading."""
        with self._cond:
            while len(self._buf) >= self.limit:
                if self._closed or aborted() or self.loop.is_closed():
                    return False
                self._cond.wait(0.1)  # a timeout: an abort must wake it, however it comes
            if self._closed:
                return False
            self._buf += chunk
            self.peak = max(self.peak, len(self._buf))
            self._wake()
        return True

    def finish(self, error: BaseException | None = None) -> None:
        with self._cond:
            self._ended, self._error = True, error
            self._wake()

    def _wake(self) -> None:
        if not self._notified:
            self._notified = True
            self.wakeups += 1
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads
                self.loop.call_soon_threadsafe(self._ready.set)

    # On the loop.
    async def get(self) -> bytes | None:
        """What waits, as one chunk; None at the end (after raising the stream's error)."""
        while True:
            with self._cond:
                delay = 0.0
                if 0 < len(self._buf) < _BATCH_BYTES and not self._ended:
                    delay = self._taken_at + _BATCH_S - time.monotonic()
                if delay > 0:
                    self._notified = True  # no wake-ups needed: the loop looks after the delay
                else:
                    self._notified = False
                    self._ready.clear()
                    if self._buf:
                        data = bytes(self._buf)
                        self._buf.clear()
                        self._taken_at = time.monotonic()
                        self._cond.notify_all()
                        return data
                    if self._ended:
                        error, self._error = self._error, None
                        if error is not None:
                            raise error
                        return None
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await self._ready.wait()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _pump(handoff: _Handoff, conn: _Conn, chunks: Any) -> None:
    """In a stream's thread: hand every chunk to the loop, then an error (unless aborted), then
    the end."""
    error: BaseException | None = None
    try:
        for chunk in chunks():
            if conn.aborted:
                break
            if chunk and not handoff.put(chunk, lambda: conn.aborted):
                break
    except BaseException as e:
        if not conn.aborted:
            error = e
    finally:
        conn.close()
        handoff.finish(error)


async def _drain(handoff: _Handoff) -> AsyncIterator[bytes]:
    while (chunk := await handoff.get()) is not None:
        yield chunk


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


def _container_pid(host_pid: int, container_id: str) -> int | None:
    """The pid inside its container of our ``/proc``'s process ``host_pid``, if /proc says it
    is a process of that container (its cgroup names the container); else None (gone, or our
    /proc is of another pid namespace than the daemon's)."""
    try:
        with open(f"/proc/{host_pid}/cgroup") as f:
            if container_id not in f.read():
                return None
        with open(f"/proc/{host_pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])  # the innermost namespace's: the container's
    except (OSError, ValueError):
        return None
    return None


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
        image=image,
        running=running,
        cpu=float(labels.get(LABEL_CPU) or 0),
        mem_bytes=int(labels.get(LABEL_MEM) or 0),
        slots=_slots(labels),
        gpu_ids=tuple(g for g in (labels.get(LABEL_GPUS) or "").split(",") if g),
        ports=ports,
        exit=exit,
    )


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


class _DockerExec:
    """One exec: its output streams in a thread of its own; ``kill`` ends its process."""

    def __init__(
        self, runtime: DockerRuntime, exec_id: str, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.runtime = runtime
        self.exec_id = exec_id
        self.conn = _Conn(runtime.base_url)
        self.handoff = _Handoff(loop)
        self.ended = asyncio.Event()
        self._drained = False

        def chunks() -> Any:
            return self.conn.api.exec_start(exec_id, stream=True)

        def run() -> None:
            try:
                _pump(self.handoff, self.conn, chunks)
            finally:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self.ended.set)

        self.thread = threading.Thread(target=run, name=f"exec {exec_id[:12]}", daemon=True)
        self.thread.start()

    async def output(self) -> AsyncIterator[bytes]:
        """Read it: once ``HANDOFF_BYTES`` wait unread, the command waits to write, as on a pipe."""
        if self._drained:
            return
        self._drained = True
        async for chunk in _drain(self.handoff):
            yield chunk

    async def _inspect(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.runtime.api.exec_inspect, self.exec_id)

    async def wait(self) -> int:
        await self.ended.wait()
        # The output ends when the process closes it; the engine records the exit just after.
        for _ in range(200):
            info = await self._inspect()
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            await asyncio.sleep(0.05)
        raise TimeoutError(f"exec {self.exec_id} ended its output but is still running")

    async def kill(self) -> None:
        try:
            for _ in range(200):
                info = await self._inspect()
                pid = int(info.get("Pid") or 0)
                if info.get("Running") and pid > 0:
                    await self._kill(str(info.get("ContainerID") or ""), pid)
                    break
                if info.get("ExitCode") is not None:
                    break  # ended already
                await asyncio.sleep(0.05)  # not started yet
        finally:
            # Whatever happened above: a child that inherited its output must not keep the
            # stream (and its thread) going.
            self.handoff.close()
            self.conn.abort()

    async def _kill(self, container_id: str, pid: int) -> None:
        """The engine has no API to signal an exec; ``pid`` is its process as the daemon sees
        it (in the daemon's pid namespace)."""
        if not self.runtime.local:
            # A remote daemon: its pids are not ours, and nothing tells the command's pid inside
            # the container.  The command runs on until it ends; its stream is closed (by the
            # caller), so nobody waits for it.
            return
        in_container = await asyncio.to_thread(_container_pid, pid, container_id)
        if in_container is None:
            # Our /proc is not the daemon's (the agent runs in another pid namespace) or the
            # process is gone: as with a remote daemon, it runs on until it ends.
            return
        try:
            os.kill(pid, signal.SIGKILL)
            return
        except ProcessLookupError:
            return  # ended meanwhile
        except OSError:
            pass  # not ours to signal (an agent that is not root): kill it from inside
        api = self.runtime.api
        with contextlib.suppress(docker.errors.APIError, requests.RequestException):
            killer = await asyncio.to_thread(
                api.exec_create, container_id, ["kill", "-9", str(in_container)], user="0"
            )
            await asyncio.to_thread(api.exec_start, killer["Id"])


def _id(text: str) -> str:
    """An id in a name: ids are letters, digits, '_' and '-'; anything else (a '.' too) -> '_'."""
    return re.sub(r"[^a-zA-Z0-9_-]", "_", text)


class DockerRuntime:
    """Kernels of agent ``agent_id`` on the Docker Engine at ``base_url`` (DOCKER_HOST); their
    ports are published on ``address``."""

    def __init__(
        self,
        agent_id: str,
        base_url: str | None = None,
        timeout: float = 60,
        address: str = "127.0.0.1",
    ) -> None:
        if not agent_id:
            raise ValueError("agent_id must be non-empty")
        self.agent_id = agent_id
        self.address = address
        self.base_url = base_url or os.environ.get("DOCKER_HOST") or DEFAULT_HOST
        self.api = docker.APIClient(base_url=self.base_url, version=API_VERSION, timeout=timeout)
        # A daemon on this host (its socket): its pids may be ours (an exec's kill).
        self.local = self.base_url.startswith(("unix://", "http+unix://"))
        self._exits: dict[str, ExitInfo] = {}  # container id -> its exit (which never changes)
        self._watchers: list[_ExitWatcher] = []
        # Network create/remove and container create/start of one session one at a time, so a
        # destroy never removes the network under a kernel being created.
        self._session_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        # The agent's shared network: made or removed under this lock, and never removed while
        # a create that joins it is under way (``_agent_network_users``) or a container is on it.
        self._agent_network_lock = asyncio.Lock()
        self._agent_network_users = 0
        self._pruned = False  # the first list_kernels prunes what a crash left
        self._tasks: set[asyncio.Task[Any]] = set()  # session networks released after a die

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def capacity(self) -> Capacity:
        info = await self._call(self.api.info)
        disk = 0
        with contextlib.suppress(OSError):  # the daemon may be remote: its root is not ours
            disk = shutil.disk_usage(info["DockerRootDir"]).total
        return Capacity(cpu=float(info["NCPU"]), mem_bytes=int(info["MemTotal"]), disk_bytes=disk)

    async def pull(
        self, image: str, on_progress: ProgressCallback, auth: dict[str, str] | None = None
    ) -> PulledImage:
        split_ref(image)  # bad input fails here, not in the thread
        pull = _Pull(self.base_url, image, auth, asyncio.get_running_loop(), on_progress)
        threading.Thread(target=pull.run, name=f"pull {image}", daemon=True).start()
        try:
            return await pull.result
        except asyncio.CancelledError:
            pull.abort()
            # Wait (bounded) for the thread, so the daemon has dropped the download on return.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pull.ended.wait(), 10)
            raise

    async def has_image(self, image: str) -> PulledImage | None:
        split_ref(image)
        try:
            attrs = await self._call(self.api.inspect_image, image)
        except docker.errors.ImageNotFound:
            return None
        return PulledImage(image, _repo_digest(attrs, image), attrs["Size"])

    async def list_images(self) -> list[PulledImage]:
        images = await self._call(self.api.images)
        return [
            PulledImage(tag, _repo_digest(img, tag), img["Size"])
            for img in images
            for tag in img.get("RepoTags") or []
            if tag != "<none>:<none>"
        ]

    async def remove_image(self, image: str) -> bool:
        split_ref(image)
        try:
            await self._call(self.api.remove_image, image)
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as e:
            if e.status_code == 409:
                raise ImageInUse(image, str(e.explanation)) from e
            raise
        return True

    def _name(self, kernel_id: str) -> str:
        # The name makes a second create of one kernel fail atomically (409), even in a race;
        # the '.' (in no id) keeps agent "a-b" kernel "c" apart from agent "a" kernel "b-c".
        return f"hoist-{_id(self.agent_id)}.{_id(kernel_id)}"

    def network_name(self, session_id: str) -> str:
        """The session's private network (``private_network`` kernels)."""
        return f"hoist-{_id(self.agent_id)}.{_id(session_id)}"

    @property
    def agent_network_name(self) -> str:
        """The network the agent's kernels without ``private_network`` share (no '.', unlike
        a session's)."""
        return f"hoist-net-{_id(self.agent_id)}"

    def _session_lock(self, session_id: str) -> asyncio.Lock:
        lock = self._session_locks.get(session_id)
        if lock is None:
            self._session_locks[session_id] = lock = asyncio.Lock()
        return lock

    async def _containers(
        self, kernel_id: str | None = None, session_id: str | None = None
    ) -> list[dict[str, Any]]:
        labels = [f"{LABEL_AGENT}={self.agent_id}"]
        if kernel_id is not None:
            labels.append(f"{LABEL_KERNEL}={kernel_id}")
        if session_id is not None:
            labels.append(f"{LABEL_SESSION}={session_id}")
        return await self._call(self.api.containers, all=True, filters={"label": labels})

    async def _container_id(self, kernel_id: str) -> str:
        found = await self._containers(kernel_id)
        if not found:
            raise KernelNotFound(kernel_id)
        return str(found[0]["Id"])

    async def _ensure_network(
        self,
        kernel_id: str,
        name: str,
        labels: dict[str, str],
        no_pool: str,
        options: dict[str, str] | None = None,
    ) -> str:
        found = await self._call(self.api.networks, names=[name])  # a substring match
        if any(n["Name"] == name for n in found):
            return name
        try:
            await self._call(
                self.api.create_network,
                name,
                driver="bridge",
                labels=labels,
                options=options,
                check_duplicate=True,
            )
        except docker.errors.APIError as e:
            if e.status_code == 409:  # another agent process made it meanwhile; use it
                return name
            text = str(e.explanation or e)
            if any(k in text.lower() for k in _NO_POOL):
                raise KernelCreateError(kernel_id, f"{no_pool} ({text})") from e
            raise KernelCreateError(kernel_id, f"network {name}: {text}") from e
        return name

    async def _ensure_session_network(self, kernel_id: str, session_id: str) -> str:
        return await self._ensure_network(
            kernel_id,
            self.network_name(session_id),
            {LABEL_AGENT: self.agent_id, LABEL_SESSION: session_id},
            f"no address pool left for the session's network {_POOLS_HINT},"
            " or run fewer multi-kernel sessions per agent",
        )

    async def _release_session_network(
        self, session_id: str, name: str | None = None, remove_empty: bool = True
    ) -> bool:
        """Disconnect the session's containers that are not running from its network ``name``
        (a stopped container can be; its logs stay), and remove the network once no running
        container is on it.  ``remove_empty``: also when no container of the session was on it
        (a failed create, a destroy, a crash's leftover).  True if it was removed."""
        async with self._session_lock(session_id):
            return await self._release_locked(session_id, name, remove_empty)

    async def _release_locked(
        self, session_id: str, name: str | None = None, remove_empty: bool = True
    ) -> bool:
        name = name or self.network_name(session_id)
        on_it = [
            c
            for c in await self._containers(session_id=session_id)
            if name in _networks(c) or _network_mode(c) == name
        ]
        if not on_it and not remove_empty:
            return False
        up = False
        for c in on_it:
            if c["State"] in _UP:
                up = True
            elif name in _networks(c):
                with contextlib.suppress(docker.errors.NotFound):  # gone meanwhile
                    await self._call(self.api.disconnect_container_from_network, c["Id"], name)
        if up:
            return False
        try:
            await self._call(self.api.remove_network, name)
        except docker.errors.APIError:  # absent, or used by a container of someone else
            return False
        return True

    def _released_after_exit(self, kernel: KernelContainer) -> None:
        """A kernel ended: its session's network may go (in a task of its own)."""
        if not kernel.session_id:
            return
        task = asyncio.get_running_loop().create_task(
            self._quietly(self._release_session_network(kernel.session_id, remove_empty=False))
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _quietly(coro: Any) -> None:
        # Best effort: list_kernels and prune_networks try again.
        with contextlib.suppress(docker.errors.APIError, requests.RequestException, OSError):
            await coro

    async def prune_networks(self) -> list[str]:
        """Remove this agent's networks (by their labels) that no running container is on:
        what a crash between a network's create and its container's left, or a session's
        network whose containers ended while no runtime watched.  Returns their names."""
        found = await self._call(
            self.api.networks, filters={"label": f"{LABEL_AGENT}={self.agent_id}"}
        )
        removed = []
        for n in found:
            labels = n.get("Labels") or {}
            if labels.get(LABEL_AGENT) != self.agent_id:
                continue
            if session_id := labels.get(LABEL_SESSION):
                gone = await self._release_session_network(session_id, n["Name"])
            else:
                gone = await self._remove_agent_network_if_unused(n["Name"])
            if gone:
                removed.append(n["Name"])
        return removed

    @contextlib.asynccontextmanager
    async def _joining_agent_network(self, kernel_id: str) -> AsyncIterator[str]:
        """The agent's shared network, made on first use and kept while the create runs; after
        a failed create it goes if nothing else uses it."""
        async with self._agent_network_lock:
            name = await self._ensure_network(
                kernel_id,
                self.agent_network_name,
                {LABEL_AGENT: self.agent_id},
                f"no address pool left for the agent's network {_POOLS_HINT},"
                " or remove networks the engine no longer needs",
                {_ICC: "false"},  # sessions do not reach each other on it
            )
            self._agent_network_users += 1
        try:
            yield name
        except BaseException:
            self._agent_network_users -= 1
            await self._remove_agent_network_if_unused()
            raise
        else:
            self._agent_network_users -= 1

    async def _remove_agent_network_if_unused(self, name: str | None = None) -> bool:
        name = name or self.agent_network_name
        async with self._agent_network_lock:
            if self._agent_network_users:
                return False
            if any(_network_mode(c) == name for c in await self._containers()):
                return False
            try:
                await self._call(self.api.remove_network, name)
            except docker.errors.APIError:  # absent, or used by another process
                return False
            return True

    async def _ensure_volume(self, kernel_id: str, volume: str, owner: str) -> str:
        full = VOLUME_PREFIX + volume
        labels = {LABEL_AGENT: self.agent_id, LABEL_OWNER: owner, LABEL_VOLUME: volume}
        try:
            # Creating an existing volume returns it unchanged, so a race is harmless; its
            # labels tell whose it is.
            await self._call(self.api.create_volume, full, driver="local", labels=labels)
            attrs = await self._call(self.api.inspect_volume, full)
        except docker.errors.APIError as e:
            raise KernelCreateError(kernel_id, f"volume {volume}: {e.explanation or e}") from e
        theirs = (attrs.get("Labels") or {}).get(LABEL_OWNER, "")
        if owner and theirs and theirs != owner:
            raise KernelCreateError(kernel_id, f"volume {volume} belongs to another owner")
        return full

    async def create(
        self,
        kernel_id: str,
        session_id: str,
        image: str,
        cpu: float,
        mem_bytes: int,
        spec: ContainerSpec | None = None,
    ) -> str:
        validate_create(kernel_id, session_id, cpu, mem_bytes)
        split_ref(image)
        spec = spec or ContainerSpec()
        if existing := await self._containers(kernel_id):
            raise KernelExists(kernel_id, existing[0]["Id"])
        labels = {
            LABEL_KERNEL: kernel_id,
            LABEL_SESSION: session_id,
            LABEL_AGENT: self.agent_id,
            LABEL_CPU: str(cpu),
            LABEL_MEM: str(mem_bytes),
            LABEL_SLOTS: json.dumps(dict(spec.slots), sort_keys=True),
        }
        device_requests = []
        if spec.gpu_ids:  # exactly the GPUs the agent picked, so no two kernels share one
            labels[LABEL_GPUS] = ",".join(spec.gpu_ids)
            device_requests.append(
                docker.types.DeviceRequest(device_ids=list(spec.gpu_ids), capabilities=[["gpu"]])
            )
        elif (gpus := spec.slots.get("gpu", 0)) > 0:
            # A caller that picks none: any N (the engine gives every such kernel the first N).
            device_requests.append(
                docker.types.DeviceRequest(count=max(1, int(gpus)), capabilities=[["gpu"]])
            )

        async def run(network: str, aliases: list[str] | None) -> str:
            mounts = [
                docker.types.Mount(
                    target=m.path,
                    source=await self._ensure_volume(kernel_id, m.volume, spec.owner),
                    type="volume",
                    read_only=m.read_only,
                )
                for m in spec.mounts
            ]
            host_config = self.api.create_host_config(
                nano_cpus=round(cpu * 1e9),
                mem_limit=mem_bytes,
                memswap_limit=mem_bytes,  # no swap beyond the limit
                network_mode=network,
                init=True,  # an init as PID 1: signals work and zombies are reaped
                port_bindings={p: (self.address, None) for p in spec.ports},  # engine picks
                mounts=mounts,
                extra_hosts=dict(spec.extra_hosts) or None,
                device_requests=device_requests or None,
            )
            networking_config = self.api.create_networking_config(
                {network: self.api.create_endpoint_config(aliases=aliases)}
            )
            container_id = await self._create_container(
                kernel_id, image, spec, labels, host_config, networking_config
            )
            try:
                await self._call(self.api.start, container_id)
            except docker.errors.APIError as e:
                with contextlib.suppress(docker.errors.APIError):
                    await self._call(self.api.remove_container, container_id, force=True)
                raise KernelCreateError(kernel_id, str(e.explanation or e)) from e
            return container_id

        if not spec.private_network:
            async with self._joining_agent_network(kernel_id) as network:
                return await run(network, None)
        async with self._session_lock(session_id):
            network = await self._ensure_session_network(kernel_id, session_id)
            try:
                return await run(network, [spec.hostname])
            except BaseException:
                await self._release_locked(session_id, network)
                raise

    async def _create_container(
        self,
        kernel_id: str,
        image: str,
        spec: ContainerSpec,
        labels: dict[str, str],
        host_config: dict[str, Any],
        networking_config: dict[str, Any],
    ) -> str:
        try:
            created = await self._call(
                self.api.create_container,
                image,
                command=list(spec.command) if spec.command is not None else None,
                environment=dict(spec.env) or None,
                working_dir=spec.workdir,
                hostname=spec.hostname,
                ports=list(spec.ports) or None,
                labels=labels,
                host_config=host_config,
                networking_config=networking_config,
                name=self._name(kernel_id),
            )
        except docker.errors.ImageNotFound as e:
            raise KernelCreateError(kernel_id, f"image {image} is not on this host: pull it") from e
        except docker.errors.APIError as e:
            if e.status_code == 409 and (existing := await self._containers(kernel_id)):
                raise KernelExists(kernel_id, existing[0]["Id"]) from e
            raise KernelCreateError(kernel_id, str(e.explanation or e)) from e
        return str(created["Id"])

    async def destroy(self, kernel_id: str) -> bool:
        found = await self._containers(kernel_id)
        for c in found:
            with contextlib.suppress(docker.errors.NotFound):  # gone meanwhile: fine
                await self._call(self.api.remove_container, c["Id"], force=True)
            self._exits.pop(c["Id"], None)
        shared = self.agent_network_name
        for session_id in {
            c["Labels"].get(LABEL_SESSION) for c in found if _network_mode(c) != shared
        } - {None, ""}:
            await self._release_session_network(session_id)
        if any(_network_mode(c) == shared for c in found):
            await self._remove_agent_network_if_unused()
        return bool(found)

    async def _exit_of(self, container_id: str) -> ExitInfo | None:
        if (known := self._exits.get(container_id)) is not None:
            return known
        try:
            attrs = await self._call(self.api.inspect_container, container_id)
        except docker.errors.NotFound:
            return None
        state = attrs.get("State") or {}
        if state.get("Running") or state.get("Status") not in ("exited", "dead"):
            return None
        self._exits[container_id] = info = _exit_info(state)
        return info

    async def list_kernels(self) -> list[KernelContainer]:
        if not self._pruned:  # the agent lists its kernels first thing: tidy up after a crash
            self._pruned = True
            await self._quietly(self.prune_networks())
        containers = [c for c in await self._containers() if LABEL_KERNEL in c["Labels"]]
        ended = [c["Id"] for c in containers if c["State"] in ("exited", "dead")]
        # An ended kernel still on its session's network (no die event seen): release it.
        for session_id in sorted(
            {
                s
                for c in containers
                if c["State"] in ("exited", "dead")
                and (s := c["Labels"].get(LABEL_SESSION))
                and self.network_name(s) in _networks(c)
            }
        ):
            await self._quietly(self._release_session_network(session_id, remove_empty=False))
        exits = dict(zip(ended, await asyncio.gather(*map(self._exit_of, ended)), strict=True))
        for gone in self._exits.keys() - {c["Id"] for c in containers}:
            self._exits.pop(gone, None)
        return [
            _kernel(
                c["Labels"],
                c["Id"],
                c["Image"],
                c["State"] == "running",
                _summary_ports(c),
                exits.get(c["Id"]),
            )
            for c in containers
        ]

    def watch_exits(self, on_exit: ExitCallback) -> None:
        def ended(kernel: KernelContainer) -> None:
            self._released_after_exit(kernel)
            on_exit(kernel)

        watcher = _ExitWatcher(self.base_url, self.agent_id, asyncio.get_running_loop(), ended)
        self._watchers.append(watcher)
        watcher.thread.start()

    async def logs(self, kernel_id: str, tail: int | None, follow: bool) -> AsyncIterator[bytes]:
        container_id = await self._container_id(kernel_id)
        handoff, conn = _Handoff(asyncio.get_running_loop()), _Conn(self.base_url)

        def chunks() -> Any:
            # Not a tty: the SDK demultiplexes the frames, so stdout and stderr come as written.
            return conn.api.logs(
                container_id,
                stdout=True,
                stderr=True,
                stream=True,
                follow=follow,
                tail="all" if tail is None else tail,
            )

        threading.Thread(
            target=_pump, args=(handoff, conn, chunks), name=f"logs {kernel_id}", daemon=True
        ).start()
        try:
            async for chunk in _drain(handoff):
                yield chunk
        except docker.errors.NotFound as e:
            raise KernelNotFound(kernel_id) from e
        finally:
            handoff.close()
            conn.abort()

    async def exec(
        self,
        kernel_id: str,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> _DockerExec:
        container_id = await self._container_id(kernel_id)
        try:
            created = await self._call(
                self.api.exec_create,
                container_id,
                list(command),
                environment=dict(env) if env else None,
                workdir=workdir,
            )
        except docker.errors.NotFound as e:
            raise KernelNotFound(kernel_id) from e
        except docker.errors.APIError as e:  # 409: the container is not running
            raise KernelCreateError(kernel_id, str(e.explanation or e)) from e
        return _DockerExec(self, created["Id"], asyncio.get_running_loop())

    async def _mounted_by(self, full: str, agent_only: bool) -> list[str]:
        filters: dict[str, Any] = {"volume": full}
        if agent_only:
            filters["label"] = [f"{LABEL_AGENT}={self.agent_id}"]
        found = await self._call(self.api.containers, all=True, filters=filters)
        return [c["Labels"].get(LABEL_KERNEL) or c["Names"][0].lstrip("/") for c in found]

    async def _volumes(self) -> list[dict[str, Any]]:
        found = await self._call(
            self.api.volumes, filters={"label": f"{LABEL_AGENT}={self.agent_id}"}
        )
        return list((found or {}).get("Volumes") or [])

    @staticmethod
    def _volume_name(v: Mapping[str, Any]) -> str:
        labelled = (v.get("Labels") or {}).get(LABEL_VOLUME)
        return str(labelled or v["Name"].removeprefix(VOLUME_PREFIX))

    async def volume_names(self) -> list[str]:
        """The names of this agent's volumes: one engine call (the agent's heartbeat)."""
        return sorted(self._volume_name(v) for v in await self._volumes())

    async def list_volumes(self) -> list[Volume]:
        found = await self._volumes()
        if not found:
            return []
        used: dict[str, list[str]] = {}  # volume's full name -> kernels of ours mounting it
        for c in await self._containers():
            for m in c.get("Mounts") or []:
                if m.get("Type") == "volume" and m.get("Name"):
                    used.setdefault(m["Name"], []).append(
                        c["Labels"].get(LABEL_KERNEL) or c["Names"][0].lstrip("/")
                    )
        return sorted(
            (
                Volume(
                    self._volume_name(v),
                    (v.get("Labels") or {}).get(LABEL_OWNER, ""),
                    tuple(sorted(used.get(v["Name"], ()))),
                )
                for v in found
            ),
            key=lambda v: v.name,
        )

    async def remove_volume(self, name: str) -> bool:
        full = VOLUME_PREFIX + name
        if users := await self._mounted_by(full, agent_only=False):
            raise VolumeInUse(name, users)
        try:
            await self._call(self.api.remove_volume, full)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as e:
            if e.status_code == 409:  # mounted by a container made since we looked
                raise VolumeInUse(name, [str(e.explanation)]) from e
            raise
        return True

    async def close(self) -> None:
        for watcher in self._watchers:
            watcher.stop()
        self._watchers.clear()
        if self._tasks:  # releases after a die: let them end (bounded), then stop them
            _, pending = await asyncio.wait(set(self._tasks), timeout=10)
            for task in pending:
                task.cancel()
        self.api.close()
