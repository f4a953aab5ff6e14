"""The runtime on a real Docker Engine, through the (blocking) docker SDK.

Short calls run in worker threads (``asyncio.to_thread``). A pull streams for minutes, so each
pull gets its own thread and its own API client: progress is handed to the event loop with
``call_soon_threadsafe``, and cancelling the awaiting task shuts the pull's socket down, which
ends the stream at once and makes the daemon abandon the download.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import threading
from collections.abc import Sequence
from typing import Any

import docker
import docker.errors
import requests
from docker.utils import parse_repository_tag

from agent.runtime.base import (
    DEFAULT_COMMAND,
    LABEL_AGENT,
    LABEL_CPU,
    LABEL_KERNEL,
    LABEL_MEM,
    LABEL_SESSION,
    Capacity,
    ImageInUse,
    ImageNotFound,
    KernelContainer,
    KernelCreateError,
    KernelExists,
    ProgressCallback,
    PulledImage,
    PullError,
    PullProgress,
    TransientPullError,
    Unauthorized,
    validate_create,
)

API_VERSION = "1.41"  # Docker 20.10+; pinned so that making a client does no I/O
DEFAULT_HOST = "unix:///var/run/docker.sock"

_UNAUTHORIZED = ("unauthorized", "authentication required", "no basic auth credentials", "denied")
_NOT_FOUND = ("not found", "manifest unknown", "name unknown", "invalid reference format")
# Statuses after which a layer's bytes are all downloaded.
_DOWNLOADED = {"Verifying Checksum", "Download complete", "Extracting", "Pull complete"}


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


class DockerRuntime:
    """Kernels of agent ``agent_id`` on the Docker Engine at ``base_url`` (DOCKER_HOST)."""

    def __init__(self, agent_id: str, base_url: str | None = None, timeout: float = 60) -> None:
        if not agent_id:
            raise ValueError("agent_id must be non-empty")
        self.agent_id = agent_id
        self.base_url = base_url or os.environ.get("DOCKER_HOST") or DEFAULT_HOST
        self.api = docker.APIClient(base_url=self.base_url, version=API_VERSION, timeout=timeout)

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
        # The name makes a second create of one kernel fail atomically (409), even in a race.
        return re.sub(r"[^a-zA-Z0-9_.-]", "_", f"hoist-{self.agent_id}-{kernel_id}")

    async def _containers(self, kernel_id: str | None = None) -> list[dict[str, Any]]:
        labels = [f"{LABEL_AGENT}={self.agent_id}"]
        if kernel_id is not None:
            labels.append(f"{LABEL_KERNEL}={kernel_id}")
        return await self._call(self.api.containers, all=True, filters={"label": labels})

    async def create(
        self,
        kernel_id: str,
        session_id: str,
        image: str,
        cpu: float,
        mem_bytes: int,
        command: Sequence[str] | None = None,
    ) -> str:
        validate_create(kernel_id, session_id, cpu, mem_bytes)
        split_ref(image)
        if existing := await self._containers(kernel_id):
            raise KernelExists(kernel_id, existing[0]["Id"])
        host_config = self.api.create_host_config(
            nano_cpus=round(cpu * 1e9),
            mem_limit=mem_bytes,
            memswap_limit=mem_bytes,  # no swap beyond the limit
            network_mode="none",
            init=True,  # an init as PID 1: signals work and zombies are reaped
        )
        labels = {
            LABEL_KERNEL: kernel_id,
            LABEL_SESSION: session_id,
            LABEL_AGENT: self.agent_id,
            LABEL_CPU: str(cpu),
            LABEL_MEM: str(mem_bytes),
        }
        try:
            created = await self._call(
                self.api.create_container,
                image,
                command=list(command or DEFAULT_COMMAND),
                labels=labels,
                host_config=host_config,
                name=self._name(kernel_id),
            )
        except docker.errors.ImageNotFound as e:
            raise KernelCreateError(kernel_id, f"image {image} is not on this host: pull it") from e
        except docker.errors.APIError as e:
            if e.status_code == 409 and (existing := await self._containers(kernel_id)):
                raise KernelExists(kernel_id, existing[0]["Id"]) from e
            raise KernelCreateError(kernel_id, str(e.explanation or e)) from e
        container_id: str = created["Id"]
        try:
            await self._call(self.api.start, container_id)
        except docker.errors.APIError as e:
            with contextlib.suppress(docker.errors.APIError):
                await self._call(self.api.remove_container, container_id, force=True)
            raise KernelCreateError(kernel_id, f"start failed: {e.explanation or e}") from e
        return container_id

    async def destroy(self, kernel_id: str) -> bool:
        found = await self._containers(kernel_id)
        for c in found:
            with contextlib.suppress(docker.errors.NotFound):  # gone meanwhile: fine
                await self._call(self.api.remove_container, c["Id"], force=True)
        return bool(found)

    async def list_kernels(self) -> list[KernelContainer]:
        return [
            KernelContainer(
                kernel_id=c["Labels"][LABEL_KERNEL],
                session_id=c["Labels"].get(LABEL_SESSION, ""),
                container_id=c["Id"],
                image=c["Image"],
                running=c["State"] == "running",
                cpu=float(c["Labels"].get(LABEL_CPU, 0)),
                mem_bytes=int(c["Labels"].get(LABEL_MEM, 0)),
            )
            for c in await self._containers()
            if LABEL_KERNEL in c["Labels"]
        ]

    async def close(self) -> None:
        self.api.close()
