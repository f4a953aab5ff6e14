"""Pulling an image: the daemon's errors classified, references split, and one pull in a
thread of its own whose progress lines become per-layer PullProgress."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import docker
import docker.errors
import requests
from docker.utils import parse_repository_tag

from agent.runtime.base import (
    ImageNotFound,
    ProgressCallback,
    PulledImage,
    PullError,
    PullProgress,
    TransientPullError,
    Unauthorized,
)
from agent.runtime.docker_client import API_VERSION
from domain.image_ref import canonical_or_same, repository_of

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
    # The engine lists Docker Hub repositories in short form (python@sha256:...): compare
    # canonical names.
    repo = repository_of(canonical_or_same(image))[0]
    for rd in attrs.get("RepoDigests") or []:
        name, _, digest = rd.partition("@")
        if repository_of(canonical_or_same(name))[0] == repo:
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
