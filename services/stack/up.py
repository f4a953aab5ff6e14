"""The local stack behind `hoist up`: an embedded nats-server on the project's nats.conf with
generated credentials, the streams, the manager and N agents as child processes.

Everything lives in one data dir (which one: ``services/stack/home.py``): credentials (0600),
the JetStream store (so the log survives a restart), each process's log, and ``stack.json``
while the stack runs, which tells the other `hoist` commands where to connect.

Whatever ends `hoist up`, its processes end with it: Ctrl-C, SIGTERM and SIGHUP stop them in
order; SIGKILL leaves that to the kernel (PR_SET_PDEATHSIG,
``transport/pdeathsig.py``). They
share the data dir's lock (``services/stack_lock.py``), so no second stack starts on the same
store until the last of them is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, cast

from eventstore.store import StoreError, event_store
from services.stack import natsauth
from services.stack.lock import DataDirLock
from services.stack.natsserver import (
    CLUSTER_PORT_OFFSET,
    ClusterNode,
    NatsServer,
    cluster_nodes,
    free_port,
    port_free,
    urls,
    wait_for_port,
    wait_jetstream,
)
from transport import client, credentials, progress
from transport.client import Client
from transport.pdeathsig import NoParentDeathSignal, die_with_parent

DEFAULT_PORT = 4222
STATE_FILE = "stack.json"  # where a running stack says which port it listens on
PORT_FILE = "nats-port"  # the port this data dir's stack last used: `hoist up` uses it again
WEB_TOKEN_FILE = "web-token"  # the web view's access token (0600), new at each `hoist up`
NODES_FILE = "nats-nodes"  # how many nats-servers it ran (--nats-nodes): `hoist up` runs as many
SINGLE = "nats-server"  # the one node's name (its log: nats-server.log, its store: jetstream/)


def remembered_port(data_dir: Path) -> int:
    """The NATS port ``hoist up`` takes for ``data_dir`` when none is given: the one its stack
    last used (so `hoist up --data-dir D`, as `hoist down` advises, comes back where it was),
    else the default."""
    try:
        port = int((Path(data_dir) / PORT_FILE).read_text())
    except (OSError, ValueError):
        return DEFAULT_PORT
    return port if 0 < port < 65536 else DEFAULT_PORT


def remembered_nodes(data_dir: Path) -> int:
    """How many nats-servers ``hoist up`` runs for ``data_dir`` when not told: as many as its
    stack last ran (its log lives on them), else one."""
    try:
        nodes = int((Path(data_dir) / NODES_FILE).read_text())
    except (OSError, ValueError):
        return 1
    return nodes if nodes >= 1 else 1


def nats_log(data_dir: Path, name: str) -> Path:
    """The log of the stack's nats-server called ``name`` (nats-server, or nats-1 ..)."""
    return Path(data_dir) / f"{name}.log"


def is_nats(name: str) -> bool:
    """Whether a stack process's name is one of its nats-servers."""
    return name == SINGLE or (name.startswith("nats-") and name[5:].isdigit())


READY_TIMEOUT_S = 30.0
LOCK_WAIT_S = 5.0  # how long a new `hoist up` waits for a dying stack's processes to end

RuntimeName = Literal["docker", "dummy"]

# The dummy agents' "registry": images of realistic (compressed) sizes and a bandwidth that makes
# a pull last a few seconds, so progress is there to see. Unknown images are "not found".
DEMO_IMAGES = {
    "python:3.12-slim": 48 * 1024**2,
    "jupyter/scipy-notebook:2024-05": 1200 * 1024**2,
    "pytorch/pytorch:2.3.1-runtime": 3300 * 1024**2,
    "tensorflow/tensorflow:2.16.1-gpu": 2700 * 1024**2,
}
DEMO_IMAGE = {"dummy": "jupyter/scipy-notebook:2024-05", "docker": "python:3.12-slim"}
DUMMY_CONFIG = {
    "image_sizes": DEMO_IMAGES,
    "default_size": None,
    "layers": 4,
    "bandwidth_bps": 200 * 1024**2,
    "jitter": 0.25,
    "tick_s": 0.1,
    "create_delay_s": 0.5,
}


