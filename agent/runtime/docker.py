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
import logging
import os
import re
import shutil
import threading
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import docker
import docker.errors
import docker.types
import requests

from agent.runtime.base import (
    LABEL_AGENT,
    LABEL_ASKED_AT,
    LABEL_ASKED_SEQ,
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
    Filesystem,
    ImageInUse,
    ImageMissing,
    KernelContainer,
    KernelCreateError,
    KernelExists,
    KernelNotFound,
    ProgressCallback,
    PulledImage,
    Volume,
    VolumeInUse,
    validate_create,
)
from agent.runtime.docker_client import API_VERSION, _Conn
from agent.runtime.docker_containers import (
    _exit_info,
    _ExitWatcher,
    _kernel,
    _network_mode,
    _networks,
    _summary_ports,
)
from agent.runtime.docker_home import put_home_files
from agent.runtime.docker_pulls import _Pull, _repo_digest, classify, split_ref
from agent.runtime.docker_streams import HANDOFF_BYTES, _DockerExec, _drain, _Handoff, _pump
from domain.image_ref import canonical_or_same

__all__ = [
    "API_VERSION",
    "DEFAULT_HOST",
    "HANDOFF_BYTES",
    "LABEL_VOLUME",
    "VOLUME_PREFIX",
    "DockerRuntime",
    "classify",
    "split_ref",
]

LABEL_VOLUME = "hoist.volume"  # on volumes: the name Hoist knows it by (without the prefix)
VOLUME_PREFIX = "hoist-"  # Hoist only ever touches volumes named so

log = logging.getLogger(__name__)

DEFAULT_HOST = "unix:///var/run/docker.sock"

_ICC = "com.docker.network.bridge.enable_icc"
# The engine's words when no address pool is left for a new network.
_NO_POOL = ("address pool", "non-overlapping")
_POOLS_HINT = (
    "(the engine fits about 31 user-defined networks by default): raise default-address-pools"
    " in /etc/docker/daemon.json"
)
# Container states in which a container is on its networks.
_UP = ("running", "paused", "restarting")
# A removed container's endpoint outlives the remove call by milliseconds (more under load).
_ENDPOINT_RETRIES = 20
_ENDPOINT_RETRY_S = 0.1


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
        self._root_dir: str | None = None  # DockerRootDir, asked once
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

    async def filesystem(self) -> Filesystem | None:
        if not self.local:
            return None  # a remote daemon's root dir is not on this host
        if self._root_dir is None:
            root = (await self._call(self.api.info)).get("DockerRootDir")
            if not isinstance(root, str) or not root.startswith("/"):
                log.warning("docker info has no usable DockerRootDir (%r): GC uses --disk", root)
                return None
            self._root_dir = root
        try:
            st = await asyncio.to_thread(os.statvfs, self._root_dir)
        except OSError as e:
            log.warning("image gc cannot measure %s (%s): GC uses --disk", self._root_dir, e)
            return None
        return Filesystem(self._root_dir, st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)

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
        # The engine lists RepoTags in short form (python:latest): Hoist names images
        # canonically (docker.io/library/python:latest), so locality, GC and heartbeats match.
        return [
            PulledImage(canonical_or_same(tag), _repo_digest(img, tag), img["Size"])
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
        return await self._remove_network(name)

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
            return await self._remove_network(name)

    async def _remove_network(self, name: str) -> bool:
        """Remove a network no container of ours is on.  The engine frees a removed
        container's endpoint a moment after the remove returns: "has active endpoints" is
        asked again for a while; any other refusal (absent, a container of someone else's)
        leaves the network."""
        for _ in range(_ENDPOINT_RETRIES):
            try:
                await self._call(self.api.remove_network, name)
                return True
            except docker.errors.APIError as e:
                if "active endpoints" not in str(e.explanation or e):
                    return False
            await asyncio.sleep(_ENDPOINT_RETRY_S)
        return False

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
        if spec.asked_seq:
            labels[LABEL_ASKED_SEQ] = str(spec.asked_seq)
            labels[LABEL_ASKED_AT] = repr(spec.asked_at)
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
                await put_home_files(self._call, self.api, container_id, spec.home_files)
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
            # Also a 404 for an image of another platform: only a missing one is pulled again.
            if "no such image" in str(e.explanation or e).lower():
                raise ImageMissing(kernel_id, image) from e
            raise KernelCreateError(kernel_id, str(e.explanation or e)) from e
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
