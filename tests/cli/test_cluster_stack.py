"""`hoist up --nats-nodes 3`: three nats-servers as one cluster that every command knows, one
auth.conf reloaded on all three, remembered by the data dir; and the durability opt-out."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nats
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from bench.chaos import ClusterStack
from domain.subjects import EVENT_STREAM
from services.stack import natsauth
from services.stack.natsserver import (
    NatsServer,
    RouteAuth,
    cluster_nodes,
    free_port,
)
from services.stack.natstls import RouteTLS, route_tls
from services.stack.up import remembered_port
from tests.cli.stack_harness import run_hoist
from tests.infra.cluster import stream_leader
from transport import credentials
from transport.client import connect, server_list


def _hoist(stack: ClusterStack, *args: str) -> subprocess.CompletedProcess[str]:
    """ClusterStack.hoist's command line (its admin URL), run in-process (`down` a process)."""
    env = {**os.environ, "HOIST_NATS_URL": stack.url("admin")}
    return run_hoist(["--data-dir", str(stack.data_dir), *args], env=env, timeout=120)


def test_a_three_node_stack_is_known_to_status_users_and_down(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ClusterStack(data, 1) as stack:
        assert len(server_list(stack.info().url)) == 3
        assert (data / "nats-nodes").read_text().strip() == "3"
        assert stat.S_IMODE(data.stat().st_mode) == 0o700  # only its user reads the models
        status = _hoist(stack, "status").stdout
        for name in ("nats-1", "nats-2", "nats-3"):
            assert f"{name}" in status and "pid" in status, status
        added = _hoist(stack, "user", "add", "bob")
        assert added.returncode == 0, added.stderr
        for name in ("nats-1", "nats-2", "nats-3"):  # each node re-read the one auth.conf
            log = (data / f"{name}.log").read_text()
            assert "Reloaded server configuration" in log, name
        assert all('include "auth.conf"' in (data / f"{n}.conf").read_text() for n in
                   ("nats-1", "nats-2", "nats-3"))  # fmt: skip
        # A node that died (a zombie of hoist up's until the stack stops) does not hold up a
        # change of users: it reads auth.conf when it starts again.  It is the event stream's
        # leader, so the user's append waits out the election of a new one (CI once killed
        # the leader by chance, and the admin got a timeout).
        dead = asyncio.run(_leader_of_the_log(stack.url("manager")))  # readers: no stream info
        stack.kill(dead)
        added = _hoist(stack, "user", "add", "carol")
        assert added.returncode == 0, added.stdout + added.stderr
        down = _hoist(stack, "down")
        assert down.returncode == 0, down.stderr
        for name in {"nats-1", "nats-2", "nats-3"} - {dead}:
            assert name in down.stdout, down.stdout
    # The data dir's log is on three nodes: one node would start an empty log beside it.
    refused = subprocess.run(  # a process: `up`
        [sys.executable, "-m", "services.cli.main", "--data-dir", str(data), "up",
         "--runtime", "dummy", "--nats-nodes", "1", "--no-demo"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "--nats-nodes 3" in refused.stderr, refused.stderr


async def _leader_of_the_log(url: str) -> str:
    nc = await connect(url)  # the role's inbox prefix
    try:
        return await stream_leader(nc, EVENT_STREAM)
    finally:
        await nc.close()


def test_sync_always_is_the_default_and_the_opt_out_leaves_it_out(tmp_path: Path) -> None:
    creds = natsauth.generate_credentials(tmp_path)
    strict = natsauth.write_server_config(tmp_path, creds, tmp_path / "js").read_text()
    assert "\n  sync_interval: always" in strict
    nodes = cluster_nodes(3, 4222)
    lazy = natsauth.write_server_config(
        tmp_path, creds, tmp_path / "js", node=nodes[1], nodes=nodes, sync_always=False
    ).read_text()
    assert "\n  sync_interval: always" not in lazy
    assert 'server_name: "nats-2"' in lazy and "listen: 127.0.0.1:6223" in lazy
    assert lazy.count("nats-route://") == 3
    route = natsauth.route_credentials(tmp_path)
    assert lazy.count(f"nats-route://{route.user}:{route.password}@") == 3
    assert f'authorization {{\n    user: "{route.user}"\n    password: "{route.password}"' in lazy


def test_the_route_certificates_are_made_once_per_data_dir(tmp_path: Path) -> None:
    from cryptography import x509

    tls = route_tls(tmp_path)
    first = [f.read_bytes() for f in tls.files()]
    assert {f.name for f in tmp_path.iterdir()} == {
        "route-ca.pem",
        "route-cert.pem",
        "route-key.pem",
    }
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in tls.files())
    tls.key_file.chmod(0o644)
    assert [f.read_bytes() for f in route_tls(tmp_path).files()] == first  # kept
    assert stat.S_IMODE(tls.key_file.stat().st_mode) == 0o600  # and tightened
    ca, cert = (x509.load_pem_x509_certificate(b) for b in first[:2])
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    tls.ca_file.unlink()  # a partial set is made again whole: the nodes must share one CA
    again = [f.read_bytes() for f in route_tls(tmp_path).files()]
    assert all(a != b for a, b in zip(again, first, strict=True))
    settings = tls.settings()
    assert "verify: true" in settings and f'cert_file: "{tls.cert_file}"' in settings


def test_urls_of_several_servers_carry_the_credentials_on_each() -> None:
    creds = credentials.Credentials("m", "c", "a")
    url = credentials.role_url("nats://h:1,nats://h:2", "client", creds)
    assert server_list(url) == ["nats://client:c@h:1", "nats://client:c@h:2"]


def test_a_server_without_the_route_credentials_cannot_join_the_stack(tmp_path: Path) -> None:
    """A local user's no-auth nats-server routing to a stack node's route port: were it let in,
    its own no-password clients would read and write the stack's subjects (JetStream API
    included) past every role. The stack's routes ask for the route user and password, and
    for a certificate of the data dir's route CA (mutual TLS): the password alone lets no one
    in."""
    data = tmp_path / "data"
    with ClusterStack(data, 0) as stack:
        auth = natsauth.route_credentials(data)
        tls = RouteTLS.in_dir(data)
        for f in (data / natsauth.ROUTE_CREDENTIALS_FILE, *tls.files()):
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        certs = [f.read_bytes() for f in tls.files()]
        node = cluster_nodes(3, remembered_port(data))[0]
        stranger = _stranger(tmp_path / "stranger", node.cluster_port)
        # The route password without the CA's certificate: refused too (the password leaked
        # to a squatter before the routes had TLS).
        no_cert = _stranger(tmp_path / "no-cert", node.cluster_port, auth)
        # The same server given the route credentials and the node certificate joins: what
        # refuses the others is them.
        friend = _stranger(tmp_path / "friend", node.cluster_port, auth, tls)
        try:
            for refused in (stranger, no_cert):
                joined = _joined_or_refused(refused)
                assert joined == 0, f"{refused.server.store_dir.name} joined: {joined} routes"
                assert asyncio.run(_stream_info(refused.url)) is None
            assert _joined_or_refused(friend) > 0, friend.log()[-2000:]
            # Its routes are up before the nodes' subscriptions reach it: asked again a while.
            assert asyncio.run(_stream_info(friend.url, within_s=10)) is not None
            # A reload (users changed) keeps the routes and their authorization.
            added = _hoist(stack, "user", "add", "bob")
            assert added.returncode == 0, added.stderr
            assert _route_names(friend) == {"nats-1", "nats-2", "nats-3"}
            late = _stranger(
                tmp_path / "late", cluster_nodes(3, remembered_port(data))[2].cluster_port
            )
            try:
                assert _joined_or_refused(late) == 0
            finally:
                late.server.stop()
        finally:
            stranger.server.stop()
            no_cert.server.stop()
            friend.server.stop()
    # The data dir's cluster starts again with the same route credentials and certificates.
    with ClusterStack(data, 0):
        assert natsauth.route_credentials(data) == auth
        assert [f.read_bytes() for f in tls.files()] == certs
        for name in ("nats-1", "nats-2", "nats-3"):
            conf = (data / f"{name}.conf").read_text()
            assert auth.password in conf and f'ca_file: "{tls.ca_file}"' in conf


def test_a_squatter_on_a_stopped_nodes_route_port_gets_no_route_password(
    tmp_path: Path,
) -> None:
    """While a node is down, a local user listening on its route port, answering as a
    nats-server would (INFO), must not receive the other nodes' route CONNECT: it carries the
    route password, with which their own server would join. The routes' mutual TLS stops the
    nodes before they send anything: the squatter has no certificate of the cluster's CA."""
    data = tmp_path / "data"
    with ClusterStack(data, 0) as stack:
        auth = natsauth.route_credentials(data)
        node = cluster_nodes(3, remembered_port(data))[1]
        stack.kill(node.name)
        received = asyncio.run(_squat(node.cluster_port, within_s=5))
    assert received, "no node routed to the squatter: the test saw nothing"
    leaked = [r for r in received if b"CONNECT" in r or auth.password.encode() in r]
    assert not leaked, f"the squatter received a route CONNECT: {leaked[0][:300]!r}"


async def _squat(port: int, within_s: float) -> list[bytes]:
    """Listen on 127.0.0.1:``port`` as a route would (INFO first) for ``within_s``; what each
    connection sent."""
    received: list[bytearray] = []
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = bytearray()
        received.append(got)
        writers.append(writer)
        info = {"server_id": "NSQUATTER", "server_name": "squatter", "version": "2.15.1",
                "proto": 1, "host": "127.0.0.1", "port": port, "headers": True,
                "auth_required": True, "max_payload": 1048576, "cluster": "hoist"}  # fmt: skip
        writer.write(f"INFO {json.dumps(info)}\r\n".encode())
        try:
            await writer.drain()
            while chunk := await reader.read(4096):
                got.extend(chunk)
        except OSError:
            pass
        finally:
            writer.close()

    deadline = time.monotonic() + 10
    while True:  # the killed node's socket may linger a moment
        try:
            server = await asyncio.start_server(serve, "127.0.0.1", port, reuse_address=True)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
    async with server:
        await asyncio.sleep(within_s)
        for writer in writers:  # ends each serve(): its read returns b""
            writer.transport.abort()
        await asyncio.sleep(0.1)
    return [bytes(r) for r in received]


class _Stranger:
    def __init__(self, server: NatsServer, monitor: int) -> None:
        self.server, self.monitor = server, monitor

    @property
    def url(self) -> str:
        return self.server.url

    def routes(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor}/routez", timeout=2) as r:
            return int(json.load(r)["num_routes"])

    def log(self) -> str:
        return self.server.log_file.read_text(errors="replace")


def _stranger(
    home: Path, route_port: int, auth: RouteAuth | None = None, tls: RouteTLS | None = None
) -> _Stranger:
    """A nats-server of no users and no JetStream of its own, in cluster ``hoist``, routing to
    127.0.0.1:``route_port``; given ``auth``, it routes with the route credentials (and asks
    them of the stack's nodes, which then route to it as they route to each other); given
    ``tls``, its routes present that certificate and verify peers by that CA."""
    home.mkdir(parents=True)
    monitor, listen = free_port(), free_port()
    if auth is None:
        route, authorization = f"nats-route://127.0.0.1:{route_port}", ""
    else:
        route = auth.route_url(route_port)
        # Quoted, as the stack's own configs are: a random password like "3X..." parses as a
        # number unquoted (nats-server: "Expected a digit but got 'X'").
        user, password = json.dumps(auth.user), json.dumps(auth.password)
        authorization = f"  authorization {{ user: {user}, password: {password} }}\n"
    config = home / "stranger.conf"
    config.write_text(
        f"server_name: {home.name}\nhttp: 127.0.0.1:{monitor}\n"
        f"cluster {{\n  name: hoist\n  listen: 127.0.0.1:{listen}\n{authorization}"
        + (tls.settings() if tls else "")
        + f"  routes: [{json.dumps(route)}]\n}}\n"
    )
    return _Stranger(NatsServer(home, config=config).start(), monitor)


def _route_names(server: _Stranger, within_s: float = 10) -> set[str]:
    """The servers ``server`` routes to, once it routes to all three nodes of the stack."""
    deadline = time.monotonic() + within_s
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor}/routez", timeout=2) as r:
            names = {route["remote_name"] for route in json.load(r)["routes"]}
        if len(names) >= 3 or time.monotonic() > deadline:
            return names
        time.sleep(0.05)


def _joined_or_refused(stranger: _Stranger, within_s: float = 10) -> int:
    """The stranger's routes once it has some, or 0 once a stack node refused its route
    twice (an authorization violation, or a TLS handshake the node ended: "Client Closed")."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        routes = stranger.routes()
        if routes or stranger.log().count("Router connection closed") >= 2:
            return routes
        time.sleep(0.05)
    raise TimeoutError(f"the stranger neither joined nor was refused:\n{stranger.log()[-2000:]}")


async def _stream_info(url: str, within_s: float = 0) -> dict[str, object] | None:
    """What a no-password client of ``url`` learns of the event stream (None: no answer),
    asked again until ``within_s`` has passed."""
    nc = await nats.connect(url)
    deadline = time.monotonic() + within_s
    try:
        while True:
            try:
                reply = await nc.request(f"$JS.API.STREAM.INFO.{EVENT_STREAM}", b"", timeout=2)
                return dict(json.loads(reply.data))
            except (NoRespondersError, NatsTimeoutError):
                if time.monotonic() >= deadline:
                    return None
                await asyncio.sleep(0.2)
    finally:
        await nc.close()
