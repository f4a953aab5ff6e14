"""What a registry says an image is now: its manifest's digest and the sum of its layers' sizes.

The prepull loop asks for every image a policy lists (``repo:latest`` included) at each round:
an image no agent has held gets its size from here, and a tag that now names another manifest
than the one an agent holds is pulled again there.  One GET of
``/v2/<repository>/manifests/<tag>`` (Docker's and OCI's manifest types accepted; an index or
manifest list is followed to its linux/<this machine's arch> manifest, its digest kept as the
tag's: the digest Docker records for the pull), with anonymous bearer tokens when the registry
asks (``WWW-Authenticate: Bearer``).  HTTP for loopback hosts and ``--insecure-registry``
ones, HTTPS otherwise.

Nothing from the wire is trusted: a reply over ``MAX_MANIFEST`` bytes, not JSON, whose digest
does not match its bytes, or without sizes is refused with a ``RegistryError`` saying so.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import platform
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from email.message import Message
from typing import Any

from domain.image_ref import canonical

MAX_MANIFEST = 4 * 1024 * 1024  # distribution's own limit for a manifest
MAX_TOKEN = 64 * 1024
MAX_LAYERS = 1000
TIMEOUT_S = 10.0
DOCKER_HUB = "registry-1.docker.io"
ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
    )
)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}
_LOOPBACK = re.compile(r"^(localhost|127\.\d+\.\d+\.\d+|\[::1\])(:\d+)?$")


class RegistryError(Exception):
    def __init__(self, image: str, reason: str) -> None:
        super().__init__(f"registry lookup of {image}: {reason}")
        self.image = image
        self.reason = reason


@dataclass(frozen=True)
class RemoteImage:
    image: str
    digest: str  # the manifest (or index) digest the tag names now
    size_bytes: int  # the sum of the layers' sizes (compressed, as the registry stores them)


def manifest_url(image: str, insecure: Iterable[str] = ()) -> str:
    """The manifest URL of a canonical reference (its digest if it has one, else its tag)."""
    name = canonical(image)
    name, _, digest = name.partition("@")
    host, _, rest = name.partition("/")
    repository, tag = (rest, "") if digest else rest.rsplit(":", 1)
    scheme = "http" if _LOOPBACK.match(host) or host in set(insecure) else "https"
    if host == "docker.io":
        host = DOCKER_HUB
    return f"{scheme}://{host}/v2/{repository}/manifests/{digest or tag}"


def layers_size(doc: Mapping[str, Any]) -> int:
    """The sum of an image manifest's layer sizes; ValueError naming what is wrong."""
    layers = doc.get("layers")
    if not isinstance(layers, list):
        if "fsLayers" in doc:
            raise ValueError("a schema 1 manifest: it has no layer sizes")
        raise ValueError("the manifest has no 'layers' list")
    if len(layers) > MAX_LAYERS:
        raise ValueError(f"{len(layers)} layers (more than {MAX_LAYERS})")
    total = 0
    for i, layer in enumerate(layers):
        size = layer.get("size") if isinstance(layer, dict) else None
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 2**50:
            raise ValueError(f"layers[{i}].size is not a byte count: {size!r:.40}")
        total += size
    return total


def pick_platform(doc: Mapping[str, Any], arch: str | None = None) -> str:
    """The digest of an index's linux/``arch`` manifest; ValueError if it has none."""
    arch = arch or _ARCH.get(platform.machine(), platform.machine())
    entries = doc.get("manifests")
    if not isinstance(entries, list) or len(entries) > MAX_LAYERS:
        raise ValueError("the index has no usable 'manifests' list")
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        plat = entry.get("platform")
        digest = entry.get("digest")
        if (
            isinstance(plat, dict)
            and plat.get("os") == "linux"
            and plat.get("architecture") == arch
            and isinstance(digest, str)
            and _DIGEST.match(digest)
        ):
            return digest
    raise ValueError(f"the index has no linux/{arch} manifest")


def _bearer(challenge: str) -> dict[str, str] | None:
    """The parameters of a ``Bearer realm="...",service="...",scope="..."`` challenge."""
    scheme, _, params = challenge.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return dict(re.findall(r'(\w+)="([^"]*)"', params))


def _read(reply: Any, limit: int, what: str) -> bytes:
    length = reply.headers.get("Content-Length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ValueError(f"{what} of {length} bytes (more than {limit}): refused")
    body: bytes = reply.read(limit + 1)
    if len(body) > limit:
        raise ValueError(f"{what} larger than {limit} bytes: refused")
    return body


class RegistryClient:
    def __init__(self, insecure: Iterable[str] = (), timeout_s: float = TIMEOUT_S) -> None:
        self.insecure = frozenset(insecure)
        self.timeout_s = timeout_s

    async def resolve(self, image: str) -> RemoteImage:
        """The manifest digest ``image`` names now and its layers' bytes; RegistryError why not."""
        return await asyncio.to_thread(self._resolve, image)

    def _resolve(self, image: str) -> RemoteImage:
        url = manifest_url(image, self.insecure)
        try:
            digest, doc = self._manifest(url)
            if "manifests" in doc:  # an index: its entry for this platform holds the layers
                top = digest
                _, inner = self._manifest(url.rsplit("/", 1)[0] + "/" + pick_platform(doc))
                return RemoteImage(image, top, layers_size(inner))
            return RemoteImage(image, digest, layers_size(doc))
        except urllib.error.HTTPError as e:
            reason = "not found in the registry" if e.code == 404 else f"HTTP {e.code} {e.reason}"
            raise RegistryError(image, f"{reason} ({url})") from None
        except (urllib.error.URLError, OSError) as e:
            raise RegistryError(image, f"unreachable: {getattr(e, 'reason', e)} ({url})") from None
        except ValueError as e:
            raise RegistryError(image, f"{e} ({url})") from None

    def _manifest(self, url: str) -> tuple[str, dict[str, Any]]:
        body, headers = self._get(url)
        actual = "sha256:" + hashlib.sha256(body).hexdigest()
        digest = headers.get("Docker-Content-Digest") or actual
        if not _DIGEST.match(digest):
            raise ValueError(f"Docker-Content-Digest {digest[:80]!r} is not a sha256 digest")
        if digest != actual:
            raise ValueError(f"the manifest's bytes hash to {actual}, not {digest}")
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"the manifest is not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise ValueError("the manifest is not a JSON object")
        return digest, doc

    def _get(self, url: str) -> tuple[bytes, Message]:
        token: str | None = None
        for attempt in range(2):
            request = urllib.request.Request(url, headers={"Accept": ACCEPT})
            if token:
                request.add_header("Authorization", f"Bearer {token}")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                    return _read(reply, MAX_MANIFEST, "a manifest"), reply.headers
            except urllib.error.HTTPError as e:
                challenge = _bearer(e.headers.get("WWW-Authenticate", "")) if e.headers else None
                if e.code != 401 or attempt or challenge is None or "realm" not in challenge:
                    raise
                token = self._token(challenge)
        raise AssertionError("unreachable")

    def _token(self, challenge: Mapping[str, str]) -> str:
        realm = challenge["realm"]
        if not realm.startswith(("https://", "http://")):
            raise ValueError(f"the token realm {realm[:80]!r} is not an HTTP URL")
        query = urllib.parse.urlencode(
            {k: v for k, v in challenge.items() if k in ("service", "scope")}
        )
        with urllib.request.urlopen(f"{realm}?{query}", timeout=self.timeout_s) as reply:
            body = _read(reply, MAX_TOKEN, "a token reply")
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError("the token reply is not JSON") from None
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise ValueError("the token reply has no token")
        return token
