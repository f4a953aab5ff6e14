"""Each role's NATS user against a real nats-server running the rendered nats.conf + auth.conf:
what a role may do works, what it may not is refused by the server."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import StreamConfig

from domain.contracts.users import AddUser
from domain.subjects import EVENT_STREAM, EVENTS_ALL, PROGRESS_STREAM
from eventstore.store import EventStore, Message, Write
from services.stack.natsauth import (
    REPO_CONFIG,
    generate_credentials,
    remove_user,
    set_user,
    write_server_config,
)
from services.stack.natsserver import free_port, nats_server_binary, wait_for_port
from tests.manager.harness import manager as running_manager
from transport import progress
from transport.client import Client, connect
from transport.credentials import (
    CREDENTIALS_FILE,
    Credentials,
    load_credentials,
    role_url,
    user_url,
)


@dataclass
class Stack:
    url: str
    creds: Credentials
    data_dir: Path
    proc: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One server for the module (roles don't interfere): started from the rendered config only."""
    data_dir = tmp_path_factory.mktemp("hoist")
    creds = generate_credentials(data_dir, ["A", "B"])
    config = write_server_config(data_dir, creds, data_dir / "store")
    port = free_port()
    log_file = data_dir / "nats-server.log"  # -l, as the stack's: nats.conf rotates it
    log = log_file.open("ab")
    cmd = [nats_server_binary(), "-c", str(config), "-a", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(
        [*cmd, "-l", str(log_file)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        wait_for_port("127.0.0.1", port)
        yield Stack(f"nats://127.0.0.1:{port}", creds, data_dir, proc)
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass
class Conn:
    """A connection that records the permission violations the server reports."""

    nc: Client
    errors: list[str] = field(default_factory=list)

    async def refused(self, subject: str) -> bool:
        """Publish; True once the server reports the violation (its -ERR may trail a PONG)."""
        await self.nc.publish(subject, b"x")
        return await self.reported(f'publish to "{subject.lower()}"')

    async def reported(self, text: str, within: float = 2.0) -> bool:
        for _ in range(int(within / 0.01)):
            if any(text.lower() in e for e in self.errors):
                return True
            await asyncio.sleep(0.01)
        return False


async def _connect(stack: Stack, role: str, agent_id: str | None = None) -> Conn:
    conn = Conn(nc=Client())

    async def on_error(err: Exception) -> None:
        conn.errors.append(str(err).lower())

    await conn.nc.connect(
        role_url(stack.url, role, stack.creds, agent_id),
        error_cb=on_error,
        allow_reconnect=False,
        connect_timeout=2,
    )
    return conn


@pytest.fixture
async def manager(stack: Stack) -> AsyncIterator[Conn]:
    conn = await _connect(stack, "manager")
    # The streams as the manager makes them: created when absent, verified (never updated) after.
    await EventStore(conn.nc, EVENT_STREAM, [EVENTS_ALL]).ensure_stream()
    await progress.ensure(conn.nc.jetstream())
    yield conn
    await conn.nc.close()


async def _role(stack: Stack, role: str, agent_id: str | None = None) -> AsyncIterator[Conn]:
    conn = await _connect(stack, role, agent_id)
    yield conn
    await conn.nc.close()


@pytest.fixture
async def client(stack: Stack, manager: Conn) -> AsyncIterator[Conn]:
    async for conn in _role(stack, "client"):
        yield conn


@pytest.fixture
async def admin(stack: Stack, manager: Conn) -> AsyncIterator[Conn]:
    async for conn in _role(stack, "admin"):
        yield conn


@pytest.fixture
async def agent_a(stack: Stack, manager: Conn) -> AsyncIterator[Conn]:
    async for conn in _role(stack, "agent", "A"):
        yield conn


async def test_manager_appends_and_reads_events(manager: Conn) -> None:
    ack = await manager.nc.jetstream().publish("hoist.events.session.s1", b"created")
    assert ack.stream == EVENT_STREAM
    assert manager.errors == []


async def test_manager_writes_its_own_subjects_never_an_agents_facts(manager: Conn) -> None:
    js = manager.nc.jetstream()
    for subject in (
        "hoist.events.liveness.A",
        "hoist.events.prepull-policy.p",
        "hoist.events.resource-policy.alice",
        "hoist.events.resource-group.gpu",
        "hoist.events.reservation.A",
        "hoist.events.lease.x",
    ):
        assert (await js.publish(subject, b"fact")).stream == EVENT_STREAM
    assert await manager.refused("hoist.events.agent.A")
    assert await manager.refused("hoist.events.other.x")


async def test_manager_cannot_delete_or_purge_the_event_stream(manager: Conn) -> None:
    assert await manager.refused(f"$JS.API.STREAM.DELETE.{EVENT_STREAM}")
    assert await manager.refused(f"$JS.API.STREAM.PURGE.{EVENT_STREAM}")
    assert await manager.refused(f"$JS.API.STREAM.MSG.DELETE.{EVENT_STREAM}")


async def test_client_never_appends_events(client: Conn, manager: Conn) -> None:
    js = manager.nc.jetstream()
    before = (await js.stream_info(EVENT_STREAM)).state.messages
    assert await client.refused("hoist.events.session.s1")
    assert await client.refused("hoist.events.agent.A")
    assert (await js.stream_info(EVENT_STREAM)).state.messages == before


async def test_client_cannot_change_streams(client: Conn) -> None:
    for api in ("STREAM.DELETE", "STREAM.PURGE", "STREAM.UPDATE", "STREAM.MSG.DELETE"):
        assert await client.refused(f"$JS.API.{api}.{EVENT_STREAM}"), api
    assert await client.refused("$JS.API.STREAM.CREATE.EVIL")
    # Not the manager's durable consumers either: no pulling from, deleting or naming them.
    assert await client.refused(f"$JS.API.CONSUMER.MSG.NEXT.{EVENT_STREAM}.reactor")
    assert await client.refused(f"$JS.API.CONSUMER.DELETE.{EVENT_STREAM}.reactor")
    assert await client.refused(f"$JS.API.CONSUMER.CREATE.{EVENT_STREAM}.reactor")
    # Nor any other JetStream API but direct gets: the readers' account has none, and
    # nats-server answered each such request at ~5x the cost of refusing it (issue 39's flood).
    for api in ("INFO", "STREAM.NAMES", f"STREAM.INFO.{EVENT_STREAM}", "STREAM.LIST"):
        assert await client.refused(f"$JS.API.{api}"), api


async def test_client_sends_commands_and_queries_but_not_admin(client: Conn, manager: Conn) -> None:
    served = await manager.nc.subscribe("hoist.api.>", cb=_answer(manager.nc))
    await _synced(manager.nc)
    try:
        reply = await client.nc.request("hoist.api.session.create", b"{}", timeout=2)
        assert reply.data == b"ok"
        assert await _delivered(client, manager, "hoist.query.kernels")
        assert await client.refused("hoist.admin.kernel.cancel")
        assert await client.refused("hoist.admin.query.sql")
        assert await client.refused("hoist.admin.manager.stats")  # the manager's own timings
    finally:
        await served.unsubscribe()


async def test_the_manager_answers_only_on_inboxes(client: Conn, manager: Conn) -> None:
    # A reply subject is the requester's to choose: aimed at an agent's event subject, the
    # manager's answer would land in the log as that agent's fact.
    served = await manager.nc.subscribe("hoist.query.>", cb=_answer(manager.nc))
    await _synced(manager.nc)
    js = manager.nc.jetstream()
    before = (await js.stream_info(EVENT_STREAM)).state.messages
    try:
        # Subjects the manager itself may write are refused by the manager's code instead
        # (services answer inboxes only: tests/hardening/test_fuzz.py).
        # The client's requests come through its account's import, their reply subjects
        # replaced by HOIST's _R_ stand-ins: the answer goes back to the readers' account,
        # which has no JetStream. The manager itself may not publish there either.
        for target in ("hoist.events.agent.A", "hoist.heartbeat.A"):
            await client.nc.publish("hoist.query.kernels", b"{}", reply=target)
            await manager.nc.publish(target, b"ok")
            assert await manager.reported(f'publish to "{target.lower()}"'), target
        reply = await client.nc.request("hoist.query.kernels", b"{}", timeout=2)
        assert reply.data == b"ok"  # on its own inbox, as every request does
    finally:
        await served.unsubscribe()
    assert (await js.stream_info(EVENT_STREAM)).state.messages == before


@pytest.mark.parametrize("role", ["client", "admin", "agent"])
async def test_no_role_reads_another_roles_replies(stack: Stack, manager: Conn, role: str) -> None:
    conn = await _connect(stack, role, "A" if role == "agent" else None)
    user = "agent-A" if role == "agent" else role
    try:
        assert conn.nc.new_inbox().startswith(f"_INBOX.{user}.")  # set from the URL's user
        for other in ("_INBOX.>", "_INBOX.manager.>", "_INBOX.admin.x", "_INBOX.agent-B.>"):
            if other.startswith(f"_INBOX.{user}."):
                continue
            await conn.nc.subscribe(other)
            assert await conn.reported(f'subscription to "{other.lower()}"'), other
        served = await manager.nc.subscribe("hoist.query.>", cb=_answer(manager.nc))
        await _synced(manager.nc)
        if role != "agent":  # agents send no queries
            reply = await conn.nc.request("hoist.query.kernels", b"{}", timeout=2)
            assert reply.data == b"ok"
        await served.unsubscribe()
    finally:
        await conn.nc.close()


async def test_client_cannot_serve_or_listen_to_service_subjects(client: Conn) -> None:
    for subject in ("hoist.api.>", "hoist.admin.>", "hoist.agent.A.>", "hoist.heartbeat.>"):
        await client.nc.subscribe(subject)
        assert await client.reported(f'subscription to "{subject}"'), subject


async def test_client_reads_history_with_direct_gets(client: Conn, manager: Conn) -> None:
    await manager.nc.jetstream().publish("hoist.events.session.read", b"e1")
    last = await client.nc.jetstream().get_last_msg(
        EVENT_STREAM, "hoist.events.session.read", direct=True
    )
    assert last.data == b"e1"
    assert client.errors == []


@pytest.mark.parametrize("role", ["client", "admin", "agent"])
@pytest.mark.parametrize("stream", [EVENT_STREAM, PROGRESS_STREAM])
async def test_no_reader_creates_a_consumer_aimed_at_the_managers_subjects(
    stack: Stack, manager: Conn, role: str, stream: str
) -> None:
    # nats-server does not check a push consumer's deliver subject against its creator's
    # permissions: a reader allowed to create one could pour the stream into hoist.admin.>.
    reader = await _connect(stack, role, "A" if role == "agent" else None)
    served: list[str] = []

    async def record(msg: Msg) -> None:
        served.append(msg.subject)

    sub = await manager.nc.subscribe("hoist.admin.>", cb=record)
    await _synced(manager.nc)
    try:
        config = {
            "deliver_subject": "hoist.admin.kernel.cancel",
            "ack_policy": "none",
            "deliver_policy": "all",
        }
        for api in (f"CONSUMER.CREATE.{stream}", f"CONSUMER.CREATE.{stream}.evil"):
            subject = f"$JS.API.{api}"
            await reader.nc.publish(subject, json.dumps({"config": config}).encode())
            assert await reader.reported(f'publish to "{subject.lower()}"'), subject
        await asyncio.sleep(0.3)
        assert served == []
    finally:
        await sub.unsubscribe()
        await reader.nc.close()


@pytest.mark.parametrize("role", ["client", "manager"])
async def test_client_and_manager_follow_events(stack: Stack, manager: Conn, role: str) -> None:
    # A following replay subscribes to the event subjects as its wake-up signal.
    reader = manager if role == "manager" else await _connect(stack, role)
    writer = EventStore(manager.nc, EVENT_STREAM, [EVENTS_ALL])
    subject = f"hoist.events.session.follow-{role}"
    try:
        store = EventStore(reader.nc, EVENT_STREAM, [EVENTS_ALL])
        replay = store.replay(subject_filter=subject, follow=True)
        first = asyncio.create_task(anext(replay))
        await asyncio.sleep(0.1)
        [seq] = await writer.append([Write(subject, [Message(b"e1")])])
        assert (await asyncio.wait_for(first, 5)).seq == seq
        await replay.aclose()
        assert reader.errors == []
    finally:
        if reader is not manager:
            await reader.nc.close()


async def test_client_watches_progress(client: Conn, agent_a: Conn) -> None:
    sub = await client.nc.subscribe("hoist.progress.>")
    await _synced(client.nc)
    await agent_a.nc.publish("hoist.progress.A.pull1", b"50%")
    assert (await sub.next_msg(timeout=2)).data == b"50%"
    assert await client.refused("hoist.progress.A.pull1")


async def test_admin_publishes_admin_subjects_but_no_events(admin: Conn, manager: Conn) -> None:
    served = await manager.nc.subscribe("hoist.admin.>", cb=_answer(manager.nc))
    await _synced(manager.nc)
    try:
        reply = await admin.nc.request("hoist.admin.query.sql", b"select 1", timeout=2)
        assert reply.data == b"ok"
    finally:
        await served.unsubscribe()
    assert await _delivered(admin, manager, "hoist.api.session.create")
    assert await admin.refused("hoist.events.session.s1")
    assert await admin.refused(f"$JS.API.STREAM.PURGE.{EVENT_STREAM}")


async def test_agent_publishes_only_its_own_facts(agent_a: Conn, manager: Conn) -> None:
    ack = await agent_a.nc.jetstream().publish("hoist.events.agent.A", b"registered")
    assert ack.stream == EVENT_STREAM
    assert await _delivered(agent_a, manager, "hoist.heartbeat.A")
    assert await agent_a.refused("hoist.events.agent.B")
    assert await agent_a.refused("hoist.events.session.x")
    # its reservations are the managers' (issue 17): an agent cannot free or book room
    assert await agent_a.refused("hoist.events.reservation.A")
    assert await agent_a.refused("hoist.events.lease.manager")
    assert await agent_a.refused("hoist.heartbeat.B")
    assert await agent_a.refused("hoist.progress.B.pull1")
    assert await agent_a.refused("hoist.api.session.create")
    assert await agent_a.refused(f"$JS.API.STREAM.DELETE.{EVENT_STREAM}")
    assert await agent_a.refused(f"$JS.API.STREAM.CREATE.{EVENT_STREAM}")
    assert await agent_a.refused("$JS.API.INFO")  # its account has no JetStream: nothing to ask
    assert await agent_a.refused(f"$JS.API.STREAM.INFO.{EVENT_STREAM}")


async def test_agent_reads_its_aggregate_and_serves_only_its_rpc(
    agent_a: Conn, manager: Conn
) -> None:
    await agent_a.nc.jetstream().publish("hoist.events.agent.A", b"fact")
    last = await agent_a.nc.jetstream().get_last_msg(
        EVENT_STREAM, "hoist.events.agent.A", direct=True
    )
    assert last.data == b"fact"
    served = await agent_a.nc.subscribe("hoist.agent.A.>", cb=_answer(agent_a.nc))
    await _synced(agent_a.nc)
    reply = await manager.nc.request("hoist.agent.A.check_and_pull", b"{}", timeout=2)
    assert reply.data == b"ok"
    await served.unsubscribe()
    await agent_a.nc.subscribe("hoist.agent.B.>")
    assert await agent_a.reported('subscription to "hoist.agent.b.>"')
    # Not even its own liveness subject: the manager's appends there carry the inbox its
    # JetStream acknowledgement goes to, which an agent allowed to respond could answer first
    # (a forged ack). The manager tells it of a change on hoist.agent.A.liveness-changed.
    await agent_a.nc.subscribe("hoist.events.liveness.A")
    assert await agent_a.reported('subscription to "hoist.events.liveness.a"')


async def test_wrong_password_and_anonymous_are_refused(stack: Stack) -> None:
    for url in (
        stack.url,
        stack.url.replace("nats://", "nats://client:wrong@"),
        stack.url.replace("nats://", "nats://agent-A:" + stack.creds.client + "@"),
    ):
        with pytest.raises(NatsError):
            await connect(url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)


async def test_an_agent_added_later_connects_after_a_reload(stack: Stack) -> None:
    creds = generate_credentials(stack.data_dir, ["D"])
    write_server_config(stack.data_dir, creds, stack.data_dir / "store")
    # nats-server re-reads its config, users included; a new account (the agent's) has its
    # imports wired only by the next reload, so the stack reloads twice (up.add_agent_user).
    await _reload(stack)
    await _reload(stack)
    nc = await connect(
        role_url(stack.url, "agent", creds, "D"), allow_reconnect=False, connect_timeout=2
    )
    ack = await nc.jetstream().publish("hoist.events.agent.D", b"registered", timeout=2)
    assert ack.stream == EVENT_STREAM
    await nc.close()


def test_credentials_are_private_and_reused(stack: Stack) -> None:
    for name in (CREDENTIALS_FILE, "auth.conf", "nats.conf"):
        assert stat.S_IMODE((stack.data_dir / name).stat().st_mode) == 0o600, name
    again = generate_credentials(stack.data_dir, ["A", "C"])
    assert again.manager == stack.creds.manager
    assert again.agents["A"] == stack.creds.agents["A"]
    assert again.agents["C"] not in stack.creds.agents.values()
    assert load_credentials(stack.data_dir) == again
    passwords = [again.manager, again.client, again.admin, *again.agents.values()]
    assert len(set(passwords)) == len(passwords)


def test_no_password_in_the_repo_config(stack: Stack) -> None:
    text = REPO_CONFIG.read_text()
    assert re.search(r"password\s*[:=]", text) is None
    for secret in (stack.creds.manager, stack.creds.client, stack.creds.admin):
        assert secret not in text
    assert 'include "auth.conf"' in text


async def test_no_password_in_any_server_config(stack: Stack) -> None:
    # nats-server checks bcrypt hashes; only credentials.json (0600, the clients') holds the
    # passwords. A user added later too; every role still connects with its own.
    set_user(stack.data_dir, "hashed")
    await _reload(stack)
    creds = load_credentials(stack.data_dir)
    secrets = [creds.manager, creds.client, creds.admin, *creds.agents.values()]
    secrets += [u.password for u in creds.users.values()]
    configs = [p for p in stack.data_dir.iterdir() if p.suffix == ".conf"]
    assert {"auth.conf", "nats.conf"} <= {p.name for p in configs}
    for path in configs:
        text = path.read_text()
        assert not [s for s in secrets if s in text], path
    assert "$2b$" in (stack.data_dir / "auth.conf").read_text()
    user = await _as_user(stack, "hashed")
    await user.nc.close()
    for role in ("client", "admin"):
        await (await _connect(stack, role)).nc.close()
    remove_user(stack.data_dir, "hashed")
    await _reload(stack)


def test_role_url_errors_name_the_field(stack: Stack, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="hoist up"):
        load_credentials(tmp_path)
    with pytest.raises(ValueError, match="role must be one of"):
        role_url(stack.url, "root", stack.creds)
    with pytest.raises(ValueError, match="agent_id"):
        role_url(stack.url, "agent", stack.creds)
    with pytest.raises(KeyError, match="generate_credentials"):
        role_url(stack.url, "agent", stack.creds, "Z")
    assert role_url(stack.url, "admin", stack.creds).startswith(
        f"nats://admin:{stack.creds.admin}@127.0.0.1:"
    )
    # --user with a role's name: no Hoist user can have it, so adding one is no advice.
    role = r"cannot be a Hoist user's name .*role's NATS user"
    with pytest.raises(KeyError, match=role) as refused:
        user_url(stack.url, "admin", stack.creds)
    assert "hoist user add" not in str(refused.value)
    with pytest.raises(KeyError, match="hoist user add ann"):
        user_url(stack.url, "ann", stack.creds)


async def _synced(nc: Client) -> None:
    """Wait until the server has seen everything sent so far. Two flushes: nats-py 2.16 writes a
    flush's PING straight to the socket, ahead of buffered SUBs, so one PONG proves nothing."""
    await nc.flush(timeout=2)
    await nc.flush(timeout=2)


async def _delivered(sender: Conn, receiver: Conn, subject: str) -> bool:
    """The receiver (allowed to subscribe) gets what the sender published on ``subject``."""
    sub = await receiver.nc.subscribe(subject)
    try:
        await _synced(receiver.nc)
        await sender.nc.publish(subject, b"delivered")
        return (await sub.next_msg(timeout=2)).data == b"delivered"
    finally:
        await sub.unsubscribe()


def _answer(nc: Client) -> Callable[[Msg], Awaitable[None]]:
    async def answer(msg: Msg) -> None:
        await nc.publish(msg.reply, b"ok")

    return answer


@pytest.mark.parametrize("process", ["agent", "manager"])
async def test_a_process_with_a_wrong_password_stops_at_once_saying_so(
    stack: Stack, process: str
) -> None:
    # Manager and agent reconnect for ever after an outage; refused credentials end them.
    url = stack.url.replace(
        "nats://", f"nats://{'agent-A' if process == 'agent' else 'manager'}:wrong@"
    )
    args = {
        "agent": ["agent", "--id", "A", "--runtime", "dummy", "--resource-group", "g",
                  "--cpu", "1", "--mem", "1g", "--disk", "1g"],
        "manager": ["services.manager"],
    }[process]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", *args, "--nats-url", url,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert "refused the credentials" in err.decode() and "wrong" not in err.decode()


# --- the log cannot be erased: role x stream operation ----------------------------------------

_ERASE = {  # operation: (JetStream API subject prefix, request)
    "stream update": ("$JS.API.STREAM.UPDATE", None),  # the stream's own config, max_msgs: 1
    "stream delete": ("$JS.API.STREAM.DELETE", None),
    "purge": ("$JS.API.STREAM.PURGE", {}),
    "message delete": ("$JS.API.STREAM.MSG.DELETE", {"seq": 1, "no_erase": True}),
}


async def _attempt(conn: Conn, subject: str, request: object) -> str:
    """Send a JetStream API request; "permission violation", the API's error, or "ok"."""
    replies: list[bytes] = []

    async def on_reply(msg: Msg) -> None:
        replies.append(msg.data)

    inbox = conn.nc.new_inbox()
    sub = await conn.nc.subscribe(inbox, cb=on_reply)
    await _synced(conn.nc)
    payload = b"" if request is None else json.dumps(request).encode()
    await conn.nc.publish(subject, payload, reply=inbox)
    try:
        for _ in range(300):
            if any(f'publish to "{subject.lower()}"' in e for e in conn.errors):
                return "permission violation"
            if replies:
                error = json.loads(replies[0]).get("error")
                return "ok" if error is None else f"error: {error.get('description')}"
            await asyncio.sleep(0.01)
        return "no reply"
    finally:
        await sub.unsubscribe()


@pytest.fixture
async def log_intact(manager: Conn) -> AsyncIterator[None]:
    """A few events in the log; afterwards the stream, its settings and every event are there."""
    js = manager.nc.jetstream()
    for i in range(3):
        await js.publish(f"hoist.events.session.keep{i}", b"keep")
    before = await js.stream_info(EVENT_STREAM)
    yield
    after = await js.stream_info(EVENT_STREAM)
    assert after.state.messages == before.state.messages >= 3
    assert (after.state.first_seq, after.state.last_seq) == (
        before.state.first_seq,
        before.state.last_seq,
    )
    assert after.config == before.config
    assert after.config.max_msgs == -1


@pytest.mark.parametrize("operation", list(_ERASE))
@pytest.mark.parametrize("role", ["manager", "agent", "client", "admin"])
async def test_no_role_can_erase_the_log(
    stack: Stack, manager: Conn, log_intact: None, role: str, operation: str
) -> None:
    agent_id = "A" if role == "agent" else None
    conn = manager if role == "manager" else await _connect(stack, role, agent_id)
    prefix, request = _ERASE[operation]
    info = await manager.nc.jetstream().stream_info(EVENT_STREAM)
    if operation == "stream update":  # what the issue found accepted: keeps one message
        request = {**info.config.as_dict(), "max_msgs": 1}
    if operation == "message delete":
        request = {"seq": info.state.first_seq, "no_erase": True}
    try:
        # The server refuses the stream's own subject, whatever the role.
        assert await _attempt(conn, f"{prefix}.{EVENT_STREAM}", request) == "permission violation"
        # A wildcard in the stream's token names no stream the API acts on; where the role may
        # publish there at all, the API answers with an error.
        for wildcard in ("*", ">"):
            outcome = await _attempt(conn, f"{prefix}.{wildcard}", request)
            assert outcome != "ok" and outcome != "no reply", (wildcard, outcome)
    finally:
        if conn is not manager:
            await conn.nc.close()


async def test_the_attempt_sees_a_change_that_is_allowed(manager: Conn) -> None:
    # The matrix above can fail: the same request on a stream the manager may change succeeds.
    await manager.nc.jetstream().add_stream(StreamConfig(name="SCRATCH", subjects=["scratch.>"]))
    request = {"name": "SCRATCH", "subjects": ["scratch.>"], "storage": "file", "max_msgs": 1}
    assert await _attempt(manager, "$JS.API.STREAM.UPDATE.SCRATCH", request) == "ok"
    assert await _attempt(manager, "$JS.API.STREAM.DELETE.SCRATCH", None) == "ok"


# --- Hoist users: one NATS user each (natsauth.user_permissions), added and removed by a reload


async def _reload(stack: Stack) -> None:
    log = stack.data_dir / "nats-server.log"
    reloads = log.read_text().count("Reloaded server configuration")
    stack.proc.send_signal(signal.SIGHUP)
    for _ in range(200):
        if log.read_text().count("Reloaded server configuration") > reloads:
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"nats-server did not reload its config in 2 s; see {log}")


async def _as_user(stack: Stack, name: str) -> Conn:
    conn = Conn(nc=Client())

    async def on_error(err: Exception) -> None:
        conn.errors.append(str(err).lower())

    await conn.nc.connect(
        user_url(stack.url, name, load_credentials(stack.data_dir)),
        error_cb=on_error,
        allow_reconnect=False,
        connect_timeout=2,
    )
    return conn


async def test_users_publish_only_their_own_subjects_and_read_their_own_inbox(
    stack: Stack, manager: Conn
) -> None:
    pid = stack.proc.pid
    set_user(stack.data_dir, "alice")
    set_user(stack.data_dir, "bob")
    set_user(stack.data_dir, "root", admin=True)
    await _reload(stack)  # no restart: the same nats-server process
    assert stack.proc.pid == pid and stack.proc.poll() is None
    for name in ("alice", "bob", "root"):
        assert load_credentials(stack.data_dir).users[name].password
    assert stat.S_IMODE((stack.data_dir / "auth.conf").stat().st_mode) == 0o600
    alice = await _as_user(stack, "alice")
    root = await _as_user(stack, "root")
    served = await manager.nc.subscribe("hoist.api.>", cb=_answer(manager.nc))
    queries = await manager.nc.subscribe("hoist.query.>", cb=_answer(manager.nc))
    await _synced(manager.nc)
    try:
        assert alice.nc.new_inbox().startswith("_INBOX.alice.")
        reply = await alice.nc.request("hoist.api.alice.session.create", b"{}", timeout=2)
        assert reply.data == b"ok"
        reply = await alice.nc.request("hoist.query.alice.sessions", b"{}", timeout=2)
        assert reply.data == b"ok"
        for subject in (
            "hoist.api.bob.session.create",  # another user's commands
            "hoist.api.session.create",  # the unscoped ones (the client role's, any owner)
            "hoist.query.kernels",
            "hoist.query.bob.sessions",
            "hoist.admin.user.add",
            "hoist.events.session.x",
        ):
            assert await alice.refused(subject), subject
        # Nor may the client and admin roles send on a user's own subjects: what the manager
        # serves there is recorded as that user's doing.
        client = await _connect(stack, "client")
        admin = await _connect(stack, "admin")
        try:
            for role in (client, admin):
                for subject in (
                    "hoist.api.alice.session.destroy",
                    "hoist.query.alice.history",
                    "hoist.admin.root.user.add",
                ):
                    assert await role.refused(subject), subject
        finally:
            await client.nc.close()
            await admin.nc.close()
        for other in ("_INBOX.bob.>", "_INBOX.>", "_INBOX.client.x", "hoist.api.>"):
            await alice.nc.subscribe(other)
            assert await alice.reported(f'subscription to "{other.lower()}"'), other
        # Not the log: every session's command and env are in it (the manager serves a user
        # the events of their own sessions: hoist.query.<user>.history).
        await manager.nc.jetstream().publish("hoist.events.session.u1", b"x")
        assert await alice.refused(f"$JS.API.DIRECT.GET.{EVENT_STREAM}.hoist.events.session.u1")
        assert await alice.refused(f"$JS.API.DIRECT.GET.{EVENT_STREAM}")
        await alice.nc.subscribe("hoist.events.>")
        assert await alice.reported('subscription to "hoist.events.>"')
        # An admin user: commands and queries on its own subjects only (the manager serves
        # them while the user is enabled, and records them as its own), never the log.
        admin_served = await manager.nc.subscribe("hoist.admin.>", cb=_answer(manager.nc))
        await _synced(manager.nc)
        reply = await root.nc.request("hoist.admin.root.user.list", b"{}", timeout=2)
        assert reply.data == b"ok"
        reply = await root.nc.request("hoist.query.root.kernels", b"{}", timeout=2)
        assert reply.data == b"ok"
        await admin_served.unsubscribe()
        for subject in (
            "hoist.admin.user.list",
            "hoist.admin.alice.user.list",
            "hoist.query.kernels",
            "hoist.api.session.destroy",
            f"$JS.API.DIRECT.GET.{EVENT_STREAM}",
        ):
            assert await root.refused(subject), subject
        assert await root.refused("hoist.events.user.root")
    finally:
        await served.unsubscribe()
        await queries.unsubscribe()
        await alice.nc.close()
        await root.nc.close()


async def test_a_removed_user_is_disconnected_and_refused_after_a_reload(
    stack: Stack, manager: Conn
) -> None:
    pid = stack.proc.pid
    set_user(stack.data_dir, "carol")
    await _reload(stack)
    carol = await _as_user(stack, "carol")
    url = user_url(stack.url, "carol", load_credentials(stack.data_dir))
    remove_user(stack.data_dir, "carol")
    assert "carol" not in load_credentials(stack.data_dir).users
    assert "carol" not in (stack.data_dir / "auth.conf").read_text()
    await _reload(stack)
    assert stack.proc.pid == pid and stack.proc.poll() is None
    # nats-server re-checks every client on a reload: one whose user is gone is closed
    # ("authorization violation"), so a disabled user keeps no open connection.
    for _ in range(200):
        if carol.nc.is_closed:
            break
        await asyncio.sleep(0.01)
    assert carol.nc.is_closed, carol.errors
    with pytest.raises(NatsError):
        await connect(url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)


async def test_users_see_only_their_own_sessions_through_a_real_manager(
    stack: Stack, manager: Conn
) -> None:
    set_user(stack.data_dir, "alice")
    set_user(stack.data_dir, "bob")
    await _reload(stack)
    alice = await _as_user(stack, "alice")
    bob = await _as_user(stack, "bob")
    payload = {"image": "base:1", "resources": {"cpu": 1, "mem": 2**28}, "request_id": "r1"}
    try:
        async with running_manager(manager.nc) as m:
            for name in ("alice", "bob"):  # Hoist users too: the manager serves no other
                await m.users.add(AddUser(name=name))
            reply = await alice.nc.request(
                "hoist.api.alice.session.create", json.dumps(payload).encode(), timeout=5
            )
            created = json.loads(reply.data)
            assert created["owner"] == "alice", created
            sid = created["session_id"]
            forged = json.dumps(payload | {"owner": "bob", "request_id": "r2"}).encode()
            reply = await alice.nc.request("hoist.api.alice.session.create", forged, timeout=5)
            assert json.loads(reply.data)["error"]["code"] == "forbidden"
            for verb in ("get", "destroy", "logs"):
                reply = await bob.nc.request(
                    f"hoist.api.bob.session.{verb}",
                    json.dumps({"session_id": sid}).encode(),
                    timeout=5,
                )
                assert json.loads(reply.data)["error"]["code"] == "not-found", verb
            assert await bob.refused("hoist.api.alice.session.get")
            reply = await alice.nc.request(
                "hoist.api.alice.session.get", json.dumps({"session_id": sid}).encode(), timeout=5
            )
            assert json.loads(reply.data)["session_id"] == sid
            seq = (await manager.nc.jetstream().stream_info(EVENT_STREAM)).state.last_seq
            wait = json.dumps({"min_seq": seq, "timeout": 10}).encode()
            for user, rows in (("alice", [sid]), ("bob", [])):
                conn = alice if user == "alice" else bob
                reply = await conn.nc.request(f"hoist.query.{user}.sessions", wait, timeout=12)
                assert [r["session_id"] for r in json.loads(reply.data)["rows"]] == rows, user
            assert await bob.refused("hoist.query.alice.sessions")
    finally:
        await alice.nc.close()
        await bob.nc.close()


def test_users_added_at_once_are_all_kept(tmp_path: Path) -> None:
    """`hoist user add` run six at once lost users (each read credentials.json and auth.conf,
    changed them and wrote them over the others' changes): changes now take turns."""
    generate_credentials(tmp_path, ["A"])
    names = [f"u{i}" for i in range(16)]
    with ThreadPoolExecutor(len(names)) as pool:
        list(pool.map(lambda name: set_user(tmp_path, name), names))
    assert set(load_credentials(tmp_path).users) == set(names)
    auth = (tmp_path / "auth.conf").read_text()
    assert all(f'"user": "{name}"' in auth for name in names), auth
    assert not list(tmp_path.glob("*.tmp"))