class StackError(Exception):
    """The stack cannot start or run as asked; the message says what to do."""


@dataclass
class StackInfo:
    """What a running stack tells other `hoist` commands (written to the data dir)."""

    url: str
    pid: int
    runtime: str = ""
    agents: list[str] = field(default_factory=list)
    nats_pid: int = 0  # signalled to reload its users when an agent is added
    pids: dict[str, int] = field(default_factory=dict)  # every process of the stack, by name
    stopping: bool = False  # a new `hoist up` waits for a stopping stack, refuses a running one
    docker_host: str = ""  # the docker agents' --docker-host ("": DOCKER_HOST or the default)
    web_url: str = ""  # the web view (its token: WEB_TOKEN_FILE); "": not started
    metrics: dict[str, str] = field(default_factory=dict)  # process -> its /metrics URL

    @classmethod
    def read(cls, data_dir: Path) -> StackInfo | None:
        path = data_dir / STATE_FILE
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        return cls(
            url=raw["url"],
            pid=raw["pid"],
            runtime=raw.get("runtime", ""),
            agents=list(raw.get("agents", [])),
            nats_pid=raw.get("nats_pid", 0),
            pids=dict(raw.get("pids", {})),
            stopping=raw.get("stopping", False),
            docker_host=raw.get("docker_host", ""),
            web_url=raw.get("web_url", ""),
            metrics=dict(raw.get("metrics", {})),
        )

    def web_login(self, data_dir: Path) -> str:
        """The web view's address with the token it takes now (a restarted web view gets a
        new one), which logs the local admin in; "" when the stack runs none."""
        if not self.web_url:
            return ""
        try:
            token = (data_dir / WEB_TOKEN_FILE).read_text().strip()
        except OSError:  # another user's stack: its address without the login
            return self.web_url
        return f"{self.web_url}?token={token}"

    def write(self, data_dir: Path) -> None:
        tmp = data_dir / f"{STATE_FILE}.tmp"  # readers never see half a file
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(data_dir / STATE_FILE)

    def alive(self) -> bool:
        """Whether the `hoist up` that wrote this still runs (a SIGKILLed one leaves the file)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def add_agent_user(data_dir: Path, info: StackInfo, agent_id: str) -> credentials.Credentials:
    """Give a new agent (one on another host, say) its NATS user on the running stack: new
    credentials, a rewritten auth.conf, and nats-server told to reload its config."""
    with natsauth.changing_credentials(data_dir):
        creds = natsauth.generate_credentials(data_dir, [agent_id])
        natsauth.write_auth_conf(data_dir, creds)
    # A new account: nats-server wires its imports only on the reload after the one that
    # made it (nats-server 2.15; tests/test_roles.py::test_an_agent_added_later...).
    reload_nats(data_dir, info)
    reload_nats(data_dir, info)
    return creds


def set_hoist_user(data_dir: Path, info: StackInfo, name: str, admin: bool) -> None:
    """Give Hoist user ``name`` (domain.user) its NATS user on the running stack, or change its
    admin grants, and have nats-server reload its users (no restart).  Written and reloaded
    even when nothing changed: running it again repairs what a crash between the writes and
    the reload left behind."""
    natsauth.set_user(data_dir, name, admin)
    reload_nats(data_dir, info)


def remove_hoist_user(data_dir: Path, info: StackInfo, name: str) -> None:
    """Remove Hoist user ``name``'s NATS user from the running stack and reload: nats-server
    closes the user's open connections when it reloads (they no longer authenticate)."""
    natsauth.remove_user(data_dir, name)
    reload_nats(data_dir, info)


