"""Prepull policies: the pure plan (order, budgets) and a fleet of 100 dummy agents with differing
disks converging, then re-converging after a policy change."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from domain import events as ev
from domain.errors import InvalidField
from domain.image_ref import canonical
from domain.prepull import AgentDisk, KnownImage, Policy, PrepullPolicy, plan_agent
from domain.subjects import POLICY_LIST, POLICY_PLAN, POLICY_REMOVE, POLICY_SET
from eventstore.repository import Repository
from eventstore.store import EventStore
from tests.agent.agent_harness import wait_for
from tests.fleet.fleet_harness import admin, fleet
from tests.manager.harness import GB, MB, manager, request
from transport.client import Client

NOW = datetime(2026, 5, 1, tzinfo=UTC)
TORCH = {f"ml/torch:1.{i}": (300 + 100 * i) * MB for i in range(6)}  # 1.5 newest, largest
SIZES = {**TORCH, "ml/big:1": 2 * GB, "ml/tiny:1": 50 * MB, "ml/tiny:2": 60 * MB}


def _catalog(used: dict[str, int] | None = None) -> dict[str, KnownImage]:
    used = used or {}
    return {
        image: KnownImage(
            image,
            size,
            NOW - timedelta(days=used[image]) if image in used else None,
            NOW - timedelta(days=30),
        )
        for image, size in SIZES.items()
    }


def test_the_plan_takes_images_in_priority_order_within_the_budget() -> None:
    policies = [
        Policy("base", [], [ev.ListedImages(images=["ml/tiny:1"])], priority=0),
        Policy("torch", [], [ev.NewestTags(repository="ml/torch", count=3)], priority=10),
        Policy("big", [], [ev.LargeRecent(min_bytes=1 * GB, days=7)], priority=5),
    ]
    disk = AgentDisk("a1", "gpu", disk=3 * GB, held={"ml/torch:1.4": 700 * MB})
    plan = plan_agent(disk, policies, _catalog({"ml/big:1": 2}), NOW)
    assert plan.budget == int(3 * GB * 0.8)
    # torch first (priority 10), newest tags first; big (5) does not fit what is left, tiny does.
    assert plan.images == ["ml/torch:1.5", "ml/torch:1.4", "ml/torch:1.3", "ml/tiny:1"]
    assert plan.to_pull == ["ml/torch:1.5", "ml/torch:1.3", "ml/tiny:1"]
    assert plan.bytes <= plan.budget
    [(image, why)] = plan.skipped
    assert image == "ml/big:1" and why.startswith("over budget: needs 2147483648 bytes")
    assert plan.desired[0].why == "torch rule 1: newest 3 tags of ml/torch"


def test_kept_images_come_off_the_budget_and_unknown_sizes_are_skipped() -> None:
    policy = Policy("p", ["gpu"], [ev.ListedImages(images=["ml/big:1", "who/knows:1"])])
    kept = AgentDisk("a1", "gpu", 3 * GB, {"ml/torch:1.5": 800 * MB}, frozenset({"ml/torch:1.5"}))
    plan = plan_agent(kept, [policy], _catalog(), NOW)
    assert plan.budget == int(3 * GB * 0.8) - 800 * MB
    assert plan.images == [] and [i for i, _ in plan.skipped] == ["ml/big:1", "who/knows:1"]
    assert "size unknown" in plan.skipped[1][1]
    other_group = AgentDisk("a2", "cpu", 100 * GB, {})
    assert plan_agent(other_group, [policy], _catalog(), NOW).images == []


EMPTY = AgentDisk("a", "g", 100 * GB, {})
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def test_the_registry_gives_a_size_and_a_moved_tag_is_pulled_again() -> None:
    """An image no agent held takes the registry's size; a held tag whose digest the registry
    now says is another is pulled again, with the digest wanted."""
    catalog = {
        "r/new:1": KnownImage("r/new:1", 40 * MB, None, NOW, D1),  # size from the manifest
        "r/app:latest": KnownImage("r/app:latest", 30 * MB, None, NOW, D2),
    }
    policy = Policy("p", [], [ev.ListedImages(images=["r/new:1", "r/app:latest"])])
    held = AgentDisk("a", "g", GB, {"r/app:latest": 35 * MB}, digests={"r/app:latest": D1})
    plan = plan_agent(held, [policy], catalog, NOW)
    assert plan.images == ["r/new:1", "r/app:latest"] and plan.skipped == []
    assert plan.to_pull == ["r/new:1", "r/app:latest"] and plan.refresh == {"r/app:latest": D2}
    assert plan.bytes == 40 * MB + 35 * MB  # a held image counts as the agent holds it
    current = AgentDisk("a", "g", GB, {"r/app:latest": 35 * MB}, digests={"r/app:latest": D2})
    plan = plan_agent(current, [policy], catalog, NOW)
    assert plan.to_pull == ["r/new:1"] and plan.refresh == {}


def test_large_recent_takes_recent_large_images_most_recent_first() -> None:
    rule = ev.LargeRecent(min_bytes=501 * MB, days=10)
    used = {"ml/big:1": 8, "ml/torch:1.2": 1, "ml/torch:1.5": 20, "ml/tiny:1": 0}
    plan = plan_agent(EMPTY, [Policy("p", [], [rule])], _catalog(used), NOW)
    assert plan.images == ["ml/big:1"]  # torch 1.2 too small, 1.5 too old, tiny too small
    rule = ev.LargeRecent(min_bytes=400 * MB, days=10)
    plan = plan_agent(EMPTY, [Policy("p", [], [rule])], _catalog(used), NOW)
    assert plan.images == ["ml/torch:1.2", "ml/big:1"]


def test_a_policy_records_set_and_removed_and_refuses_bad_rules() -> None:
    policy = PrepullPolicy.set(
        None, name="torch", resource_groups=["gpu"], rules=[{"kind": "newest-tags",
        "repository": "ml/torch", "count": 2}], priority=3,
    )  # fmt: skip
    same = PrepullPolicy.set(
        policy, name="torch", resource_groups=["gpu"], rules=list(policy.rules), priority=3
    )
    assert [type(e).__name__ for e in same.collect_events()] == ["PrepullPolicySet"]
    policy.remove()
    again = PrepullPolicy.set(policy, name="torch", resource_groups=[], rules=policy.rules)
    assert [type(e).__name__ for e in again.collect_events()] == [
        "PrepullPolicyRemoved",
        "PrepullPolicySet",
    ]
    assert not again.removed and again.resource_groups == []
    with pytest.raises(InvalidField, match="rules"):
        PrepullPolicy.set(None, name="x", resource_groups=[], rules=[{"kind": "fattest"}])


def _budget_ok(agents: dict[str, Any], plans: dict[str, Any]) -> None:
    for agent_id, agent in agents.items():
        plan, disk = plans[agent_id], agent.capacity.disk
        assert plan["bytes"] <= plan["budget"] <= disk * 0.8, (agent_id, plan)


async def test_100_agents_converge_within_their_budgets_and_again_after_a_change(
    nc: Client, store: EventStore
) -> None:
    # Disks from 1 GiB to 5 GiB: budgets of 0.8 to 4 GiB hold different numbers of images.
    disks = {f"g{i:03d}": (1 + i % 5) * GB for i in range(100)}
    dummy = {"image_sizes": SIZES, "default_size": None, "preloaded": set()}
    async with (
        fleet(nc, store, {"seed": 100 * GB}, resource_group="catalog", preloaded=set(SIZES),
              image_sizes=SIZES),
        fleet(nc, store, disks, resource_group="gpu", heartbeat_s=2.0, **dummy) as agents,
        manager(nc, prepull_parallelism=25) as m,
    ):  # fmt: skip
        # The catalog agent knows every image's size; the policies are for group gpu only.
        torch = {"kind": "newest-tags", "repository": "ml/torch", "count": 3}
        dry = await admin(
            nc, POLICY_SET, {"name": "torch", "rules": [torch], "resource_groups": ["gpu"],
                             "priority": 10, "dry_run": True},
        )  # fmt: skip
        assert dry["recorded"] is False and len(dry["plans"]) == 101
        assert dry["plans"]["seed"]["desired"] == []
        assert dry["plans"]["g004"]["to_pull"] == [f"docker.io/ml/torch:1.{i}" for i in (5, 4, 3)]
        assert dry["plans"]["g000"]["to_pull"] == ["docker.io/ml/torch:1.5"]  # 1 GiB disk: one fits
        assert m.fleet.policies == {}
        assert all(not a.runtime.pull_attempts for a in agents.values())  # nothing pulled

        await admin(
            nc, POLICY_SET, {"name": "torch", "rules": [torch], "resource_groups": ["gpu"],
                             "priority": 10},
        )  # fmt: skip
        await m.prepull.wait_converged(60)
        plans = (await admin(nc, POLICY_PLAN, {}))["plans"]
        _budget_ok(agents, plans)
        for agent_id, agent in agents.items():
            held = {canonical(i) for i in agent.runtime.images}  # the dummy engine's short names
            assert held == {w["image"] for w in plans[agent_id]["desired"]}

        # The change: two newest torch tags and the tiny images, first.
        start = time.monotonic()
        tiny = {"kind": "images", "images": ["ml/tiny:2", "ml/tiny:1"]}
        await admin(
            nc, POLICY_SET, {"name": "torch", "rules": [tiny, {**torch, "count": 2}],
                             "resource_groups": ["gpu"], "priority": 10},
        )  # fmt: skip
        await m.prepull.wait_converged(60)
        converged_s = time.monotonic() - start
        print(f"\n100 dummy agents re-converged {converged_s:.2f}s after the policy change")
        plans = (await admin(nc, POLICY_PLAN, {}))["plans"]
        _budget_ok(agents, plans)
        for agent_id, agent in agents.items():
            held = agent.runtime.images  # type: ignore[attr-defined]
            assert {w["image"] for w in plans[agent_id]["desired"]} <= set(map(canonical, held))
            assert sum(i.size_bytes for i in held.values()) <= agent.capacity.disk * 0.85
            assert agent.image_gc.policy_pins == {w["image"] for w in plans[agent_id]["desired"]}
        assert plans["g000"]["to_pull"] == [] and plans["g000"]["desired"][0]["image"] == (
            "docker.io/ml/tiny:2"
        )

        # Every pull of a policy is marked preloaded, not pinned by the job mechanism.
        agent = await Repository(store).get("agent", "g004")
        assert agent.preloaded and not any(agent.preloaded.values())  # type: ignore[attr-defined]

        listed = await admin(nc, POLICY_LIST, {})
        assert [p["name"] for p in listed["policies"]] == ["torch"]
        removed = await admin(nc, POLICY_REMOVE, {"name": "torch"})
        assert all(not p["desired"] for p in removed["plans"].values())
        await wait_for(lambda: not agents["g004"].image_gc.policy_pins, 20, "pins dropped")
        gone = await request(nc, POLICY_REMOVE, {"name": "torch"})
        assert gone["error"]["code"] == "not-found"
        bad = await request(nc, POLICY_SET, {"name": "x", "rules": [{"kind": "fattest"}]})
        assert bad["error"]["code"] == "invalid-request" and "rules" in bad["error"]["message"]
