"""Kernels that run the user's work (issue 13), through the whole system on dummy agents: exit
codes and reasons, batch sessions ending on their own, logs and exec over NATS, ports, resource
slots, single-node clusters, the cluster env, create validation, and 1,000 batch sessions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from agent.pulls import PullPolicy
from agent.server import AgentServer
from domain import rpc, subjects
from domain.codec import TYPE_HEADER
from domain.subjects import (
    SESSION_CREATE,
    SESSION_DESTROY,
    SESSION_EXEC,
    SESSION_LOGS,
    query_subject,
)
from eventstore.store import EventStore
from tests.agent.agent_harness import config, running, wait_for
from tests.manager.harness import (
    ENDED,
    GB,
    MB,
    agents,
    create,
    create_payload,
    dummy,
    ended,
    logs,
    manager,
    read_stream,
    request,
    until,
)
from transport.client import Client


async def query(nc: Client, name: str, **filters: Any) -> list[dict[str, Any]]:
    reply = await request(nc, query_subject(name), filters)
    assert "error" not in reply, reply
    return reply["rows"]  # type: ignore[no-any-return]


async def kernel_rows(nc: Client, session_id: str, n: int = 1) -> list[dict[str, Any]]:
    """The kernels read model's rows of a session, once all ``n`` are there and final."""
    rows: list[dict[str, Any]] = []

    async def final() -> bool:
        nonlocal rows
        rows = await query(nc, "kernels", session_id=session_id)
        return len(rows) == n and all(r["status"] in ENDED for r in rows)

    await wait_for(final, 10, f"kernels of {session_id} final in the read model: {rows}")
    return rows


@asynccontextmanager
async def slot_agents(
    nc: Client, store: EventStore, slots: dict[str, dict[str, float]]
) -> AsyncIterator[dict[str, AgentServer]]:
    """Dummy agents (like harness.agents) with resource slots: agent id -> {slot: amount}, as
    ``hoist-agent --slot gpu=1`` offers them and the host has them."""
    async with AsyncExitStack() as stack:
        out = {}
        for agent_id, offered in slots.items():
            cfg = config(
                agent_id,
                cpu=4,
                mem=8 * GB,
                disk=100 * GB,
                resource_group="default",
                slots=offered,
                pulls=PullPolicy(backoff_s=0.05, stall_timeout_s=60),
            )
            runtime = dummy(agent_id, slots=offered)
            out[agent_id] = await stack.enter_async_context(running(nc, store, runtime, cfg))
        yield out


# -- exit codes and batch sessions -----------------------------------------------------------