def reload_nats(
    data_dir: Path, info: StackInfo, said: Callable[[str], None] = lambda _: None
) -> None:
    """Have every nats-server of the stack re-read its config (the users of the auth.conf
    they all include, the route certificates) and wait until each did; ``said`` hears of each
    node, reloaded or down. A node that is down reads it when it starts."""
    servers = {n: p for n, p in info.pids.items() if is_nats(n)} or {SINGLE: info.nats_pid}
    waiting = {}
    for name, pid in servers.items():
        log = nats_log(data_dir, name)
        mark = _log_mark(log)
        if not _running(pid):  # a zombie takes the signal and never reloads
            said(f"{name} is down: it reads its config when it starts")  # a cluster's node
            continue
        try:
            os.kill(pid, signal.SIGHUP)
        except ProcessLookupError:
            said(f"{name} is down: it reads its config when it starts")
            continue
        waiting[name] = (log, mark)
    deadline = time.monotonic() + 5
    for name, (log, mark) in waiting.items():
        while _RELOADED not in _logged_since(log, mark):
            if time.monotonic() > deadline:
                raise StackError(f"{name} did not reload its config within 5 s; see {log}")
            time.sleep(0.05)
        said(f"{name} reloaded")


_RELOADED = "Reloaded server configuration"


_METRICS_AT = re.compile(rb"metrics at http://[^:/]+:(\d+)/metrics")


def _metrics_port(log: Path) -> int:
    """The /metrics port a process said it bound (its log's last such line; 0: none)."""
    found = _METRICS_AT.findall(log.read_bytes())
    return int(found[-1]) if found else 0


def _log_files(log: Path) -> dict[int, Path]:
    """nats-server's ``log`` and its rotated files, by inode."""
    files = {}
    for path in log.parent.glob(f"{log.name}*"):
        with contextlib.suppress(FileNotFoundError):  # rotated away meanwhile
            files[path.stat().st_ino] = path
    return files


def _log_mark(log: Path) -> tuple[int, int, frozenset[int]]:
    """Where nats-server's ``log`` is now: its inode, its size, and every file of it."""
    try:
        stat = log.stat()
    except FileNotFoundError:
        return (0, 0, frozenset(_log_files(log)))
    return (stat.st_ino, stat.st_size, frozenset(_log_files(log)))


def _logged_since(log: Path, mark: tuple[int, int, frozenset[int]]) -> str:
    """What nats-server logged since ``mark``, also across a rotation (nats.conf rotates its
    log at 10 MB: a flood of refused publishes does that in a second): the marked file's rest,
    wherever it was renamed, and every file of the log begun since."""
    inode, offset, before = mark
    out = []
    for ino, path in _log_files(log).items():
        with contextlib.suppress(FileNotFoundError):
            if ino == inode:
                with path.open("rb") as f:
                    f.seek(offset)
                    out.append(f.read())
            elif ino not in before:
                out.append(path.read_bytes())
    return b"".join(out).decode(errors="replace")


def start_nats(
    data_dir: Path,
    port: int,
    agent_ids: list[str],
    lock: DataDirLock,
    *,
    nodes: int = 1,
    sync_always: bool = True,
) -> tuple[list[NatsServer], credentials.Credentials]:
    """Start nats-server on the project's nats.conf with this data dir's credentials (agents'
    users included: they are generated before the server reads auth.conf); ``nodes`` > 1: a
    JetStream cluster of that many, on consecutive ports from ``port`` (see store_dirs). Each
    holds the data dir's ``lock`` and ends with this process."""
    data_dir.mkdir(parents=True, exist_ok=True)
    # 0700: the read models, the stores and the logs hold every owner's sessions and commands
    data_dir.chmod(0o700)
    with natsauth.changing_credentials(data_dir):
        creds = natsauth.generate_credentials(data_dir, agent_ids)
    assert lock.fd is not None
    servers: list[NatsServer] = []
    cluster: list[ClusterNode] | list[None] = cluster_nodes(nodes, port) if nodes > 1 else [None]
    for node, store_dir in zip(cluster, store_dirs(data_dir, nodes), strict=True):
        config = natsauth.write_server_config(
            data_dir,
            creds,
            store_dir,
            node=node,
            nodes=cast("list[ClusterNode]", cluster) if node else None,
            sync_always=sync_always,
        )
        server = _OwnSessionNatsServer(
            store_dir,
            port=node.port if node else port,
            config=config,
            log_file=nats_log(data_dir, node.name if node else SINGLE),
        )
        server.lock_fd = lock.fd
        server.name = node.name if node else SINGLE
        try:
            servers.append(server.start())
        except RuntimeError:
            for started in servers:
                started.stop()
            raise
    return servers, creds


