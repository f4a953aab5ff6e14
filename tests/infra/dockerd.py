"""Start a private Docker Engine (``dockerd``) for the tests, or use one named by HOIST_DOCKER_HOST.

The daemon gets its own data-root, exec-root (where its managed containerd lives), pidfile and
socket under one temp dir, so it never clashes with a system daemon or another test session.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import docker

INSTALL_HINT = "run: apt-get install -y docker.io"
API_VERSION = "1.41"  # Docker 20.10 (Debian bookworm's docker.io); newer daemons still accept it


def ping(url: str, timeout: float = 2.0) -> bool:
    try:
        client = docker.APIClient(base_url=url, version=API_VERSION, timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


class DockerDaemon:
    """One ``dockerd``: vfs storage, no iptables, no bridge (containers use network none)."""

    def __init__(self, root: Path | None = None) -> None:
        # A short path under /tmp: unix socket paths are limited to 108 bytes.
        self.root = Path(root or tempfile.mkdtemp(prefix="hoist-dockerd-"))
        self.socket = self.root / "docker.sock"
        self.log_file = self.root / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 60.0) -> DockerDaemon:
        binary = shutil.which("dockerd")
        if binary is None or os.geteuid() != 0:
            self.stop()  # removes the temp dir
            raise RuntimeError(
                f"dockerd not found on PATH; {INSTALL_HINT}"
                if binary is None
                else "dockerd needs root: run the docker tests as root"
            )
        cmd = [
            binary,
            "--data-root", str(self.root / "data"),
            "--exec-root", str(self.root / "exec"),
            "--pidfile", str(self.root / "dockerd.pid"),
            "--host", self.url,
            "--storage-driver", "vfs",
            "--iptables=false",
            "--bridge=none",
            # Kernels run busybox sleep; don't wait 15 s per container at shutdown.
            "--shutdown-timeout", "2",
        ]  # fmt: skip
        with open(self.log_file, "ab") as log:
            # Own session: a Ctrl-C on pytest must not kill dockerd before it cleans up.
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not (self.socket.exists() and ping(self.url)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"dockerd did not start (exit code {self.proc.returncode}); "
                    f"log {self.log_file}:\n{self.log_tail()}"
                )
            time.sleep(0.1)
        return self

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def _remove_networks(self) -> None:
        """A user-defined network's bridge lives in the host's namespace and outlives the daemon
        (and its data-root): left behind, such bridges take the default address pools (about
        30 networks) from every later daemon on the host."""
        try:
            client = docker.APIClient(base_url=self.url, version=API_VERSION, timeout=30)
        except Exception:
            return
        try:
            for c in client.containers(all=True):
                client.remove_container(c["Id"], force=True)
            for n in client.networks():
                if n["Name"] not in ("bridge", "host", "none"):
                    client.remove_network(n["Id"])
        except Exception:
            pass  # best effort: the daemon is going away
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._remove_networks()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> DockerDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
