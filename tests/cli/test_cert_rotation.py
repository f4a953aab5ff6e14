"""`hoist certs rotate`: a new route CA and certificate, taken up by each node of a running
three-node stack on a reload, with no restart, no route dropped and no create failed."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import time
from pathlib import Path

import nats.errors
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from bench.chaos import IMAGE, ClusterStack
from domain.subjects import EVENT_STREAM, SESSION_CREATE
from services.stack.natsserver import CLUSTER_PORT_OFFSET
from services.stack.natstls import ROTATION_STEPS, RouteTLS, rotate, route_tls
from services.stack.up import StackInfo
from tests.cli.stack_harness import run_hoist
from transport.client import Client, connect, server_list

NODES = ("nats-1", "nats-2", "nats-3")


def _certs(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def test_each_step_of_a_rotation_is_trusted_by_the_step_before(tmp_path: Path) -> None:
    tls = route_tls(tmp_path)
    old_ca, old_cert = _certs(tls.ca_file.read_bytes())[0], _certs(tls.cert_file.read_bytes())[0]
    seen: list[tuple[int, list[x509.Certificate], x509.Certificate]] = []

    def reload(step: int, what: str) -> None:
        assert what == ROTATION_STEPS[step - 1]
        seen.append((step, _certs(tls.ca_file.read_bytes()), _certs(tls.cert_file.read_bytes())[0]))

    done = rotate(tmp_path, reload)
    assert [s for s, _, _ in seen] == [1, 2, 3]
    (_, cas1, cert1), (_, cas2, cert2), (_, cas3, cert3) = seen
    new_ca = cas3[0]
    assert cas1 == [old_ca, new_ca] and cert1 == old_cert  # trust both, present the old
    assert cas2 == [old_ca, new_ca] and cert2 != old_cert  # present the new one
    cert2.verify_directly_issued_by(new_ca)
    assert cas3 == [new_ca] and cert3 == cert2  # trust the new CA only
    assert new_ca != old_ca and (done.old_serial, done.new_serial) == (
        old_cert.serial_number,
        cert2.serial_number,
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_cert_chain(tls.cert_file, tls.key_file)  # the key is the new certificate's
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in tls.files())
    assert not list(tmp_path.glob("*.tmp"))


def test_rotate_says_what_to_do_without_a_cluster_stack(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    none = run_hoist(["--data-dir", str(data), "certs", "rotate"])
    assert none.returncode != 0
    assert "no Hoist stack runs" in none.stderr and "hoist up" in none.stderr, none.stderr
    # A single node's stack (this process stands in for its hoist up and its nats-server).
    StackInfo("nats://127.0.0.1:1", os.getpid(), pids={"nats-server": os.getpid()}).write(data)
    single = run_hoist(["--data-dir", str(data), "certs", "rotate"])
    assert single.returncode != 0
    assert "no routes" in single.stderr and "--nats-nodes 3" in single.stderr, single.stderr


async def test_rotating_under_creates_keeps_every_route_and_serves_the_new_certificate(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with ClusterStack(data, 1) as stack:
        tls = RouteTLS.in_dir(data)
        old = {f: f.read_bytes() for f in tls.files()}
        ports = [int(u.rsplit(":", 1)[1]) for u in server_list(stack.info().url)]
        closed_before = {n: _log(data, n).count("Router connection closed") for n in NODES}
        pids = {n: stack.pid(n) for n in NODES}

        nc = await connect(stack.url("client"), max_reconnect_attempts=-1)
        failed: list[str] = []
        acked: list[str] = []
        rotating = asyncio.Event()
        rotated = asyncio.Event()

        async def create(i: int) -> None:
            payload = {
                "owner": "rotation",
                "image": IMAGE,
                "resources": {"cpu": 0.01, "mem": 16 * 1024**2},
                "request_id": f"rotation-{i}",
            }
            # A reload rewires the accounts' imports: for a moment a request may meet no
            # responder. No one received it, so it is sent again, as Hoist's client does.
            for pause in (0.05, 0.1, 0.2, 0.5, 1.0, None):
                try:
                    msg = await nc.request(SESSION_CREATE, json.dumps(payload).encode(), timeout=15)
                    break
                except nats.errors.NoRespondersError as e:
                    if pause is None:
                        failed.append(f"{i}: {e!r}")
                        return
                    await asyncio.sleep(pause)
                except (nats.errors.Error, TimeoutError) as e:
                    failed.append(f"{i}: {e!r}")
                    return
            reply = json.loads(msg.data)
            if reply.get("error"):
                failed.append(f"{i}: {reply['error']}")
            else:
                acked.append(reply["session_id"])

        async def creator() -> int:
            # Four at a time from a little before the rotation to a little after it.
            count = 0
            pending: set[asyncio.Task[None]] = set()
            after = 0
            while after < 20:
                if len(pending) >= 4:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                pending.add(asyncio.create_task(create(count)))
                count += 1
                if count == 10:
                    rotating.set()
                if rotated.is_set():
                    after += 1
                await asyncio.sleep(0.02)
            await asyncio.gather(*pending)
            return count

        async def rotator() -> str:
            await rotating.wait()
            try:
                done = await asyncio.to_thread(stack.hoist, "certs", "rotate")
            finally:
                rotated.set()
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        try:
            count, out = await asyncio.gather(creator(), rotator())
            assert failed == [], failed
            assert len(acked) == count, (len(acked), count)
            for step in ROTATION_STEPS:
                assert step in out, out
            for name in NODES:
                assert out.count(f"  {name} reloaded") == 3, out
            # No restart, no route dropped, and JetStream's replicas all current.
            assert {n: stack.pid(n) for n in NODES} == pids
            for name in NODES:
                log = _log(data, name)
                assert log.count("Router connection closed") == closed_before[name], log[-3000:]
            manager = await connect(stack.url("manager"))  # stream info: the HOIST account's
            try:
                await _replicas_current(manager)
            finally:
                await manager.close()
        finally:
            await nc.close()

        new = {f: f.read_bytes() for f in tls.files()}
        assert all(new[f] != old[f] for f in tls.files())
        (new_cert,) = _certs(new[tls.cert_file])
        assert (
            new_cert.not_valid_before_utc
            >= x509.load_pem_x509_certificate(old[tls.cert_file]).not_valid_before_utc
        )
        assert hex(new_cert.serial_number)[2:] in out
        for port in ports:  # each route port serves the new certificate and takes only it
            route = port + CLUSTER_PORT_OFFSET
            served, answer = _route_handshake(tmp_path, route, new, new, tls)
            assert served == new_cert.public_bytes(Encoding.DER), route
            assert answer.startswith(b"INFO "), (route, answer)
            refused = _route_handshake(tmp_path, route, new, old, tls)[1]
            assert not refused.startswith(b"INFO "), (route, refused)


def _log(data: Path, name: str) -> str:
    return (data / f"{name}.log").read_text(errors="replace")


async def _replicas_current(nc: Client, within_s: float = 15) -> None:
    """The event stream has a leader and both followers current: the routes carry it."""
    deadline = time.monotonic() + within_s
    while True:
        info = json.loads(
            (await nc.request(f"$JS.API.STREAM.INFO.{EVENT_STREAM}", b"", timeout=5)).data
        )
        cluster = info.get("cluster", {})
        replicas = cluster.get("replicas", [])
        if cluster.get("leader") and len(replicas) == 2 and all(r["current"] for r in replicas):
            return
        assert time.monotonic() < deadline, cluster
        await asyncio.sleep(0.2)


def _route_handshake(
    tmp: Path,
    port: int,
    trust: dict[Path, bytes],
    present: dict[Path, bytes],
    tls: RouteTLS,
) -> tuple[bytes, bytes]:
    """Connect to a route port as a route would, trusting ``trust``'s CA and presenting
    ``present``'s certificate and key: the certificate the node served (DER) and the first
    bytes it sent after the handshake (its route INFO, or nothing when it refused ours)."""
    probe = tmp / "probe"
    probe.mkdir(exist_ok=True)
    ca, cert, key = probe / "ca.pem", probe / "cert.pem", probe / "key.pem"
    ca.write_bytes(trust[tls.ca_file])
    cert.write_bytes(present[tls.cert_file])
    key.write_bytes(present[tls.key_file])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(ca)
    ctx.load_cert_chain(cert, key)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s,
    ):
        served = s.getpeercert(binary_form=True) or b""
        try:
            answer = s.recv(5)
        except (ssl.SSLError, OSError):
            answer = b""
    return served, answer