_GLOBAL_ACCOUNT = "$G"  # nats-server's account for users of no account: every user before


def convert_to_accounts(data_dir: Path, nodes: int) -> str | None:
    """Convert a data dir made before the accounts (issue 39) once, with its lock held and no
    nats-server running: the streams nats-server kept under its global account move to the log's
    account (natsauth.HOIST_ACCOUNT), and auth.conf is written anew (by start_nats) with the
    same users and passwords. What it did, to say; None when there was nothing to convert."""
    auth = Path(data_dir) / "auth.conf"
    old_auth = auth.exists() and "accounts" not in auth.read_text(errors="replace")
    moved = []
    for store in store_dirs(data_dir, nodes):
        old, new = (
            store / "jetstream" / _GLOBAL_ACCOUNT,
            store / "jetstream" / natsauth.HOIST_ACCOUNT,
        )
        if not old.is_dir() or new.exists():
            continue
        if nodes > 1:
            # A cluster's meta group assigned the streams to the global account: moving the
            # files would not move the assignments.
            raise StackError(
                f"{data_dir} holds a cluster's log made before NATS accounts (issue 39):"
                " hoist up cannot convert a cluster's store; start it with the Hoist that made it"
            )
        old.rename(new)
        moved.append(store)
    if not (old_auth or moved):
        return None
    said = "converted this data dir to NATS accounts (once): auth.conf now puts the log and the"
    said += " manager in account HOIST, the readers and each agent in accounts without JetStream"
    if moved:
        said += f"; the streams moved from nats-server's global account ({moved[0]})"
    return said


def store_dirs(data_dir: Path, nodes: int) -> list[Path]:
    """Where each node keeps JetStream's files: ``jetstream/`` for one node (as ever),
    ``nats-<i>/jetstream/`` for each node of a cluster."""
    if nodes == 1:
        return [Path(data_dir) / "jetstream"]
    return [Path(data_dir) / node.name / "jetstream" for node in cluster_nodes(nodes, 1)]


def ports(port: int, nodes: int) -> list[int]:
    """Every port the stack's nats-servers listen on: clients', and a cluster's routes."""
    if nodes == 1:
        return [port]
    return [p for n in cluster_nodes(nodes, port) for p in (n.port, n.port + CLUSTER_PORT_OFFSET)]


class _OwnSessionNatsServer(NatsServer):
    """nats-server in its own session: Ctrl-C in the terminal reaches `hoist up` only, which
    stops agents and manager before the server, so none of them sees the server vanish. If
    `hoist up` dies without stopping it, the kernel sends it SIGTERM (it shuts its store down
    cleanly); it holds the data dir's lock until it is gone."""

    lock_fd: int
    name: str = SINGLE

    def start(self) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        assert self.config is not None
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(self.lock_fd,),
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
        try:
            wait_for_port("127.0.0.1", self.port)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"nats-server did not start; see {self.log_file}") from None
        return self


async def connect(url: str, name: str) -> Client:
    return await client.connect(url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5)


def docker_reachable(docker_host: str | None) -> tuple[bool, str]:
    """(reachable, where): ping the Docker Engine the docker runtime would use."""
    version, where = docker_version(docker_host)
    return version is not None, where


def docker_version(docker_host: str | None) -> tuple[str | None, str]:
    """(the engine's version, or None when none answers; where, with why not)."""
    import docker

    where = docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = (
            docker.DockerClient(base_url=docker_host, timeout=3)
            if docker_host
            else docker.from_env(timeout=3)
        )
        try:
            version = str(client.version().get("Version", "?"))
        finally:
            client.close()
    except Exception as e:  # any failure means the same thing here: no engine to use
        return None, f"{where} ({type(e).__name__})"
    return version, where


def _port_in_use(port: int) -> str:
    message = f"port {port} is in use: pick another with --nats-port"
    held = stack_on_port(port)
    if held is None:
        return message
    pid, data_dir = held  # the usual case: a stack started from elsewhere, named by its data dir
    return (
        f"{message}; it is the Hoist stack in {data_dir} (nats-server pid {pid}): use it with"
        f" --data-dir {data_dir}, or stop it with `hoist down --data-dir {data_dir}`"
    )


