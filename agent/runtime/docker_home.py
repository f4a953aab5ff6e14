"""A kernel's dotfiles into its container's home (agent.runtime.base.HomeFile), between the
container's create and its start, so its command finds them.

Which home: ``HOME`` of the container's environment (the image's or the create's) if set,
else the home ``/etc/passwd`` in the container gives the image's ``User`` (root if none):
what Docker sets ``HOME`` to at start, and ``/`` as Docker does for a user the file does not
know (or an image without the file).  The files go in one tar through ``put_archive``, owned
by that user (uid and gid from ``/etc/passwd``, or numeric ``User``), with their parent
directories (mode 0755); a home the image lacks is made too, owned by the user.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import docker.errors

from agent.runtime.base import HomeFile

Call = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class HomeOwner:
    home: str
    uid: int = 0
    gid: int = 0


def parse_passwd(text: str) -> dict[str, tuple[int, int, str]]:
    """name and uid (as text) -> (uid, gid, home) of each well-formed line of /etc/passwd."""
    users: dict[str, tuple[int, int, str]] = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) < 7 or not parts[2].isdigit() or not parts[3].isdigit():
            continue
        entry = (int(parts[2]), int(parts[3]), parts[5] or "/")
        users.setdefault(parts[0], entry)
        users.setdefault(parts[2], entry)
    return users


def home_owner(user: str, env: Iterable[str], passwd: str | None) -> HomeOwner:
    """Where and as whom the files go, for the container's ``User`` and ``Env``: as Docker
    sets ``HOME`` at start (the user's passwd entry, root's if no user, else ``/``)."""
    name, _, group = (user or "").partition(":")
    users = parse_passwd(passwd or "")
    uid, gid, home = users.get(name or "root", (0, 0, "/"))
    if name.isdigit() and name not in users:
        uid = int(name)
    if group.isdigit():
        gid = int(group)
    for item in env:
        key, _, value = item.partition("=")
        if key == "HOME" and value.startswith("/"):
            home = value
    return HomeOwner(posixpath.normpath(home), uid, gid)


def home_tar(files: Sequence[HomeFile], owner: HomeOwner, *, with_home: bool = False) -> bytes:
    """The tar of ``files`` relative to the home (``with_home``: relative to ``/``, the home's
    own directories first, the home owned by the user), parents before children."""
    prefix = owner.home.strip("/") if with_home else ""
    buf = io.BytesIO()
    made: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add_dir(path: str, uid: int, gid: int) -> None:
            if path in made or not path:
                return
            made.add(path)
            info = tarfile.TarInfo(path)
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, gid
            tar.addfile(info)

        if prefix:
            steps = prefix.split("/")
            for i in range(1, len(steps)):
                add_dir("/".join(steps[:i]), 0, 0)
            add_dir(prefix, owner.uid, owner.gid)
        for f in files:
            parts = f.path.split("/")
            for i in range(1, len(parts)):
                add_dir(posixpath.join(prefix, *parts[:i]), owner.uid, owner.gid)
            info = tarfile.TarInfo(posixpath.join(prefix, f.path))
            info.size, info.mode, info.uid, info.gid = len(f.content), f.mode, owner.uid, owner.gid
            tar.addfile(info, io.BytesIO(f.content))
    return buf.getvalue()


async def read_file(call: Call, api: Any, container_id: str, path: str) -> str | None:
    """A small text file of the (created) container, or None if it has none."""
    try:
        stream, _ = await call(api.get_archive, container_id, path)
        data = await call(lambda: b"".join(stream))
    except docker.errors.NotFound:
        return None
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.next()
        extracted = None if member is None else tar.extractfile(member)
        return None if extracted is None else extracted.read().decode(errors="replace")


async def put_home_files(
    call: Call, api: Any, container_id: str, files: Sequence[HomeFile]
) -> HomeOwner | None:
    """Write ``files`` into the home of the created container (not started yet); where they
    went (None: no files).  docker.errors.APIError if the engine refuses."""
    if not files:
        return None
    config = (await call(api.inspect_container, container_id)).get("Config") or {}
    env = config.get("Env") or []
    user = config.get("User") or ""
    passwd = await read_file(call, api, container_id, "/etc/passwd")
    owner = home_owner(user, env, passwd)
    try:
        await call(api.put_archive, container_id, owner.home, home_tar(files, owner))
    except docker.errors.NotFound:  # the image has no such home: make it
        await call(api.put_archive, container_id, "/", home_tar(files, owner, with_home=True))
    return owner
