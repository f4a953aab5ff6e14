"""agent.runtime.docker_home without a Docker Engine: which home and owner the dotfiles get,
and the tar that carries them (the Docker test sees a real container read them)."""

from __future__ import annotations

import io
import tarfile

from agent.runtime.base import HomeFile
from agent.runtime.docker_home import HomeOwner, home_owner, home_tar

PASSWD = "root:x:0:0:root:/root:/bin/sh\ndana:x:1000:1001:Dana:/home/dana:/bin/sh\nbad line\n"


def test_the_home_is_homes_env_else_the_users_passwd_entry_else_roots() -> None:
    assert home_owner("", [], PASSWD) == HomeOwner("/root", 0, 0)
    assert home_owner("", [], None) == HomeOwner("/", 0, 0)  # no /etc/passwd: Docker's "/"
    assert home_owner("dana", ["PATH=/bin"], PASSWD) == HomeOwner("/home/dana", 1000, 1001)
    assert home_owner("1000:5", [], PASSWD) == HomeOwner("/home/dana", 1000, 5)
    assert home_owner("2000", [], PASSWD) == HomeOwner("/", 2000, 0)  # Docker's own fallback
    assert home_owner("dana", ["HOME=/work/"], PASSWD) == HomeOwner("/work", 1000, 1001)


def test_the_tar_holds_the_files_and_their_parents_owned_by_the_user() -> None:
    files = [HomeFile(".config/git/config", b"[user]\n", 0o600), HomeFile(".bashrc", b"x")]
    owner = HomeOwner("/home/dana", 1000, 1001)
    with tarfile.open(fileobj=io.BytesIO(home_tar(files, owner))) as tar:
        members = {m.name: (m.isdir(), m.mode, m.uid, m.gid) for m in tar.getmembers()}
        config = tar.extractfile(".config/git/config")
        assert config is not None and config.read() == b"[user]\n"
    assert members == {
        ".config": (True, 0o755, 1000, 1001),
        ".config/git": (True, 0o755, 1000, 1001),
        ".config/git/config": (False, 0o600, 1000, 1001),
        ".bashrc": (False, 0o644, 1000, 1001),
    }
    with tarfile.open(fileobj=io.BytesIO(home_tar(files[1:], owner, with_home=True))) as tar:
        made = {m.name: (m.uid, m.isdir()) for m in tar.getmembers()}
    assert made == {
        "home": (0, True),
        "home/dana": (1000, True),
        "home/dana/.bashrc": (1000, False),
    }