_STACK_CONFIG = re.compile(r"/nats(-\d+)?\.conf$")  # a stack's node config, in its data dir


def stack_on_port(port: int) -> tuple[int, Path] | None:
    """(pid, data dir) of a stack's nats-server listening on ``port`` (its command line says
    both: ``-p PORT -c DIR/nats.conf``), or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if not args or Path(args[0]).name != "nats-server":
            continue
        flags = dict(zip(args[1::2], args[2::2], strict=False))
        config = flags.get("-c", "")
        if flags.get("-p") == str(port) and _STACK_CONFIG.search(config):
            return int(entry.name), Path(config).parent
    return None


@dataclass
class Child:
    """A process of the stack, its output in a log file of the data dir."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    ready_line: str
    module_args: list[str]  # what it runs (python -m ...), to start it again as it was
    env: dict[str, str] | None = None
    started_at: float = field(default_factory=time.monotonic)

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def is_manager(name: str) -> bool:
    """A stack child's name is a manager's (``manager``, ``manager-2``, ...)."""
    return name == "manager" or name.startswith("manager-")


def already_running(data_dir: Path) -> str | None:
    """Why a `hoist up` in ``data_dir`` is refused, said before anything slower is checked (a
    Docker Engine): a stack runs there; None if none does (the lock still decides at start)."""
    data_dir = data_dir.resolve()
    info = StackInfo.read(data_dir)
    if info is None or not info.alive() or info.stopping:
        return None
    return _runs_here(data_dir, info)


def _runs_here(data_dir: Path, info: StackInfo) -> str:
    return (
        f"a stack already runs in {data_dir} (hoist up pid {info.pid}, {info.url}):"
        f" stop it with `hoist down --data-dir {data_dir}` (or Ctrl-C in its"
        f" terminal, or `kill {info.pid}`), or use another --data-dir"
    )


