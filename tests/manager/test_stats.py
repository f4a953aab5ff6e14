"""The manager's counters and timers on ``hoist.admin.manager.stats`` (services.manager.stats),
against a real nats-server: what they count moves with what the manager does, a restart folds
the log again and times it, and only an admin is answered."""

from __future__ import annotations

from typing import Any

from domain.subjects import MANAGER_STATS, USER_ADD
from eventstore.store import EventStore
from tests.agent.agent_harness import wait_for
from tests.manager.harness import agents, create, manager, request, until
from transport.client import Client


async def _stats(nc: Client) -> dict[str, Any]:
    reply = await request(nc, MANAGER_STATS, {})
    assert "error" not in reply, reply
    return reply  # type: ignore[no-any-return]


async def test_stats_count_sessions_passes_heartbeats_and_the_fold(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1", "a2"]), manager(nc, reconcile_interval_s=0.2):
        before = await _stats(nc)
        assert before["live_sessions"] == 0
        sessions = [(await create(nc))["session_id"] for _ in range(3)]
        for sid in sessions:
            await until(nc, sid, lambda s: s["status"] == "RUNNING")

        async def beaten() -> bool:  # the agents beat every 0.2 s
            return (await _stats(nc))["heartbeats"]["count"] >= before["heartbeats"]["count"] + 4

        await wait_for(beaten, 10, "heartbeats counted")  # and >= 2 reconciliations by then
        after = await _stats(nc)
        assert after["live_sessions"] == 3
        assert after["agents"] == after["live_agents"] == 2
        assert after["scheduling_passes"]["count"] > before["scheduling_passes"]["count"]
        passes = after["scheduling_passes"]
        assert 0 < passes["mean_ms"] <= passes["max_ms"]
        assert after["heartbeats"]["total_s"] > 0
        assert after["reconciliation_passes"]["count"] >= 1
        assert after["log_seq"] > before["log_seq"]
        assert bad_request(await request(nc, MANAGER_STATS, {"reset": True}))
    async with agents(nc, store, ["a1", "a2"]), manager(nc):  # a restart folds the whole log
        again = await _stats(nc)
        assert again["live_sessions"] == 3
        assert again["startup_fold"]["events"] >= after["log_seq"]
        assert again["startup_fold"]["seconds"] > 0
        assert again["scheduling_passes"]["count"] <= after["scheduling_passes"]["count"]


def bad_request(reply: dict[str, Any]) -> bool:
    return bool(reply.get("error", {}).get("code") == "invalid-request")


async def test_stats_answer_admin_users_only(nc: Client, store: EventStore) -> None:
    async with manager(nc):
        await request(nc, USER_ADD, {"name": "root", "admin": True})
        await request(nc, USER_ADD, {"name": "alice"})
        root = await request(nc, "hoist.admin.root.manager.stats", {}, user="root")
        assert root["live_sessions"] == 0, root
        alice = await request(nc, "hoist.admin.alice.manager.stats", {}, user="alice")
        assert alice["error"]["code"] == "forbidden", alice
        assert "live_sessions" not in alice
