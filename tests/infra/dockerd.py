"""Start a private Docker Engine (``dockerd``) for the tests, or use one named by HOIST_DOCKER_HOST.

The daemon gets its own data-root, exec-root (where its managed containerd lives), pidfile and
socket under one temp dir, so it never clashes with a system daemon or another test session.
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import docker

INSTALL_HINT = "run: apt-get install -y docker.io"
API_VERSION = "1.41"  # Docker 20.10 (Debian bookworm's docker.io); newer daemons still accept it
# The engine's own words once its address pools are used up (Docker 20.10's; later ones').
NO_POOL = re.compile(
    "could not find an available, non-overlapping IPv4 address pool"
    "|all predefined address pools have been fully subnetted"
)
# The private daemon's networks: 8 of /24 (the default pools fit about 31), so a test that needs
# more networks than the pools hold (to show it does not) needs a few containers, not dozens.
POOLS, POOL_SIZE = 8, 24
# Where they are taken from: 10.0.0.0/8 unless the host routes into all of it (the default pools
# of other daemons on the host are 172.17-31.x and 192.168.x), then the next range.
POOL_RANGES = tuple(
    ipaddress.IPv4Network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
)


def _host_routes() -> list[ipaddress.IPv4Network]:
    """The host's IPv4 routes but the default one (little-endian hex in /proc/net/route)."""
    routes = []
    try:
        lines = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return routes
    for line in lines:
        fields = line.split()
        dest, mask = (ipaddress.IPv4Address(bytes.fromhex(f)[::-1]) for f in (fields[1], fields[7]))
        if int(mask):
            routes.append(ipaddress.IPv4Network(f"{dest}/{mask}", strict=False))
    return routes


def address_pool_base(pools: int = POOLS) -> str:
    """A random block of ``pools`` /24s (rounded up to a power of two; 8: a /21) that no route of
    the host's overlaps, from the first of POOL_RANGES that has one: the daemons of other test
    runs on this host take none of its pools, and it takes none of theirs."""
    most = POOL_RANGES[0].num_addresses >> (32 - POOL_SIZE)
    if not 1 <= pools <= most:
        raise ValueError(f"{pools} address pools: give 1 to {most} (the /24s of 10.0.0.0/8)")
    prefix = POOL_SIZE - (pools - 1).bit_length()
    routes = _host_routes()
    fit = [r for r in POOL_RANGES if r.prefixlen <= prefix]
    for pool_range in fit:
        count, step = 1 << (prefix - pool_range.prefixlen), 1 << (32 - prefix)
        first = int(pool_range.network_address)
        for i in random.sample(range(count), count):  # every block, in a random order
            block = ipaddress.IPv4Network((first + i * step, prefix))
            if not any(block.overlaps(r) for r in routes):
                return str(block)
    raise RuntimeError(
        f"no /{prefix} for the test daemon's {pools} address pools: the host routes into every"
        f" one of {', '.join(map(str, fit))} (/proc/net/route)"
    )


def free_address_pools(url: str, limit: int = 64) -> int:
    """How many more networks the engine at ``url`` can make now: it makes them until the engine
    has no address pool left, then removes them. A test that shows some use of networks does
    not run out of pools uses more than this (the private daemon's: 8; a default engine: ~31)."""
    client = docker.APIClient(base_url=url, version=API_VERSION, timeout=30)
    made: list[str] = []
    try:
        while len(made) <= limit:
            try:
                made.append(client.create_network(f"hoist-pools-{os.getpid()}-{len(made)}")["Id"])
            except docker.errors.APIError as e:
                if NO_POOL.search(str(e.explanation or e)):
                    return len(made)
                raise
        raise RuntimeError(f"the engine at {url} makes more than {limit} networks")
    finally:
        for n in made:
            client.remove_network(n)
        client.close()


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
            "--default-address-pool", f"base={address_pool_base()},size={POOL_SIZE}",
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
