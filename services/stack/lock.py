"""One stack per data dir: an exclusive flock on ``DIR/stack.lock``.

The stack's processes inherit the locked file (``pass_fds``), and a flock lasts until the last
descriptor of its open file is closed, so the lock is held until the last process of the stack
is gone: a new `hoist up` can never start a second nats-server on the same store while an orphan
of the last one lives. Nothing unlocks explicitly: LOCK_UN would free the lock for the
inheritors too. The kernel drops it with its holders, so a crash leaves nothing to clean up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE = "stack.lock"


class DataDirLock:
    """The lock of one data dir; ``fd`` is what the stack's children inherit."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LOCK_FILE
        self.fd: int | None = None

    def try_lock(self) -> bool:
        """Take the lock if no process holds it; write this pid into the file for error
        messages. False if it is held (by a running, starting or dying stack)."""
        if self.fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return True

    def holder(self) -> int | None:
        """The pid of the `hoist up` that took the lock last (it may be gone, its children not)."""
        with contextlib.suppress(OSError, ValueError):
            return int(self.path.read_text().strip())
        return None

    def held(self) -> bool:
        """Whether some process holds the lock (a stack runs, starts or stops here). Probes
        with a shared lock, dropped at once: the file and its pid are left as they are."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def close(self) -> None:
        """Close this process's descriptor: the lock ends once the children's are closed too."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
