"""The read models in the manager's child process (services.manager.read_models_process): they
answer queries as in-process ones do, judge users from the log, hear heartbeats themselves, are
started again when they die, and die with the manager."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from domain.subjects import QUERY, SQL_SUBJECT, USER_ADD, USER_DISABLE
from eventstore.store import EventStore
from services.manager import queries, read_models_process
from services.manager.queries import served_subjects
from services.manager.read_models_process import ReadModelsProcess
from services.stack.natsserver import NatsServer
from tests.agent.agent_harness import wait_for
from tests.manager.harness import agents, create, manager, request, until
from transport.client import Client


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


async def _rows(
    nc: Client, name: str, user: str | None = None, within: float = 10, **req: Any
) -> Any:
    subject = f"{QUERY}.{user}.{name}" if user else f"{QUERY}.{name}"
    return await request(nc, subject, req, within=within, user=user)


async def test_queries_users_and_heartbeats_are_answered_from_the_child(
    nats_server: NatsServer, nc: Client, store: EventStore
) -> None:
    async with (
        agents(nc, store, ["a1"]),
        manager(nc, read_models_url=nats_server.url, read_models_threads=2) as m,
    ):
        assert isinstance(m.read_models, ReadModelsProcess)
        threads = await request(nc, SQL_SUBJECT, {"sql": "SELECT current_setting('threads')"})
        assert threads["rows"] == [[2]], threads  # --read-models-threads reaches the child
        sid = (await create(nc))["session_id"]
        await until(nc, sid, lambda s: s["status"] == "RUNNING")
        seq = await store.head()
        rows = await _rows(nc, "sessions", min_seq=seq, timeout=10)
        assert [r["session_id"] for r in rows["rows"]] == [sid], rows

        # A user added a moment ago is not refused because the model is behind the command.
        for name in ("alice", "root"):
            added = await request(nc, USER_ADD, {"name": name, "admin": name == "root"})
            assert "error" not in added, added
        mine = await _rows(nc, "sessions", user="alice")
        assert [r["session_id"] for r in mine["rows"]] == [sid], mine
        fleet = await _rows(nc, "agents", user="root")  # fleet-wide: an admin user's only
        assert [r["agent_id"] for r in fleet["rows"]] == ["a1"], fleet
        refused = await _rows(nc, "agents", user="alice")
        assert refused["error"]["code"] == "forbidden", refused
        await request(nc, USER_DISABLE, {"name": "alice"})
        gone = await _rows(nc, "sessions", user="alice")
        assert gone["error"]["code"] == "forbidden", gone
        never = await _rows(nc, "sessions", user="mallory")
        assert "not an enabled Hoist user" in never["error"]["message"], never

        # The agents query's last_heartbeat_at: heard by the child itself.
        async def heard() -> bool:
            rows = (await _rows(nc, "agents"))["rows"]
            return bool(rows) and rows[0]["last_heartbeat_at"] is not None

        await wait_for(heard, 20, "a heartbeat in the agents query")

        # /metrics' lag base: the sequence the child reports.
        await wait_for(lambda: (m._read_seq() or 0) >= seq, 10, "the child's sequence")


async def test_a_child_that_dies_is_started_again(
    nats_server: NatsServer, nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(read_models_process, "RESTART_S", (0.05, 30.0))
    async with manager(nc, read_models_url=nats_server.url) as m:
        assert isinstance(m.read_models, ReadModelsProcess)
        first = m.read_models._proc
        assert first is not None
        # Its restart is held until the checks of the manager's answers meanwhile are done
        # (however long they take on a loaded host); then the child starts as ever.
        checked = asyncio.Event()
        start_child = m.read_models._start_child

        async def held() -> None:
            await checked.wait()
            await start_child()

        monkeypatch.setattr(m.read_models, "_start_child", held)
        await request(nc, USER_ADD, {"name": "alice"})
        first.send_signal(signal.SIGKILL)

        # Meanwhile the manager answers every query itself: unavailable, and why (no answer
        # at all read as no manager running); a user's own only on their inboxes.
        async def said_why() -> bool:
            try:
                return "error" in await _rows(nc, "agents", within=1)
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                # the moment between the child's end and the manager's stand-in (a request
                # routed to the killed child before nats-server saw it gone is lost)
                return False

        await wait_for(said_why, 10, "the manager's answer while the child is down")
        down = await _rows(nc, "agents")
        assert down["error"]["code"] == "unavailable", down
        assert "read models process ended (exit code -9" in down["error"]["message"], down
        assert "retry" in down["error"]["message"], down
        mine = await _rows(nc, "sessions", user="alice")
        assert mine["error"]["code"] == "unavailable", mine
        # Not on another user's inbox (the subject names alice).
        stolen = await nc.subscribe("_INBOX.bob.steal")
        await nc.publish(f"{QUERY}.alice.sessions", b"{}", reply="_INBOX.bob.steal")
        with pytest.raises(nats.errors.TimeoutError):
            await stolen.next_msg(timeout=0.5)
        checked.set()

        async def answered_again() -> bool:
            proc = m.read_models._proc
            if proc is first or proc is None or proc.returncode is not None:
                return False
            try:
                return "rows" in await _rows(nc, "agents")
            except (TimeoutError, nats.errors.NoRespondersError):
                return False

        await wait_for(answered_again, 30, "the read models answering again")


def test_the_child_dies_with_a_killed_manager(nats_server: NatsServer, tmp_path: Path) -> None:
    argv = ["-m", "services.manager", "--nats-url", nats_server.url, "--lease-ttl", "0"]
    proc = subprocess.Popen(
        [sys.executable, *argv, "--read-models", str(tmp_path / "rm.duckdb")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "manager ready" in line:
                break
        children = _children(proc.pid)
        assert children, "the manager started no read models process"
        proc.kill()
        proc.wait(10)

        def gone() -> bool:
            return not any(os.path.exists(f"/proc/{c}") for c in children)

        asyncio.run(wait_for(gone, 20, "the read models process ending"))
    finally:
        proc.kill()
        proc.wait()


async def test_a_users_model_behind_the_users_record_refuses_with_a_retry(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A per-user query is never judged on a model that has not folded the user's latest record:
    it could still hold an admin demoted or a user disabled a moment ago (a child catching up
    from the start after a restart). The answer is ``unavailable``, not the stale standing."""
    async with manager(nc) as m:  # in-process: its runner can be stopped here
        assert not isinstance(m.read_models, ReadModelsProcess)
        await request(nc, USER_ADD, {"name": "alice", "admin": True})
        fleet = await _rows(nc, "agents", user="alice")
        assert "rows" in fleet, fleet  # judged on the folded record: an admin
        [folding] = [t for t in m.read_models._tasks._tasks if t.get_name() == "projections"]
        folding.cancel()  # the model stops where it is: alice an admin
        await asyncio.gather(folding, return_exceptions=True)
        # It will never fold what comes next: how long a query waits for it is no matter.
        monkeypatch.setattr(queries, "USER_WAIT_S", 0.1)
        await request(nc, USER_DISABLE, {"name": "alice"})
        stale = await _rows(nc, "agents", user="alice")
        assert stale["error"]["code"] == "unavailable", stale
        assert "retry" in stale["error"]["message"], stale


