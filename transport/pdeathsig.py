"""Child processes that die with their parent, however it ends (Linux's PR_SET_PDEATHSIG).

A parent killed with SIGKILL runs no cleanup, so only the kernel can end its children. The
signal fires when the *thread* that forked the child ends, not the process: spawn from the main
thread (the event loop's, under ``asyncio.run``), never from ``asyncio.to_thread`` or a pool.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class NoParentDeathSignal(RuntimeError):
    """This system cannot tie a child's life to its parent's."""


def die_with_parent(sig: signal.Signals) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when this process (its
    main thread) ends. Raises NoParentDeathSignal off Linux or off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        raise NoParentDeathSignal(
            "spawn from the main thread: PR_SET_PDEATHSIG would fire when this thread ends"
        )
    prctl = _prctl()
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _prctl() -> Callable[..., int]:
    if not sys.platform.startswith("linux"):
        raise NoParentDeathSignal(
            f"this needs Linux (prctl PR_SET_PDEATHSIG) so that child processes end with their"
            f" parent; this is {sys.platform}: run the processes under a supervisor instead"
        )
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError) as e:
        raise NoParentDeathSignal(
            f"this C library has no prctl ({e}): child processes cannot be made to end with"
            " their parent"
        ) from None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return prctl
