"""A real `hoist up` stack (nats-server, manager, dummy agents) in a temp data dir, the `hoist`
command line against it, and a tmux terminal to see what a person sees."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from services.stack.natsserver import free_port

HOIST = str(Path(sys.executable).parent / "hoist")
MiB = 1024**2
# Images the test agents know: 240 MiB at 80 MiB/s, so a pull lasts ~3 s in 4 layers; big ones
# ~10 s, for a test that detaches and comes back mid-pull.
TEST_IMAGES = [f"test/image-{i}:1" for i in range(12)]
BIG_IMAGES = [f"test/big-{i}:1" for i in range(4)]
DUMMY_CONFIG = {
    "image_sizes": {
        **dict.fromkeys(TEST_IMAGES, 240 * MiB),
        **dict.fromkeys(BIG_IMAGES, 800 * MiB),
    },
    "default_size": None,
    "layers": 4,
    "bandwidth_bps": 80 * MiB,
    "tick_s": 0.1,
    "create_delay_s": 0.2,
}


@dataclass
class Stack:
    data_dir: Path
    proc: subprocess.Popen[str]
    log: Path
    images: Iterator[str]
    big_images: Iterator[str]

    def hoist(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """`hoist --data-dir D ARGS` without a terminal."""
        return subprocess.run(
            [HOIST, "--data-dir", str(self.data_dir), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )

    def creds(self, role: str) -> str:
        return self.hoist("creds", role).stdout.strip()

    def next_image(self) -> str:
        """An image no agent holds yet: every run of it pulls."""
        return next(self.images)

    def next_big_image(self) -> str:
        return next(self.big_images)


def start_stack(data_dir: Path, *args: str, timeout: float = 60) -> Stack:
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir.parent / "dummy.json"
    config.write_text(json.dumps(DUMMY_CONFIG))
    log = data_dir.parent / f"up-{uuid.uuid4().hex[:6]}.log"
    out = open(log, "w")
    proc = subprocess.Popen(
        [
            HOIST,
            "--data-dir",
            str(data_dir),
            "up",
            "--runtime",
            "dummy",
            "--nats-port",
            str(free_port()),
            "--dummy-config",
            str(config),
            *args,
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out.close()
    wait_for(lambda: "Running; Ctrl-C" in log.read_text() or proc.poll() is not None, timeout)
    if proc.poll() is not None:
        raise RuntimeError(f"hoist up exited {proc.returncode}:\n{log.read_text()}")
    return Stack(data_dir, proc, log, iter(TEST_IMAGES), iter(BIG_IMAGES))


def stop_stack(stack: Stack) -> int:
    if stack.proc.poll() is None:
        stack.proc.send_signal(signal.SIGTERM)
    return stack.proc.wait(60)


def wait_for(condition: Callable[[], object], timeout: float, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)


class Terminal:
    """A tmux session on its own server socket: type commands, read the screen."""

    def __init__(self, width: int = 160, height: int = 40) -> None:
        self.socket = f"hoist-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height))

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True
        ).stdout

    def type(self, line: str) -> None:
        self._tmux("send-keys", "-t", "t", line, "Enter")

    def ctrl_c(self) -> None:
        self._tmux("send-keys", "-t", "t", "C-c")

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "t")

    def clear(self) -> None:
        self._tmux("send-keys", "-t", "t", "clear", "Enter")
        self._tmux("clear-history", "-t", "t")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