async def test_the_manager_stands_in_on_every_subject_the_queries_take(nc: Client) -> None:
    """answer_unavailable covers what serve_queries subscribes: one list, checked here."""
    async with manager(nc) as m:
        assert not isinstance(m.read_models, ReadModelsProcess)
        served = sorted(sub.subject for sub in m.read_models._subs)
    assert served == sorted(served_subjects())


def test_the_child_keeps_its_collector_pauses_short_from_before_it_connects() -> None:
    """The runner's state lives as long as the process: a full collection visiting all of it
    took 150 ms at 22,500 live sessions, so the child keeps its pauses short as the manager
    does (transport.gc_pauses), from before it connects."""
    script = (
        "from services.manager import read_models_process as child\n"
        "def frozen():\n"
        "    raise ValueError('pauses kept short')\n"
        "child.keep_pauses_short = frozen\n"
        "raise SystemExit(child.main([':memory:']))\n"
    )
    env = {**os.environ, read_models_process.URL_ENV: "nats://127.0.0.1:1"}
    try:
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=15
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the child tried to connect before it kept its pauses short")
    assert out.returncode == 2, out
    assert "pauses kept short" in out.stderr, out.stderr


async def test_admin_sql_has_a_memory_cap_of_its_own(
    nats_server: NatsServer, nc: Client, store: EventStore
) -> None:
    """A query past --admin-sql-memory fails, saying so and what to do; the read models answer
    the next query and the manager creates the next session, their own memory uncapped."""
    cap = 256 << 20
    async with (
        agents(nc, store, ["a1"]),
        manager(nc, read_models_url=nats_server.url, admin_sql_memory=cap) as m,
    ):
        pid = m.read_models._proc.pid  # type: ignore[union-attr]
        huge = [
            "SELECT len(range(100000000))",  # a list DuckDB's memory_limit does not count
            "SELECT len(list(range)) FROM range(200000000)",
            "SELECT length(string_agg(a.range::VARCHAR || b.range::VARCHAR, ','))"
            " FROM range(100000) a, range(1000) b",
        ]
        for sql in huge:
            reply = await request(nc, SQL_SUBJECT, {"sql": sql, "time_limit": 30}, within=40)
            error = reply["error"]
            assert error["code"] == "memory", (sql, reply)
            for said in ("256 MiB", "narrow it", "LIMIT", "--admin-sql-memory"):
                assert said in error["message"], (said, error)
        assert m.read_models._proc.pid == pid  # type: ignore[union-attr]  # not restarted
        sid = (await create(nc))["session_id"]
        await until(nc, sid, lambda s: s["status"] == "RUNNING")
        seq = await store.head()
        count = await request(
            nc, SQL_SUBJECT, {"sql": "SELECT count(*) FROM sessions", "min_seq": seq}
        )
        assert count["rows"] == [[1]], count
        rows = await _rows(nc, "sessions", min_seq=seq, timeout=10)
        assert [r["session_id"] for r in rows["rows"]] == [sid], rows
