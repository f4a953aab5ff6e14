"""Build real images from busybox (no internet needed), push them to the test registry.

An image is a busybox rootfs layer plus ``pad_layers`` layers of random bytes (random, so they
don't compress), built with the daemon's legacy builder from ``FROM scratch`` + ``ADD``. After the
push the local copy is removed, so the next pull really downloads.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

import docker
import docker.errors

from tests.infra.dockerd import API_VERSION
from tests.infra.registry import Registry

BUSYBOX = Path("/bin/busybox")
INSTALL_HINT = "run: apt-get install -y busybox-static"
APPLETS = (
    *("sh", "sleep", "ls", "cat", "echo", "true", "false", "env", "ps", "kill", "id"),
    # For the runtime's tests: a web server and client, name lookups, memory hogs, files.
    *("httpd", "wget", "ping", "nc", "head", "dd", "hostname", "tr", "yes", "mkdir", "pwd"),
)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def rootfs_tar() -> bytes:
    """A tar of /bin/busybox (statically linked) plus symlinks for common applets."""
    if not BUSYBOX.exists():
        raise RuntimeError(f"{BUSYBOX} not found; {INSTALL_HINT}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(BUSYBOX, arcname="bin/busybox")
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
    return buf.getvalue()


def build_context(pad_bytes: int, pad_layers: int, busybox: bool = True) -> io.BytesIO:
    """A docker build context (tar) with a Dockerfile: one ADD per layer."""
    lines = ["FROM scratch"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if busybox:
            _add_bytes(tar, "rootfs.tar", rootfs_tar())
            lines.append("ADD rootfs.tar /")
        for i in range(pad_layers):
            size = pad_bytes // pad_layers + (pad_bytes % pad_layers if i == 0 else 0)
            _add_bytes(tar, f"pad{i}.bin", os.urandom(size))
            lines.append(f"ADD pad{i}.bin /pad/pad{i}.bin")
        lines.append('CMD ["sleep", "infinity"]')
        _add_bytes(tar, "Dockerfile", ("\n".join(lines) + "\n").encode())
    buf.seek(0)
    return buf


def build_image(
    engine: str,
    registry: Registry,
    name: str,
    tag: str = "1",
    pad_mb: float = 1,
    pad_layers: int = 1,
    busybox: bool = True,
) -> str:
    """Build ``registry/name:tag``, push it, remove the local copy; returns the reference.
    Without ``busybox`` the image shares no layer with any other (it cannot run, only pull)."""
    ref = f"{registry.host}/{name}:{tag}"
    client = docker.DockerClient(base_url=engine, version=API_VERSION, timeout=300)
    try:
        context = build_context(int(pad_mb * 1024 * 1024), pad_layers, busybox)
        client.images.build(fileobj=context, custom_context=True, tag=ref, rm=True, forcerm=True)
        for line in client.api.push(f"{registry.host}/{name}", tag=tag, stream=True, decode=True):
            if "error" in line:
                raise RuntimeError(f"push of {ref} failed: {line['error']}")
        client.images.remove(ref, force=True)
    finally:
        client.close()
    return ref


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
