"""Kernels that run the user's work, on the dummy runtime: exits recorded as facts, ended
containers kept for their logs, output streams (logs, exec), volumes, resource slots."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from agent.runtime.base import ExitInfo
from agent.runtime.dummy import DummyConfig, DummyRuntime
from domain import events as ev
from domain import rpc
from eventstore.store import EventStore
from tests.agent.agent_harness import (
    agent_events,
    call,
    config,
    event_of,
    running,
    store_fixture,  # noqa: F401 - the `store` fixture
    wait_for,
)
from transport.client import Client

MB = 1024 * 1024
GB = 1024 * MB
RES = {"cpu": 1, "mem": 256 * MB}


def dummy(**cfg: Any) -> DummyRuntime:
    values: dict[str, Any] = {"bandwidth_bps": None, "preloaded": {"base:1"}}
    return DummyRuntime("a1", DummyConfig(**{**values, **cfg}), address="10.1.2.3")


def kernel(kid: str, command: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    spec = {"command": command} if command is not None else {}
    return {
        "kernel_id": kid,
        "session_id": "s1",
        "image": "base:1",
        "resources": RES,
        "spec": spec,
        **extra,
    }


async def read_all(nc: Client, stream_id: str, within: float = 10) -> dict[str, Any]:
    """Read a stream to its end: {data, dropped, exit_code, reason}."""
    data, dropped, cursor = b"", 0, 0
    deadline = asyncio.get_running_loop().time() + within
    while True:
        chunk = await call(
            nc, "a1", rpc.STREAM_READ, {"stream_id": stream_id, "cursor": cursor, "wait": 1}
        )
        assert "error" not in chunk, chunk  # a refusal (a chunk says why it ended in reason)
        data += base64.b64decode(chunk["data"])
        dropped += chunk.get("dropped", 0)
        cursor = chunk["cursor"]
        if chunk.get("done"):
            return {
                "data": data,
                "dropped": dropped,
                "exit_code": chunk.get("exit_code"),
                "reason": chunk.get("reason"),
            }
        assert asyncio.get_running_loop().time() < deadline, "stream did not end"


async def test_an_exit_is_recorded_once_and_the_container_kept_for_its_logs(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy()
    async with running(nc, store, runtime, config("a1", cpu=2, mem=GB)) as agent:
        script = ["sh", "-c", "echo working; sleep 0.2; echo failing; exit 3"]
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k1", script))
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k2"))  # runs until destroyed
        exited = await event_of(store, "a1", ev.KernelExited, kernel_id="k1")
        assert (exited.session_id, exited.exit_code, exited.oom_killed) == ("s1", 3, False)
        assert exited.reason == "exited: code 3" and 0.2 <= exited.ran_s < 2
        # Its cpu and mem are free again; its container stays.
        assert agent.room.free().cpu == 1 and set(runtime.kernels) == {"k1", "k2"}
        beat = await agent.send_heartbeat()
        assert {k.kernel_id: k.status for k in beat.kernels} == {"k1": "exited", "k2": "running"}

        synced = await call(nc, "a1", rpc.SYNC_KERNELS, {"running": ["k1", "k2"]})
        assert synced == {
            "running": ["k2"],
            "terminating": [],
            "terminated": ["k1"],
            "exits": {"k1": {"exit_code": 3, "oom_killed": False, "ran_s": exited.ran_s}},
        }
        # The manager forgets it (the session ended): kept for `hoist logs` all the same.
        synced = await call(nc, "a1", rpc.SYNC_KERNELS, {"running": ["k2"]})
        assert synced == {"running": ["k2"], "terminating": [], "terminated": []}
        assert set(runtime.kernels) == {"k1", "k2"}
        opened = await call(nc, "a1", rpc.LOGS, {"kernel_id": "k1"})
        assert opened["idle_s"] == 30
        logs = await read_all(nc, opened["stream_id"])
        assert logs == {
            "data": b"working\nfailing\n",
            "dropped": 0,
            "exit_code": None,
            "reason": None,
        }
        for _ in range(3):
            await agent.send_heartbeat()
        await asyncio.sleep(0.3)
    kinds = [type(e).__name__ for e in await agent_events(store, "a1")]
    assert kinds == ["AgentRegistered", "KernelExited"]  # once, though listed many times


async def test_an_ended_container_is_removed_after_keep_exited(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy()
    async with running(nc, store, runtime, config("a1", keep_exited_s=0.5)):
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k1", ["true"]))
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k2"))
        await event_of(store, "a1", ev.KernelExited, kernel_id="k1")
        assert set(runtime.kernels) == {"k1", "k2"}
        await wait_for(lambda: set(runtime.kernels) == {"k2"}, 5, "k1 removed")


async def test_an_exit_that_happened_while_no_agent_ran_is_recorded_at_start(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy()
    await runtime.create("k1", "s1", "base:1", 1.0, 64 * MB)
    runtime.kernels["k1"].exit = ExitInfo(137, oom_killed=True, ran_s=5, finished_at=1e10)
    async with running(nc, store, runtime, config("a1")):
        exited = await event_of(store, "a1", ev.KernelExited, kernel_id="k1")
        assert (exited.exit_code, exited.reason) == (137, "oom-killed")


async def test_exec_logs_follow_and_their_errors(nc: Client, store: EventStore) -> None:
    runtime = dummy()
    async with running(nc, store, runtime, config("a1")):
        script = "echo one; echo two; echo three; sleep 0.3; echo four; exit 5"
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k1", ["sh", "-c", script]))
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k2"))
        opened = await call(nc, "a1", rpc.LOGS, {"kernel_id": "k1", "tail": 1, "follow": True})
        followed = await read_all(nc, opened["stream_id"])
        assert followed["data"] == b"three\nfour\n"

        opened = await call(
            nc,
            "a1",
            rpc.EXEC,
            {"kernel_id": "k2", "command": ["sh", "-c", "echo $WHO; exit 7"], "env": {"WHO": "me"}},
        )
        ran = await read_all(nc, opened["stream_id"])
        assert ran == {"data": b"me\n", "dropped": 0, "exit_code": 7, "reason": None}

        opened = await call(
            nc, "a1", rpc.EXEC, {"kernel_id": "k2", "command": ["sleep", "5"], "timeout": 0.3}
        )
        slow = await read_all(nc, opened["stream_id"])
        assert (slow["exit_code"], slow["reason"]) == (124, "timed out after 0.3s")
        assert not runtime.kernels["k2"].execs  # killed

        ended = await call(nc, "a1", rpc.EXEC, {"kernel_id": "k1", "command": ["true"]})
        assert ended["error"]["code"] == "conflict"
        assert "has ended (exit code 5)" in ended["error"]["message"]
        for verb in (rpc.LOGS, rpc.EXEC):
            missing = await call(nc, "a1", verb, {"kernel_id": "nope", "command": ["true"]})
            if verb == rpc.LOGS:
                missing = await call(nc, "a1", verb, {"kernel_id": "nope"})
            assert missing["error"]["code"] == "not-found", missing
        gone = await call(nc, "a1", rpc.STREAM_READ, {"stream_id": "abc"})
        assert gone["error"]["code"] == "not-found"


async def test_a_slow_reader_gets_dropped_counts_and_never_blocks_the_agent(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy(output_bps=200_000, tick_s=0.02)
    async with running(nc, store, runtime, config("a1")) as agent:
        agent.streams.limit = 8192  # the per-stream buffer
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k1"))
        opened = await call(nc, "a1", rpc.LOGS, {"kernel_id": "k1", "follow": True})
        await asyncio.sleep(0.5)  # ~100 kB written; nobody reads
        chunk = await call(
            nc, "a1", rpc.STREAM_READ, {"stream_id": opened["stream_id"], "max_bytes": 4096}
        )
        assert chunk["dropped"] > 50_000 and len(base64.b64decode(chunk["data"])) == 4096
        assert chunk["cursor"] == chunk["dropped"] + 4096 and not chunk.get("done")
        # The agent answers meanwhile: the producer never waits for this reader.
        assert "container_id" in await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k2"))


async def test_an_unread_stream_closes_and_its_exec_is_killed(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy()
    async with running(nc, store, runtime, config("a1", stream_idle_s=0.4)) as agent:
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k1"))
        opened = await call(
            nc, "a1", rpc.EXEC, {"kernel_id": "k1", "command": ["sleep", "infinity"]}
        )
        assert opened["idle_s"] == 0.4
        assert runtime.kernels["k1"].execs
        await wait_for(lambda: not runtime.kernels["k1"].execs, 5, "the exec killed")
        read = await call(nc, "a1", rpc.STREAM_READ, {"stream_id": opened["stream_id"]})
        assert read["error"]["code"] == "not-found"
        assert "stream expired or evicted: open it again" in read["error"]["message"]
        assert agent.streams.open == {}


async def test_stream_limits_a_session_and_evict_the_least_recently_used(
    nc: Client, store: EventStore
) -> None:
    """One session's unread streams cannot block another's logs or exec: a session has its
    own cap, and a full agent evicts its least recently used stream (killing its exec)."""
    runtime = dummy()
    async with running(nc, store, runtime, config("a1")) as agent:
        agent.streams.max_session_streams, agent.streams.max_streams = 2, 3
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k1"))
        await call(nc, "a1", rpc.CREATE_KERNEL, {**kernel("k2"), "session_id": "s2"})
        first = await call(
            nc, "a1", rpc.EXEC, {"kernel_id": "k1", "command": ["sleep", "infinity"]}
        )
        second = await call(nc, "a1", rpc.LOGS, {"kernel_id": "k1", "follow": True})
        assert "stream_id" in second, second
        third = await call(nc, "a1", rpc.LOGS, {"kernel_id": "k1", "follow": True})
        assert third["error"]["code"] == "conflict", third
        assert "session s1 has 2 streams open on agent a1" in third["error"]["message"]
        assert "idle_s" in third["error"]["message"]
        # Another session is not blocked: the agent has room for one more...
        theirs = await call(nc, "a1", rpc.LOGS, {"kernel_id": "k2", "follow": True})
        assert "stream_id" in theirs, theirs
        await call(nc, "a1", rpc.STREAM_READ, {"stream_id": first["stream_id"]})  # used now
        # ...and then makes room by evicting the least recently used: s1's follow stream.
        again = await call(nc, "a1", rpc.EXEC, {"kernel_id": "k2", "command": ["true"]})
        assert "stream_id" in again, again
        evicted = await call(nc, "a1", rpc.STREAM_READ, {"stream_id": second["stream_id"]})
        assert evicted["error"]["code"] == "not-found", evicted
        assert "stream expired or evicted: open it again" in evicted["error"]["message"]
        assert set(agent.streams.open) == {
            first["stream_id"],
            theirs["stream_id"],
            again["stream_id"],
        }
        # s1 has one stream again: it may open another (evicting, again, the least recent).
        reopened = await call(nc, "a1", rpc.LOGS, {"kernel_id": "k1", "follow": True})
        assert "stream_id" in reopened, reopened
        assert theirs["stream_id"] not in agent.streams.open
        # The exec's stream is the least recently used now: evicted, its command is killed.
        assert runtime.kernels["k1"].execs
        await call(nc, "a1", rpc.LOGS, {"kernel_id": "k2", "follow": True})
        assert first["stream_id"] not in agent.streams.open
        assert {again["stream_id"], reopened["stream_id"]} < set(agent.streams.open)
        await wait_for(lambda: not runtime.kernels["k1"].execs, 5, "the evicted exec killed")


async def test_volumes_list_remove_and_conflicts(nc: Client, store: EventStore) -> None:
    runtime = dummy()
    async with running(nc, store, runtime, config("a1")) as agent:
        mounts = {"mounts": [{"volume": "data", "path": "/data"}]}
        alice = kernel("k1", None, owner="alice")
        alice["spec"] = mounts
        await call(nc, "a1", rpc.CREATE_KERNEL, alice)
        listed = await call(nc, "a1", rpc.VOLUMES, {})
        assert listed == {"volumes": [{"name": "data", "owner": "alice", "used_by": ["k1"]}]}
        assert await call(nc, "a1", rpc.VOLUMES, {"owner": "bob"}) == {"volumes": []}
        assert (await agent.send_heartbeat()).volumes == ["data"]

        bob = {**alice, "kernel_id": "k2", "owner": "bob"}
        refused = await call(nc, "a1", rpc.CREATE_KERNEL, bob)
        assert refused["error"] == {
            "code": "create-failed",
            "message": "volume data belongs to another owner",
        }
        in_use = await call(nc, "a1", rpc.VOLUME_REMOVE, {"name": "data"})
        assert in_use["error"]["code"] == "conflict" and "k1" in in_use["error"]["message"]
        theirs = await call(nc, "a1", rpc.VOLUME_REMOVE, {"name": "data", "owner": "bob"})
        assert theirs["error"] == {
            "code": "conflict",
            "message": "volume data belongs to another owner",
        }
        await call(nc, "a1", rpc.DESTROY_KERNEL, {"kernel_id": "k1"})
        removed = await call(nc, "a1", rpc.VOLUME_REMOVE, {"name": "data", "owner": "alice"})
        assert removed == {"removed": True}
        assert await call(nc, "a1", rpc.VOLUME_REMOVE, {"name": "data"}) == {"removed": False}
        assert (await agent.send_heartbeat()).volumes == []


async def test_gpu_slots_are_offered_reserved_and_freed(nc: Client, store: EventStore) -> None:
    runtime = dummy(slots={"gpu": 2})
    cfg = config("a1", slots={"gpu": 2.0}, address="10.1.2.3")
    gpu = {"cpu": 1, "mem": 256 * MB, "slots": {"gpu": 1}}
    async with running(nc, store, runtime, cfg) as agent:
        [registered] = await agent_events(store, "a1")
        assert registered.capacity.slots == {"gpu": 2.0}
        first = await call(
            nc, "a1", rpc.CREATE_KERNEL, kernel("k1", None, resources=gpu, spec={"ports": [8888]})
        )
        assert first["ports"] == [{"port": 8888, "host": "10.1.2.3", "host_port": 30001}]
        await call(
            nc, "a1", rpc.CREATE_KERNEL, kernel("k2", ["sh", "-c", "sleep 0.3"], resources=gpu)
        )
        third = await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k3", None, resources=gpu))
        assert third["error"]["code"] == "insufficient-resources"
        assert "gpu 1 (free 0)" in third["error"]["message"]
        beat = await agent.send_heartbeat()
        assert beat.free.slots == {"gpu": 0} and beat.address == "10.1.2.3"
        await event_of(store, "a1", ev.KernelExited, kernel_id="k2")  # frees its gpu
        third = await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k3", None, resources=gpu))
        assert "container_id" in third, third
        await call(nc, "a1", rpc.DESTROY_KERNEL, {"kernel_id": "k1"})
        assert agent.room.free().slots == {"gpu": 1}

    no_gpu = dummy()  # the agent says gpu=2, the host has none: the runtime's own error
    async with running(nc, store, no_gpu, config("a1", slots={"gpu": 2.0})):
        failed = await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k9", None, resources=gpu))
        assert failed["error"]["code"] == "create-failed"
        assert "could not select device driver" in failed["error"]["message"]