class Stack:
    """nats-server, the manager and the agents of one data dir."""

    def __init__(
        self,
        data_dir: Path,
        *,
        nats_port: int = DEFAULT_PORT,
        agents: int = 2,
        runtime: RuntimeName = "dummy",
        docker_host: str | None = None,
        dummy_config: dict[str, object] | None = None,
        slots: Sequence[str] = (),
        web: bool = True,
        web_host: str = "127.0.0.1",
        web_port: int = 0,
        nats_nodes: int = 1,
        sync_always: bool = True,
        managers: int = 1,
    ) -> None:
        if agents < 0:
            raise StackError(f"--agents must be >= 0, got {agents}")
        if managers < 1:
            raise StackError(f"--managers must be >= 1, got {managers}")
        self.managers = managers
        if nats_nodes < 1 or nats_nodes == 2:
            raise StackError(
                f"--nats-nodes must be 1, or 3 or more (a cluster needs a majority to go on"
                f" after a node's loss: 2 of 3), got {nats_nodes}"
            )
        self.data_dir = data_dir.resolve()
        self.nats_port = nats_port
        self.agent_ids = [f"agent-{i}" for i in range(1, agents + 1)]
        self.runtime = runtime
        self.docker_host = docker_host
        self.dummy_config = dummy_config or DUMMY_CONFIG
        self.slots = list(slots)  # "gpu=2": each agent's --slot (it checks them)
        self.web = web
        self.web_host = web_host
        self.web_port = web_port  # 0: a free one, picked at start
        self.web_token = ""
        self.metrics_ports: dict[str, int] = {}  # process -> its /metrics port, picked at start
        self.nats_nodes = nats_nodes
        self.sync_always = sync_always
        self.servers: list[NatsServer] = []
        self.creds: credentials.Credentials | None = None
        self.converted: str | None = None  # what start converted of a data dir made before
        self.children: list[Child] = []
        self.lock = DataDirLock(self.data_dir)

    @property
    def server(self) -> NatsServer | None:
        """The first nats-server (None before any started)."""
        return self.servers[0] if self.servers else None

    @property
    def url(self) -> str:
        """Every nats-server's URL, comma-separated: what each process of the stack connects
        with, so it reconnects to another node when one goes."""
        assert self.servers
        return urls(self.servers)

    @property
    def replicas(self) -> int:
        """Copies of each Hoist stream: 3 on a cluster, 1 on one node."""
        return 3 if self.nats_nodes >= 3 else 1

    def role_url(self, role: str, agent_id: str | None = None) -> str:
        assert self.creds is not None
        return credentials.role_url(self.url, role, self.creds, agent_id=agent_id)

    async def start(self) -> None:
        try:
            die_with_parent(signal.SIGKILL)  # fail before anything starts, not halfway
        except NoParentDeathSignal as e:
            raise StackError(str(e)) from None
        waited = await self._lock()
        self._check_layout()
        self.converted = convert_to_accounts(self.data_dir, self.nats_nodes)
        # A dying stack's nats-server frees the port as it frees the lock: give it a moment.
        deadline = time.monotonic() + (2.0 if waited else 0.0)
        for port in ports(self.nats_port, self.nats_nodes):
            while not port_free(port):
                if time.monotonic() >= deadline:
                    raise StackError(_port_in_use(port))
                await asyncio.sleep(0.05)
        try:
            self.servers, self.creds = start_nats(
                self.data_dir,
                self.nats_port,
                self.agent_ids,
                self.lock,
                nodes=self.nats_nodes,
                sync_always=self.sync_always,
            )
        except RuntimeError as e:
            raise StackError(
                f"nats-server did not start on port {self.nats_port} (in use? pick another with"
                f" --nats-port); its log: {self.data_dir / 'nats-server.log'}"
            ) from e
        self._write_info()
        (self.data_dir / PORT_FILE).write_text(f"{self.nats_port}\n")
        (self.data_dir / NODES_FILE).write_text(f"{self.nats_nodes}\n")
        try:  # a cluster answers once its nodes have elected a meta leader
            await wait_jetstream(self.role_url("manager"))
        except TimeoutError as e:
            raise StackError(f"{e}; see the logs {self.data_dir}/nats-*.log") from None
        # The streams exist before any agent registers (agents may not create streams).
        nc = await connect(self.role_url("manager"), "hoist-up")
        try:
            await event_store(nc).ensure_stream(replicas=self.replicas)
            await progress.ensure(nc.jetstream(), replicas=self.replicas)
        except StoreError as e:
            raise StackError(str(e)) from None
        finally:
            await nc.close()
        # /metrics of each process on a local port it binds itself (0): a port picked here was
        # once taken by another process before the agent bound it, and the stack failed.
        # Read back from each log line "metrics at ...", recorded in stack.json.
        names = ["manager" if n == 1 else f"manager-{n}" for n in range(1, self.managers + 1)]
        self.metrics_ports = dict.fromkeys([*names, *self.agent_ids], 0)
        # The manager reads its password from the data dir: none in `ps` output.  Several
        # managers: one leads through a lease, the others stand by (services.manager.leadership);
        # each has its own name in the lease and its own read models' file.
        for n, name in enumerate(names, start=1):
            args = ["services.manager", "--nats-url", self.url, "--data-dir", str(self.data_dir)]
            args += ["--manager-id", f"manager-{n}"]
            args += ["--metrics-port", str(self.metrics_ports[name])]
            if n > 1:
                args += ["--read-models", str(self.data_dir / f"readmodels-{n}.duckdb")]
            self._spawn(name, args, "manager ready")
        dummy_config = self.data_dir / "dummy-agent.json"
        if self.runtime == "dummy":
            dummy_config.write_text(json.dumps(self.dummy_config, indent=2) + "\n")
        for agent_id in self.agent_ids:
            args = [
                "agent",
                *("--id", agent_id, "--runtime", self.runtime, "--resource-group", "default"),
            ]
            for slot in self.slots:
                args += ["--slot", slot]
            args += ["--metrics-port", str(self.metrics_ports[agent_id])]
            if self.runtime == "dummy":
                # Its simulated host outlives it, as a Docker Engine outlives a docker agent.
                host = self.data_dir / "dummy-hosts" / f"{agent_id}.json"
                args += ["--dummy-config", str(dummy_config), "--dummy-state", str(host)]
            elif self.docker_host:
                args += ["--docker-host", self.docker_host]
            # The agent's URL and password go through its environment: none in `ps` output.
            url = {"HOIST_NATS_URL": self.role_url("agent", agent_id)}
            self._spawn(agent_id, args, f"agent {agent_id} ready", url)
        if self.web:
            self._spawn_web()
        self._write_info()
        await self._wait_ready()
        for child in self.children:
            if child.name in self.metrics_ports:
                self.metrics_ports[child.name] = _metrics_port(child.log)
                # A restart binds the same port again (stack.json keeps naming it).
                args = child.module_args
                at = args.index("--metrics-port") + 1
                args[at] = str(self.metrics_ports[child.name])
        self._write_info()

    def _spawn_web(self) -> None:
        """The web view (services.web) as the admin role, with a new token (0600 file)."""
        self.web_port = self.web_port or free_port()
        self.web_token = secrets.token_urlsafe(24)
        token_file = self.data_dir / WEB_TOKEN_FILE
        token_file.unlink(missing_ok=True)
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.web_token + "\n")
        args = ["services.web", "--host", self.web_host, "--port", str(self.web_port)]
        args += ["--token-file", str(token_file)]
        self._spawn("web", args, "web ready at", {"HOIST_NATS_URL": self.role_url("admin")})

    @property
    def web_url(self) -> str:
        """The web view's address, without its token ("" when it is not started)."""
        if not self.web or not self.web_token:
            return ""
        host = "127.0.0.1" if self.web_host in ("0.0.0.0", "") else self.web_host
        return f"http://{host}:{self.web_port}/"

    def _check_layout(self) -> None:
        """Refuse to start an empty log beside this data dir's log on the other layout (one
        node's store vs a cluster's): the log would seem lost."""
        ours = store_dirs(self.data_dir, self.nats_nodes)[0]
        if ours.exists():
            return
        for nodes in (1, 3):
            theirs = store_dirs(self.data_dir, nodes)[0]
            if theirs != ours and theirs.exists():
                raise StackError(
                    f"the event log in {self.data_dir} is on {remembered_nodes(self.data_dir)}"
                    f" nats-server(s) ({theirs}), not {self.nats_nodes}: start with --nats-nodes"
                    f" {remembered_nodes(self.data_dir)}, or use another --data-dir for a new"
                    " stack (move events over with `nats stream backup` / `restore`)"
                )

    async def _lock(self) -> bool:
        """Take the data dir's lock, waiting up to LOCK_WAIT_S for a stack that is ending;
        whether it had to wait. Refuses with who holds it and how to stop them."""
        deadline = time.monotonic() + LOCK_WAIT_S
        waited = False
        while not self.lock.try_lock():
            info = StackInfo.read(self.data_dir)
            running = info is not None and info.alive() and not info.stopping
            if running or time.monotonic() >= deadline:
                raise StackError(self._held_by())
            waited = True
            await asyncio.sleep(0.05)
        return waited

    def _held_by(self) -> str:
        info = StackInfo.read(self.data_dir)
        holder = self.lock.holder()
        if info is not None and info.alive():
            return _runs_here(self.data_dir, info)
        left = sorted(p for p in (info.pids.values() if info else ()) if _running(p))
        if left:
            pids = " ".join(map(str, left))
            return (
                f"a stack already runs in {self.data_dir}: processes of a `hoist up` that ended"
                f" still hold it after {LOCK_WAIT_S:g}s (pids {pids}); stop them with"
                f" `hoist down --data-dir {self.data_dir}` (or `kill {pids}`) and start again"
            )
        if holder is None or not _running(holder):
            return (
                f"a stack already runs in {self.data_dir}: a process holds {self.lock.path};"
                f" find it with `fuser {self.lock.path}` and stop it"
            )
        return (
            f"a stack already runs in {self.data_dir}: another `hoist up` (pid {holder}) is"
            f" starting or stopping there; wait for it, or stop it with `kill {holder}`"
        )

    def _write_info(self) -> None:
        nats = {getattr(s, "name", SINGLE): s.proc.pid for s in self.servers if s.proc}
        pids = {**nats, **{c.name: c.proc.pid for c in self.children}}
        first = next(iter(nats.values()))
        info = StackInfo(self.url, os.getpid(), self.runtime, self.agent_ids, first)
        info.pids = pids
        info.docker_host = self.docker_host or ""
        info.web_url = self.web_url
        info.metrics = {
            n: f"http://127.0.0.1:{p}/metrics" for n, p in self.metrics_ports.items() if p
        }
        info.write(self.data_dir)

    def _spawn(
        self, name: str, module_args: list[str], ready_line: str, env: dict[str, str] | None = None
    ) -> None:
        proc, log = self._popen(name, module_args, env)
        self.children.append(Child(name, proc, log, ready_line, module_args, env))

    def restart(self, child: Child) -> Child:
        """Start ``child`` (which exited on its own) again as it was started; the manager and
        the agents recover from a kill by design (they replay the log, re-register)."""
        proc, log = self._popen(child.name, child.module_args, child.env)
        again = Child(child.name, proc, log, child.ready_line, child.module_args, child.env)
        self.children[self.children.index(child)] = again
        self._write_info()  # its new pid, for `hoist status` and `hoist down`
        return again

    def _popen(
        self, name: str, module_args: list[str], env: dict[str, str] | None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        logs = self.data_dir / "logs"
        # 0700: a log may hold a secret (the web view prints its URL with its token).
        logs.mkdir(exist_ok=True)
        logs.chmod(0o700)  # also a data dir made before this, whose logs dir was 0755
        log = logs / f"{name}.log"
        assert self.lock.fd is not None
        with open(log, "ab") as out:
            # Own session: Ctrl-C reaches `hoist up` only, which stops the children in order.
            # If `hoist up` dies without stopping them, the kernel kills them (the manager and
            # agents recover from a kill by design); each holds the data dir's lock till then.
            proc = subprocess.Popen(
                [sys.executable, "-m", *module_args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                pass_fds=(self.lock.fd,),
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
        return proc, log

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        offsets = {c.name: c.log.stat().st_size if c.log.exists() else 0 for c in self.children}
        waiting = list(self.children)
        while waiting:
            for child in list(waiting):
                text = child.log.read_bytes()[offsets[child.name] :].decode(errors="replace")
                if child.ready_line in text:
                    waiting.remove(child)
                elif child.proc.poll() is not None:
                    raise StackError(
                        f"{child.name} exited with code {child.proc.returncode} at start; its log"
                        f" ({child.log}) ends:\n{child.tail()}"
                    )
            if time.monotonic() > deadline:
                names = ", ".join(c.name for c in waiting)
                raise StackError(
                    f"{names} not ready after {READY_TIMEOUT_S:g}s; see the logs in"
                    f" {self.data_dir / 'logs'}"
                )
            await asyncio.sleep(0.05)

    def exited(self) -> list[Child]:
        """Children that stopped on their own."""
        return [c for c in self.children if c.proc.poll() is not None]

    def stop(self) -> None:
        """Agents first (they finish what they publish), then the manager, then nats-server."""
        info = StackInfo.read(self.data_dir)
        if info is not None and info.pid == os.getpid():
            info.stopping = True
            info.write(self.data_dir)
        for group in (
            [c for c in self.children if not is_manager(c.name)],
            [c for c in self.children if is_manager(c.name)],
        ):
            for child in group:
                if child.proc.poll() is None:
                    child.proc.send_signal(signal.SIGTERM)
            for child in group:
                try:
                    child.proc.wait(10)
                except subprocess.TimeoutExpired:
                    child.proc.kill()
                    child.proc.wait()
        self.children.clear()
        for server in self.servers:
            server.stop()
        info = StackInfo.read(self.data_dir)
        if info is not None and info.pid == os.getpid():
            (self.data_dir / STATE_FILE).unlink(missing_ok=True)
        self.lock.close()  # the last holder: every child has ended


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
