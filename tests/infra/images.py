"""Real images from busybox (no internet needed), written straight to the test registry.

An image is a busybox rootfs layer plus ``pad_layers`` layers of random bytes (random, so they
don't compress), each a gzip'd tar as ``docker push`` uploads it, with a config and a schema-2
manifest. They go to the registry through its HTTP API: a build by the daemon (the legacy builder
copies every earlier layer for each step on vfs, then compresses it again for the push) took
seconds per image, and the daemon never holds the image, so the first pull really downloads.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import re
import tarfile
from pathlib import Path
from urllib.parse import urljoin

import docker
import docker.errors
import requests

from tests.infra.dockerd import API_VERSION
from tests.infra.registry import Registry

BUSYBOX = Path("/bin/busybox")
INSTALL_HINT = "run: apt-get install -y busybox-static"
APPLETS = (
    *("sh", "sleep", "ls", "cat", "echo", "true", "false", "env", "ps", "kill", "id"),
    # For the runtime's tests: a web server and client, name lookups, memory hogs, files.
    *("httpd", "wget", "ping", "nc", "head", "dd", "hostname", "tr", "yes", "mkdir", "pwd"),
)
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG = "application/vnd.docker.container.image.v1+json"
LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}


def _tar(entries: list[tarfile.TarInfo], data: dict[str, bytes]) -> bytes:
    """A layer's tar: fixed owners and times, so the same files give the same layer (the
    busybox layer is one blob in every image, as a cached build made it)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info in entries:
            tar.addfile(info, io.BytesIO(data[info.name]) if info.name in data else None)
    return buf.getvalue()


def _entry(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    return info


def rootfs_tar() -> bytes:
    """A layer of /bin/busybox (statically linked) plus symlinks for common applets."""
    if not BUSYBOX.exists():
        raise RuntimeError(f"{BUSYBOX} not found; {INSTALL_HINT}")
    binary = BUSYBOX.read_bytes()
    entries = [
        _entry("bin", tarfile.DIRTYPE, 0o755),
        _entry("bin/busybox", tarfile.REGTYPE, 0o755, len(binary)),
        *(_entry(f"bin/{a}", tarfile.SYMTYPE, 0o777, link="busybox") for a in APPLETS),
    ]
    return _tar(entries, {"bin/busybox": binary})


def pad_tar(index: int, size: int) -> bytes:
    """A layer of ``/pad/pad{index}.bin``: ``size`` random bytes."""
    name = f"pad/pad{index}.bin"
    entries = [
        _entry("pad", tarfile.DIRTYPE, 0o755),
        _entry(name, tarfile.REGTYPE, 0o644, size),
    ]
    return _tar(entries, {name: os.urandom(size)})


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _push_blob(http: requests.Session, registry: Registry, repository: str, data: bytes) -> str:
    """A monolithic upload (POST for a location, PUT of the bytes with their digest)."""
    digest = _digest(data)
    started = http.post(f"{registry.url}/v2/{repository}/blobs/uploads/", timeout=30)
    if started.status_code != 202:
        raise RuntimeError(f"upload to {repository} refused: {started.status_code} {started.text}")
    location = urljoin(registry.url, started.headers["Location"])
    sep = "&" if "?" in location else "?"
    done = http.put(
        f"{location}{sep}digest={digest}",
        data=data,
        headers={"Content-Type": "application/octet-stream"},
        timeout=60,
    )
    if done.status_code != 201:
        raise RuntimeError(f"upload of {digest} refused: {done.status_code} {done.text}")
    return digest


def build_image(
    registry: Registry,
    name: str,
    tag: str = "1",
    pad_mb: float = 1,
    pad_layers: int = 1,
    busybox: bool = True,
) -> str:
    """Put ``registry/name:tag`` in the registry (not on any daemon); returns the reference.
    Without ``busybox`` the image shares no layer with any other (it cannot run, only pull)."""
    pad_bytes = int(pad_mb * 1024 * 1024)
    # (tar, gzip level): random bytes are stored (deflating them gains nothing, slowly).
    layers = [(rootfs_tar(), 6)] if busybox else []
    for i in range(pad_layers):
        size = pad_bytes // pad_layers + (pad_bytes % pad_layers if i == 0 else 0)
        layers.append((pad_tar(i, size), 0))
    config = {
        "architecture": _ARCH.get(platform.machine(), platform.machine()),
        "os": "linux",
        "config": {"Env": [PATH_ENV], "Cmd": ["sleep", "infinity"]},
        "rootfs": {"type": "layers", "diff_ids": [_digest(tar) for tar, _ in layers]},
        "history": [{"created_by": f"hoist test layer {i}"} for i in range(len(layers))],
    }
    config_bytes = json.dumps(config).encode()
    with requests.Session() as http:
        blobs = []
        for tar, level in layers:
            blob = gzip.compress(tar, compresslevel=level, mtime=0)
            digest = _push_blob(http, registry, name, blob)
            blobs.append({"mediaType": LAYER, "size": len(blob), "digest": digest})
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {
                "mediaType": CONFIG,
                "size": len(config_bytes),
                "digest": _push_blob(http, registry, name, config_bytes),
            },
            "layers": blobs,
        }
        put = http.put(
            f"{registry.url}/v2/{name}/manifests/{tag}",
            data=json.dumps(manifest).encode(),
            headers={"Content-Type": MANIFEST},
            timeout=30,
        )
        if put.status_code != 201:
            raise RuntimeError(f"manifest of {name}:{tag} refused: {put.status_code} {put.text}")
    return f"{registry.host}/{name}:{tag}"


def remove_local(engine: str, ref: str) -> None:
    """Remove every local tag of ``ref``'s repository, whatever registry or proxy it came through
    (``127.0.0.1:5000/hoist/big:1`` also removes ``127.0.0.1:6000/hoist/big:1``), so the next
    pull really downloads instead of finding shared layers "Already exist". Containers using
    them must be gone first."""
    repository = ref.rsplit(":", 1)[0].split("/", 1)[1] if "/" in ref else ref.rsplit(":", 1)[0]
    client = docker.APIClient(base_url=engine, version=API_VERSION)
    try:
        for image in client.images(all=True):
            # Tags and digest references (an image pulled by digest has no tag) alike.
            names = (image.get("RepoTags") or []) + (image.get("RepoDigests") or [])
            if any(
                re.split(r"[:@]", n.split("/", 1)[-1], maxsplit=1)[0] == repository for n in names
            ):
                try:
                    client.remove_image(image["Id"], force=True)
                except docker.errors.ImageNotFound:
                    pass
    finally:
        client.close()


def remove_all_local(engine: str) -> None:
    """Remove every image from the daemon, for a test that counts what the engine holds (image
    GC): images other tests pulled would otherwise take part."""
    client = docker.APIClient(base_url=engine, version=API_VERSION)
    try:
        for image in client.images():
            try:
                client.remove_image(image["Id"], force=True)
            except docker.errors.ImageNotFound:
                pass
    finally:
        client.close()