async def test_a_batch_session_ends_with_its_commands_exit_code_and_keeps_its_logs(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"]) as running_, manager(nc) as m:
        created = await create(nc, session_type="batch", command=["sh", "-c", "echo hello; exit 3"])
        sid = created["session_id"]
        done = await until(nc, sid, ended, what="ended")
        assert done["status"] == "TERMINATED", done
        assert done["status_info"] == "exited: code 3", done
        [kernel] = done["kernels"]
        assert kernel["exit_code"] == 3 and kernel["ran_s"] is not None and kernel["ran_s"] >= 0
        assert kernel["status_info"] == "exited: code 3"
        [row] = await kernel_rows(nc, sid)
        assert row["exit_code"] == 3 and row["ran_s"] is not None, row
        assert row["status"] == "TERMINATED"
        # Logs after the session ended: the container is kept (--keep-exited) with its output.
        assert await logs(nc, sid) == b"hello\n"
        assert await logs(nc, sid, kernel_id="main1", tail=1) == b"hello\n"
        assert sid in {k.session_id for k in running_["a1"].runtime.kernels.values()}
        assert all(s.reserved_cpu == 0 for s in m.fleet.agents.values())


async def test_a_batch_session_whose_command_exits_0_succeeds(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"]), manager(nc):
        created = await create(nc, session_type="batch", command=["exit", "0"])
        done = await until(nc, created["session_id"], ended, what="ended")
        assert (done["status"], done["status_info"]) == ("TERMINATED", "succeeded"), done
        assert done["kernels"][0]["exit_code"] == 0
        print(
            "AGENT",
            [
                r.headers.get(TYPE_HEADER)
                for r in await store.read_subject(subjects.agent_events("a1"))
            ],
        )
        [row] = await kernel_rows(nc, created["session_id"])
        assert row["exit_code"] == 0 and row["status_info"] == "succeeded", row


async def test_logs_follow_a_running_kernel(nc: Client, store: EventStore) -> None:
    async with agents(nc, store, ["a1"]), manager(nc):
        created = await create(
            nc,
            session_type="batch",
            command=["sh", "-c", "echo one; sleep 0.5; echo two; exit 1"],
            max_wait=5,
        )
        assert created["status"] == "RUNNING", created
        opened = await request(
            nc, SESSION_LOGS, {"session_id": created["session_id"], "follow": True}
        )
        data, last = await read_stream(nc, opened)
        assert data == b"one\ntwo\n" and last.get("done"), (data, last)
        done = await until(nc, created["session_id"], ended, what="ended")
        assert done["status_info"] == "exited: code 1"


async def test_exec_returns_output_and_exit_code(nc: Client, store: EventStore) -> None:
    async with agents(nc, store, ["a1"]) as running_, manager(nc):
        created = await create(nc, command=["sleep", "infinity"], env={"X": "ex"}, max_wait=5)
        assert created["status"] == "RUNNING", created
        sid = created["session_id"]
        opened = await request(
            nc, SESSION_EXEC, {"session_id": sid, "command": ["sh", "-c", "echo hi $X; exit 4"]}
        )
        data, last = await read_stream(nc, opened)
        assert data == b"hi ex\n" and last.get("exit_code") == 4, (data, last)
        assert running_["a1"].runtime.execs == [["sh", "-c", "echo hi $X; exit 4"]]
        opened = await request(nc, SESSION_EXEC, {"session_id": sid, "command": ["true"]})
        assert (await read_stream(nc, opened))[1].get("exit_code") == 0
        # A timeout ends the stream with a reason, relayed as is: no "error" (a refusal's key).
        opened = await request(
            nc, SESSION_EXEC, {"session_id": sid, "command": ["sleep", "9"], "timeout": 0.3}
        )
        _, last = await read_stream(nc, opened)
        assert (last.get("exit_code"), last.get("reason")) == (124, "timed out after 0.3s"), last
        # A kernel name that is not the session's: not-found, naming the field.
        reply = await request(
            nc, SESSION_EXEC, {"session_id": sid, "kernel_id": "sub9", "command": ["true"]}
        )
        assert reply["error"]["code"] == "not-found" and "kernel_id" in reply["error"]["message"]
        await request(nc, SESSION_DESTROY, {"session_id": sid})
        gone = await until(nc, sid, ended, what="ended")
        # Exec needs a running kernel.
        reply = await request(nc, SESSION_EXEC, {"session_id": sid, "command": ["true"]})
        assert reply["error"]["code"] == "conflict", (reply, gone)


async def test_an_interactive_kernel_whose_command_ends_is_recorded_with_its_code(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"]), manager(nc):
        created = await create(nc, command=["sh", "-c", "sleep 0.2; exit 5"], max_wait=5)
        assert created["status"] == "RUNNING", created
        done = await until(nc, created["session_id"], ended, what="ended")
        [kernel] = done["kernels"]
        assert kernel["status"] == "TERMINATED", kernel
        assert kernel["status_info"] == "exited: code 5" and kernel["exit_code"] == 5, kernel
        assert kernel["ran_s"] >= 0.2, kernel
        [row] = await kernel_rows(nc, created["session_id"])
        assert row["exit_code"] == 5, row


async def test_when_a_batch_sessions_main_kernel_exits_its_sub_kernels_end(
    nc: Client, store: EventStore
) -> None:
    # main1 finds no X_main and exits 4 at once; sub1 finds X_sub and sleeps: main ends first.
    script = "printenv X_$HOIST_CLUSTER_ROLE && sleep 30; exit 4"
    async with agents(nc, store, ["a1", "a2"]) as running_, manager(nc):
        created = await create(
            nc,
            session_type="batch",
            cluster_size=2,
            command=["sh", "-c", script],
            env={"X_sub": "1"},
        )
        sid = created["session_id"]
        done = await until(nc, sid, ended, what="ended")
        assert done["status"] == "TERMINATED", done
        by_name = {k["hostname"]: k for k in done["kernels"]}
        assert by_name["main1"]["status_info"] == "exited: code 4", done
        assert by_name["main1"]["exit_code"] == 4
        assert by_name["sub1"]["status"] == "TERMINATED", done
        assert by_name["sub1"]["status_info"].startswith("session-ended"), done
        assert by_name["sub1"]["exit_code"] is None  # stopped, its command never ended
        # sub1's container was removed, main1's kept with its logs.
        sub_agent = by_name["sub1"]["agent_id"]
        await wait_for(
            lambda: by_name["sub1"]["kernel_id"] not in running_[sub_agent].runtime.kernels,
            5,
            "sub1's container removed",
        )
        assert (
            by_name["main1"]["kernel_id"] in running_[by_name["main1"]["agent_id"]].runtime.kernels
        )


# -- ports, env, slots, cluster modes ---------------------------------------------------------


async def test_ports_appear_in_the_view(nc: Client, store: EventStore) -> None:
    async with agents(nc, store, ["a1"]), manager(nc):
        created = await create(nc, command=["sleep", "infinity"], ports=[8080, 22], max_wait=5)
        assert created["status"] == "RUNNING", created
        [kernel] = created["kernels"]
        assert sorted(p["port"] for p in kernel["ports"]) == [22, 8080], kernel
        assert all(p["host"] and p["host_port"] > 0 for p in kernel["ports"]), kernel
        assert len({p["host_port"] for p in kernel["ports"]}) == 2
        view = await until(nc, created["session_id"])
        assert view["kernels"][0]["ports"] == kernel["ports"]


async def test_the_cluster_env_and_the_users_env_reach_the_kernel(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1", "a2"]) as running_, manager(nc):
        created = await create(
            nc,
            session_type="batch",
            cluster_size=2,
            command=["sh", "-c", "echo $HOIST_CLUSTER_HOSTS $HOIST_CLUSTER_ROLE $X; sleep 0.3"],
            env={"X": "mine"},
        )
        sid = created["session_id"]
        done = await until(nc, sid, ended, what="ended")
        assert done["status_info"] == "succeeded", done
        assert await logs(nc, sid) == b"main1,sub1 main mine\n"
        main = done["kernels"][0]
        spec = running_[main["agent_id"]].runtime.kernels[main["kernel_id"]].spec
        assert spec.env["HOIST_SESSION_ID"] == sid
        assert spec.env["HOIST_CLUSTER_SIZE"] == "2" and spec.env["HOIST_CLUSTER_IDX"] == "1"
        assert spec.env["X"] == "mine"


async def test_a_gpu_slot_is_placed_only_where_it_is_free_and_freed_after(
    nc: Client, store: EventStore
) -> None:
    gpu = {"cpu": 1, "mem": 256 * MB, "gpu": 1}
    async with slot_agents(nc, store, {"plain": {}, "gpu1": {"gpu": 1}}), manager(nc) as m:
        first = await create(nc, resources=gpu, command=["sleep", "infinity"], max_wait=5)
        assert first["status"] == "RUNNING", first["kernels"]
        assert first["kernels"][0]["agent_id"] == "gpu1"
        # The only gpu is taken: the next one waits, though "plain" has cpu and mem to spare.
        second = await create(nc, resources=gpu, command=["sleep", "infinity"])
        waiting = await until(
            nc, second["session_id"], lambda s: "no-available" in s["status_info"], 5, "waiting"
        )
        assert waiting["status"] == "PENDING", waiting
        # A session without gpu still goes anywhere.
        plain = await create(nc, command=["sleep", "infinity"], max_wait=5)
        assert plain["status"] == "RUNNING", plain
        await request(nc, SESSION_DESTROY, {"session_id": first["session_id"]})
        placed = await until(nc, second["session_id"], within=10)
        assert placed["status"] == "RUNNING", placed["kernels"]
        assert placed["kernels"][0]["agent_id"] == "gpu1"
        await request(nc, SESSION_DESTROY, {"session_id": second["session_id"]})
        await until(nc, second["session_id"], ended, what="ended")
        await wait_for(
            lambda: m.fleet.agents["gpu1"].reserved_slots.get("gpu", 0) == 0, 5, "gpu freed"
        )


async def test_a_gpu_asked_where_no_agent_offers_one_is_refused(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"]), manager(nc):
        payload = create_payload(resources={"cpu": 1, "mem": 256 * MB, "gpu": 1})
        reply = await request(nc, SESSION_CREATE, payload)
        assert reply["error"]["message"].startswith(
            "resources.gpu: asks 1 gpu but no live agent of resource group 'default' offers gpu"
        ), reply


async def test_a_single_node_cluster_places_every_kernel_on_one_agent(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1", "a2", "a3"]) as running_, manager(nc):
        created = await create(
            nc, cluster_size=3, cluster_mode="single-node", command=["sleep", "infinity"],
            max_wait=5,
        )  # fmt: skip
        assert created["status"] == "RUNNING", created
        assert created["cluster_mode"] == "single-node"
        assert len({k["agent_id"] for k in created["kernels"]}) == 1, created
        assert [k["hostname"] for k in created["kernels"]] == ["main1", "sub1", "sub2"]
        [agent_id] = {k["agent_id"] for k in created["kernels"]}
        hosts = {
            k.spec.env["HOIST_CLUSTER_HOST"] for k in running_[agent_id].runtime.kernels.values()
        }
        assert hosts == {"main1", "sub1", "sub2"}
        # Multi-node (the default) disperses the same request (over the other two agents: the
        # single-node session holds 3 of its agent's 4 cores).
        multi = await create(nc, cluster_size=3, command=["sleep", "infinity"], max_wait=5)
        assert len({k["agent_id"] for k in multi["kernels"]}) > 1, multi["kernels"]


async def test_a_single_node_cluster_too_big_for_any_one_agent_is_refused(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1", "a2"], cpu=2), manager(nc):
        payload = create_payload(cluster_size=3, cluster_mode="single-node")
        reply = await request(nc, SESSION_CREATE, payload)
        assert reply["error"]["message"].startswith(
            "resources.cpu: the 3 kernels of this single-node session ask 3 cpu on one agent"
            " but the largest live agent of resource group 'default', a1, has 2 cpu"
        ), reply


# -- the create request's new fields at the door -----------------------------------------------


async def test_bad_work_fields_name_the_field_and_change_nothing(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"]), manager(nc) as m:
        before = await store.last_seq(f"{subjects.EVENTS}.>")
        cases = {
            "command": [create_payload(command="echo hi"), create_payload(command=[])],
            "env": [create_payload(env={"X": 1}), create_payload(env=["X=1"])],
            "workdir": [create_payload(workdir="relative/dir")],
            "session_type": [create_payload(session_type="cron")],
            "cluster_mode": [create_payload(cluster_mode="everywhere")],
            "ports": [create_payload(ports=[0]), create_payload(ports=[70000]),
                      create_payload(ports=["http"])],
            "mounts": [create_payload(mounts=[{"volume": "v", "path": "rel"}]),
                       create_payload(mounts=[{"path": "/data"}]),
                       create_payload(mounts="v:/data")],
            "resources.gpu": [create_payload(resources={"cpu": 1, "mem": MB, "gpu": -1})],
        }  # fmt: skip
        for field, payloads in cases.items():
            for payload in payloads:
                reply = await request(nc, SESSION_CREATE, payload)
                assert "error" in reply, (field, payload, reply)
                assert reply["error"]["code"] == "invalid-request", (field, reply)
                assert field in reply["error"]["message"], (field, reply)
        assert await store.last_seq(f"{subjects.EVENTS}.>") == before
        assert not m.fleet.sessions


# -- at scale ------------------------------------------------------------------------------------


async def test_a_thousand_batch_sessions_on_fifty_agents_end_with_their_exit_codes(
    nc: Client, store: EventStore
) -> None:
    n = 1000
    ids = [f"a{i:02d}" for i in range(50)]
    async with agents(nc, store, ids), manager(nc) as m:
        start = time.monotonic()
        gate = asyncio.Semaphore(100)

        async def one(i: int) -> str:
            async with gate:
                reply = await request(
                    nc,
                    SESSION_CREATE,
                    create_payload(
                        owner=f"u{i % 13}",
                        session_type="batch",
                        command=["sh", "-c", f"echo {i}; exit {i % 7}"],
                        resources={"cpu": 0.5, "mem": 64 * MB},
                        request_id=f"batch-{i}",
                    ),
                    within=30,
                )
            assert "error" not in reply, reply
            return reply["session_id"]  # type: ignore[no-any-return]

        sids = await asyncio.gather(*(one(i) for i in range(n)))
        code_of = {sid: i % 7 for i, sid in enumerate(sids)}
        rows: list[dict[str, Any]] = []

        async def all_ended() -> bool:
            # A reply holds what fits in one NATS message (about 975 kernel rows, then
            # "truncated"): 200 sessions a query.
            nonlocal rows
            rows = []
            for at in range(0, n, 200):
                rows += await query(
                    nc, "kernels", session_id=sids[at : at + 200], status=sorted(ENDED)
                )
            return len(rows) >= n

        try:
            await wait_for(all_ended, 50, f"{n} batch sessions ended")
        except AssertionError as e:
            raise AssertionError(f"{e}: {len(rows)} ended") from None
        took = time.monotonic() - start
        assert len(rows) == n
        assert {r["session_id"] for r in rows} == set(sids)
        wrong = [
            r
            for r in rows
            if r["status"] != "TERMINATED" or r["exit_code"] != code_of[r["session_id"]]
        ]
        assert not wrong, wrong[:5]
        for r in rows:
            expected = (
                "succeeded"
                if code_of[r["session_id"]] == 0
                else f"exited: code {code_of[r['session_id']]}"
            )
            assert r["status_info"] == expected, r
        sessions = []
        for at in range(0, n, 200):
            sessions += await query(nc, "sessions", session_id=sids[at : at + 200])
        assert len(sessions) == n and {s["status"] for s in sessions} == {"TERMINATED"}
        # Spread over the agents, everything freed.
        assert len({r["agent_id"] for r in rows}) == 50
        assert all(s.reserved_cpu == 0 for s in m.fleet.agents.values())
        print(f"{n} batch sessions enqueued and ended in {took:.1f}s ({n / took:.0f}/s)")


async def test_an_exit_quicker_than_the_create_reply_is_recorded_with_its_code(
    nc: Client, store: EventStore
) -> None:
    """The agent's KernelExited can reach the manager while it still has the kernel CREATING
    (the command ended before the create-kernel reply was recorded): it is kept and recorded
    right after KernelCreated, not left for agent sync (off here: no reconcile round runs)."""
    async with (
        agents(nc, store, ["a1"]) as running_,
        manager(nc, reconcile_interval_s=3600) as m,
    ):
        agent = running_["a1"]
        create_kernel = agent.handlers[rpc.CREATE_KERNEL]

        async def slow_reply(request: Any) -> Any:
            reply = await create_kernel(request)
            # The process ended at once; the reply waits until the manager has the exit.
            await wait_for(
                lambda: request.kernel_id in m.reactors._early_exits,
                5,
                "the exit seen while the kernel is CREATING",
            )
            return reply

        agent.handlers[rpc.CREATE_KERNEL] = slow_reply
        created = await create(nc, session_type="batch", command=["exit", "0"])
        done = await until(nc, created["session_id"], ended, what="ended", within=10)
        assert (done["status"], done["status_info"]) == ("TERMINATED", "succeeded"), done
        assert done["kernels"][0]["exit_code"] == 0
        assert not m.reactors._early_exits
