"""The manager's registry client (services.manager.registry): the real registry's manifests give
a digest and the sum of the layers' sizes; a registry that answers garbage, too much, or bytes
that do not hash to their digest is refused with a reason, never a crash."""

from __future__ import annotations

import asyncio
import hashlib
import json
import platform
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from services.manager.registry import (
    MAX_MANIFEST,
    RegistryClient,
    RegistryError,
    manifest_url,
)
from tests.infra.images import MANIFEST, build_image
from tests.infra.registry import Registry

INDEX = "application/vnd.oci.image.index.v1+json"


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def test_manifest_urls_follow_docker_s_rules() -> None:
    assert manifest_url("python") == (
        "https://registry-1.docker.io/v2/library/python/manifests/latest"
    )
    assert (
        manifest_url("127.0.0.1:5000/hoist/x")
        == "http://127.0.0.1:5000/v2/hoist/x/manifests/latest"
    )
    assert manifest_url("reg.lan:5000/a/b:2", ["reg.lan:5000"]) == (
        "http://reg.lan:5000/v2/a/b/manifests/2"
    )
    d = "sha256:" + "a" * 64
    assert manifest_url(f"reg.example.com/a@{d}") == f"https://reg.example.com/v2/a/manifests/{d}"


async def test_the_real_registry_gives_the_digest_and_the_layers_bytes(registry: Registry) -> None:
    ref = build_image(registry, "hoist/sized", "latest", pad_mb=3, pad_layers=2)
    reply = await asyncio.to_thread(
        requests.get,
        f"{registry.url}/v2/hoist/sized/manifests/latest",
        headers={"Accept": MANIFEST},
        timeout=10,
    )
    manifest = reply.json()
    resolved = await RegistryClient().resolve(ref)
    assert resolved.digest == reply.headers["Docker-Content-Digest"] == _digest(reply.content)
    assert resolved.size_bytes == sum(layer["size"] for layer in manifest["layers"]) > 3 * 1024**2
    with pytest.raises(RegistryError, match="not found in the registry"):
        await RegistryClient().resolve(f"{registry.host}/hoist/nothing-here:1")


Reply = tuple[int, dict[str, str], bytes]


class Hostile:
    """A local "registry" answering each path with what the test put in ``replies``."""

    def __init__(self) -> None:
        self.replies: dict[str, Reply] = {}
        replies = self.replies

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, headers, body = replies.get(self.path, (404, {}, b"{}"))
                self.send_response(status)
                for k, v in headers.items():
                    if v:
                        self.send_header(k, v)
                if "Content-Length" not in headers:  # "": none, the reply ends at the close
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.handle_error = lambda *_: None  # type: ignore[method-assign]  # client hung up
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def manifest(self, name: str, body: bytes, **headers: str) -> str:
        self.replies[f"/v2/{name}/manifests/1"] = (200, headers, body)
        return f"{self.host}/{name}:1"


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    h = Hostile()
    try:
        yield h
    finally:
        h.server.shutdown()
        h.server.server_close()


async def test_a_malformed_or_huge_reply_is_refused_with_its_reason(hostile: Hostile) -> None:
    client = RegistryClient(timeout_s=5)

    async def refused(ref: str) -> str:
        with pytest.raises(RegistryError) as e:
            await client.resolve(ref)
        return e.value.reason

    assert (await refused(hostile.manifest("a/notjson", b"<html>"))).startswith(
        "the manifest is not JSON"
    )
    huge = b"{" + b" " * MAX_MANIFEST + b"}"
    unsized = hostile.manifest("a/huge", huge, **{"Content-Length": ""})  # ends at the close
    assert "larger than 4194304 bytes: refused" in await refused(unsized)
    lying = hostile.manifest("a/lying", huge[:10], **{"Content-Length": str(10**12)})
    assert f"of {10**12} bytes (more than 4194304): refused" in await refused(lying)
    body = json.dumps({"layers": [{"size": 5}]}).encode()
    wrong = hostile.manifest("a/wrong", body, **{"Docker-Content-Digest": "sha256:" + "0" * 64})
    assert (await refused(wrong)).startswith(f"the manifest's bytes hash to {_digest(body)}")
    bad_size = json.dumps({"layers": [{"size": 5}, {"size": "lots"}]}).encode()
    assert (await refused(hostile.manifest("a/size", bad_size))).startswith(
        "layers[1].size is not a byte count: 'lots'"
    )
    schema1 = json.dumps({"schemaVersion": 1, "fsLayers": [{"blobSum": "x"}]}).encode()
    assert "schema 1 manifest" in await refused(hostile.manifest("a/old", schema1))
    index = json.dumps({"mediaType": INDEX, "manifests": [{"platform": {"os": "windows"}}]})
    assert "the index has no linux/" in await refused(hostile.manifest("a/idx", index.encode()))
    hostile.replies["/v2/a/down/manifests/1"] = (503, {}, b"")
    assert (await refused(f"{hostile.host}/a/down:1")).startswith("HTTP 503")
    assert (await refused("127.0.0.1:1/a/b:1")).startswith("unreachable:")
    # A good one through an index, for this platform: the index's digest, the image's layers.
    image = json.dumps({"layers": [{"size": 7}, {"size": 8}]}).encode()
    hostile.replies[f"/v2/a/multi/manifests/{_digest(image)}"] = (200, {}, image)
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    entry = {"digest": _digest(image), "platform": {"os": "linux", "architecture": arch}}
    top = json.dumps({"mediaType": INDEX, "manifests": [entry]}).encode()
    resolved = await client.resolve(hostile.manifest("a/multi", top))
    assert (resolved.digest, resolved.size_bytes) == (_digest(top), 15)
