"""The scheduling policy: predicates, strategies, image locality, capacity, FIFO, DRF."""

from __future__ import annotations

import math
import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import InvalidField
from domain.events import Capacity, Resources
from domain.quota import Quota, Usage, quota_failures
from domain.scheduling import (
    AgentView,
    Limits,
    PendingSession,
    PlanStats,
    Policy,
    Scheduled,
    Unschedulable,
    locality_bonus,
    never_holds,
    plan,
)

GiB = 2**30
MiB = 2**20
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def agent(
    agent_id: str,
    cpu: float = 8,
    mem: int = 32 * GiB,
    *,
    group: str = "default",
    reserved_cpu: float = 0,
    reserved_mem: int = 0,
    images: dict[str, int] | None = None,
    live: bool = True,
    slots: dict[str, float] | None = None,
    reserved_slots: dict[str, float] | None = None,
) -> AgentView:
    return AgentView(
        agent_id=agent_id,
        resource_group=group,
        capacity=Capacity(cpu=cpu, mem=mem, disk=100 * GiB, slots=slots or {}),
        reserved_cpu=reserved_cpu,
        reserved_mem=reserved_mem,
        images=images or {},
        live=live,
        reserved_slots=reserved_slots or {},
    )


def session(
    session_id: str,
    at: int = 0,
    cpu: float = 1,
    mem: int = 4 * GiB,
    *,
    n: int = 1,
    owner: str = "alice",
    image: str = "img",
    group: str = "default",
    slots: dict[str, float] | None = None,
    mode: str = "multi-node",
) -> PendingSession:
    return PendingSession(
        session_id=session_id,
        owner=owner,
        image=image,
        resources=Resources(cpu=cpu, mem=mem, slots=slots or {}),
        cluster_size=n,
        resource_group=group,
        kernel_ids=[f"{session_id}-k{i}" for i in range(n)],
        enqueued_at=T0 + timedelta(milliseconds=at),
        cluster_mode=mode,  # type: ignore[arg-type]
    )


def run(
    pending: list[PendingSession],
    agents: list[AgentView],
    owners: dict[str, int] | None = None,
    limits: Limits | None = None,
    image_sizes: dict[str, int] | None = None,
    **policy: object,
) -> dict[str, Scheduled | Unschedulable]:
    out = plan(
        pending, agents, owners or {}, limits or Limits(), Policy(**policy), image_sizes or {}
    )
    assert [d.session_id for d in out] == [
        s.session_id for s in sorted(pending, key=lambda s: (s.enqueued_at, s.session_id))
    ]
    return {d.session_id: d for d in out}


def agents_of(decision: Scheduled | Unschedulable) -> list[str]:
    assert isinstance(decision, Scheduled), decision
    return list(decision.placements.values())


def info(decision: Scheduled | Unschedulable) -> str:
    assert isinstance(decision, Unschedulable), decision
    return decision.status_info


# --- predicates -------------------------------------------------------------------------------


def test_owner_quota_counts_usage_and_sessions_placed_earlier_in_the_plan() -> None:
    pending = [session("s1", 1, cpu=2), session("s2", 2, cpu=2), session("s3", 3, cpu=1)]
    used = {"alice": Usage(cpu=1.0, mem=4 * GiB, sessions=1)}
    out = plan(
        pending, [agent("a1", cpu=16, mem=64 * GiB)], {}, Limits(), Policy(),
        quotas={"alice": Quota(max_cpu=4)}, usage=used,
    )  # fmt: skip
    got = {d.session_id: d for d in out}
    assert isinstance(got["s1"], Scheduled)
    assert info(got["s2"]) == "predicate-checks-failed: user cpu quota (3.0 of 4.0 used, asks 2.0)"
    assert isinstance(got["s3"], Scheduled)  # a smaller one still fits: 4.0 of 4.0
    assert used["alice"] == Usage(cpu=1.0, mem=4 * GiB, sessions=1)  # not changed


def test_every_quota_limit_is_named_with_its_numbers() -> None:
    q = Quota(max_cpu=8, max_mem=8 * GiB, max_slots={"gpu": 1}, max_sessions=2,
              max_kernels_per_session=2)  # fmt: skip
    used = Usage(cpu=1.0, mem=6 * GiB, slots={"gpu": 0.5}, sessions=2)
    s = session("s1", cpu=1, mem=GiB, n=3, slots={"gpu": 1})
    (d,) = plan([s], [agent("a1", slots={"gpu": 4})], {}, Limits(), Policy(),
                quotas={"alice": q}, usage={"alice": used})  # fmt: skip
    assert info(d) == (
        "predicate-checks-failed: user sessions quota (2 of 2 used, asks 1);"
        " user kernels quota (3 kernels asked, limit 2 per session);"
        " user mem quota (6 GiB of 8 GiB used, asks 3 GiB);"
        " user gpu quota (0.5 of 1 used, asks 3)"
    )
    others = plan([session("s2", owner="bob")], [agent("a1")], {}, Limits(), Policy(),
                  quotas={"alice": q}, usage={"alice": used})  # fmt: skip
    assert isinstance(others[0], Scheduled)  # a quota is per owner


def test_limits_and_quotas_are_named_together() -> None:
    (d,) = plan([session("s1", cpu=4)], [agent("a1")], {"alice": 1},
                Limits(max_sessions_per_owner=1), Policy(),
                quotas={"alice": Quota(max_cpu=2)})  # fmt: skip
    assert info(d) == (
        "predicate-checks-failed: max_sessions_per_owner (1 running, limit 1);"
        " user cpu quota (0.0 of 2.0 used, asks 4.0)"
    )


def test_owner_limit_counts_running_sessions_and_those_scheduled_in_this_plan() -> None:
    pending = [session(f"s{i}", at=i, owner="alice") for i in range(4)]
    pending.append(session("bob1", at=9, owner="bob"))
    got = run(
        pending,
        [agent("a1", cpu=64, mem=256 * GiB)],
        owners={"alice": 1},
        limits=Limits(max_sessions_per_owner=3),
    )
    assert isinstance(got["s0"], Scheduled) and isinstance(got["s1"], Scheduled)
    assert info(got["s2"]) == (
        "predicate-checks-failed: max_sessions_per_owner (3 running, limit 3)"
    )
    assert info(got["s3"]).startswith("predicate-checks-failed: max_sessions_per_owner")
    assert isinstance(got["bob1"], Scheduled)


def test_per_session_limits_count_the_whole_cluster_and_name_every_failure() -> None:
    limits = Limits(max_cpu_per_session=4, max_mem_per_session=8 * GiB, max_cluster_size=2)
    got = run(
        [
            session("ok", cpu=2, mem=4 * GiB, n=2),
            session("cpu", at=1, cpu=3, mem=1 * GiB, n=2),
            session("mem", at=2, cpu=1, mem=5 * GiB, n=2),
            session("size", at=3, cpu=1, mem=1 * GiB, n=3),
            session("all", at=4, cpu=4, mem=8 * GiB, n=3),
        ],
        [agent("a1", cpu=64, mem=256 * GiB)],
        limits=limits,
    )
    assert isinstance(got["ok"], Scheduled)
    assert info(got["cpu"]) == "predicate-checks-failed: max_cpu_per_session (6 cpu asked, limit 4)"
    assert info(got["mem"]) == (
        "predicate-checks-failed: max_mem_per_session (10 GiB asked, limit 8 GiB)"
    )
    assert info(got["size"]) == (
        "predicate-checks-failed: max_cluster_size (3 kernels asked, limit 2)"
    )
    assert info(got["all"]).count("max_") == 3


def test_a_session_failing_predicates_takes_no_capacity() -> None:
    got = run(
        [session("big", cpu=8, mem=8 * GiB), session("next", at=1, cpu=4, mem=4 * GiB)],
        [agent("a1", cpu=4, mem=4 * GiB)],
        limits=Limits(max_cpu_per_session=4),
    )
    assert info(got["big"]).startswith("predicate-checks-failed")
    assert agents_of(got["next"]) == ["a1"]


# --- strategies -------------------------------------------------------------------------------


def test_dispersed_spreads_and_concentrated_packs() -> None:
    fleet = [agent("a1"), agent("a2"), agent("a3")]
    pending = [session(f"s{i}", at=i) for i in range(3)]
    dispersed = run(pending, fleet, strategy="dispersed")
    assert sorted(a for d in dispersed.values() for a in agents_of(d)) == ["a1", "a2", "a3"]
    concentrated = run(pending, fleet, strategy="concentrated")
    assert {a for d in concentrated.values() for a in agents_of(d)} == {"a1"}


def test_concentrated_picks_the_fullest_agent_that_fits_and_dispersed_the_emptiest() -> None:
    fleet = [
        agent("empty"),
        agent("half", reserved_cpu=4, reserved_mem=16 * GiB),
        agent("full", reserved_cpu=7.5, reserved_mem=31 * GiB),  # too full for 1 cpu, 4 GiB
    ]
    assert agents_of(run([session("s")], fleet, strategy="concentrated")["s"]) == ["half"]
    assert agents_of(run([session("s")], fleet, strategy="dispersed")["s"]) == ["empty"]


def test_ties_go_to_the_smallest_agent_id_whatever_the_input_order() -> None:
    fleet = [agent("c"), agent("a"), agent("b")]
    for strategy in ("dispersed", "concentrated"):
        got = run([session("s")], fleet, strategy=strategy)
        assert agents_of(got["s"]) == ["a"]


# --- image locality ---------------------------------------------------------------------------


def test_locality_bonus_grows_with_size_and_spread_and_ignores_small_images() -> None:
    assert locality_bonus(5 * MiB, 10, 10, 0.25) == 0  # cheap to pull: no preference
    assert locality_bonus(1 * GiB, 1, 100, 0.25) == 0  # on 1 % of agents: no pile-up
    assert 0 < locality_bonus(200 * MiB, 5, 10, 0.25) < locality_bonus(400 * MiB, 5, 10, 0.25)
    assert locality_bonus(400 * MiB, 2, 10, 0.25) < locality_bonus(400 * MiB, 8, 10, 0.25)
    assert locality_bonus(5 * GiB, 2, 10, 0.25) == 0.25  # capped at the weight
    assert locality_bonus(5 * GiB, 2, 10, 0.0) == 0


def test_big_image_holders_go_first_then_sessions_spread() -> None:
    holders = {"a03", "a07"}
    fleet = [
        agent(f"a{i:02}", images={"big": 5 * GiB} if f"a{i:02}" in holders else None)
        for i in range(10)
    ]
    pending = [session(f"s{i:02}", at=i, image="big") for i in range(20)]
    got = run(pending, fleet, strategy="dispersed")
    first = [agents_of(got[f"s{i:02}"])[0] for i in range(20)]
    # Each session adds 0.125 load; the 0.25 bonus keeps the holders ahead for two each.
    assert set(first[:4]) == holders
    assert set(first[4:]) - holders  # then the others get sessions too
    assert set(first) == {f"a{i:02}" for i in range(10)}
    load = Counter(first)
    others = [load[a] for a in load if a not in holders]
    assert max(others) - min(others) <= 1  # the non-holders share evenly
    # The holders stay ahead by the bonus (two sessions' load), plus one for tie order.
    assert all(min(others) + 2 <= load[h] <= max(others) + 2 for h in holders)


def test_small_image_or_locality_off_gives_no_preference() -> None:
    fleet = [agent("a1"), agent("a2", images={"tiny": 5 * MiB, "big": 5 * GiB})]
    assert agents_of(run([session("s", image="tiny")], fleet)["s"]) == ["a1"]
    assert agents_of(run([session("s", image="big")], fleet)["s"]) == ["a2"]
    assert agents_of(run([session("s", image="big")], fleet, image_locality=False)["s"]) == ["a1"]


def test_known_image_size_is_used_when_given() -> None:
    # The holder reports nothing useful (0 bytes); the registry says 5 GiB.
    fleet = [agent("a1"), agent("a2", images={"big": 0})]
    assert agents_of(run([session("s", image="big")], fleet)["s"]) == ["a1"]
    sized = run([session("s", image="big")], fleet, image_sizes={"big": 5 * GiB})
    assert agents_of(sized["s"]) == ["a2"]


def test_a_much_busier_holder_loses_to_an_idle_agent() -> None:
    fleet = [
        agent("a1"),
        agent("a2", reserved_cpu=4, reserved_mem=16 * GiB, images={"big": 5 * GiB}),
    ]
    assert agents_of(run([session("s", image="big")], fleet)["s"]) == ["a1"]


def test_concentrated_fills_the_holders_then_spills() -> None:
    fleet = [agent("a1", cpu=2), agent("a2", cpu=2, images={"big": 5 * GiB}), agent("a3", cpu=2)]
    pending = [session(f"s{i}", at=i, mem=1 * GiB, image="big") for i in range(4)]
    got = run(pending, fleet, strategy="concentrated")
    assert [agents_of(got[f"s{i}"])[0] for i in range(4)] == ["a2", "a2", "a1", "a1"]


# --- multi-kernel and all-or-nothing ----------------------------------------------------------


def test_multi_kernel_sessions_span_agents() -> None:
    fleet = [agent("a1", cpu=4), agent("a2", cpu=4)]
    got = run([session("s", cpu=2, mem=1 * GiB, n=4)], fleet, strategy="concentrated")
    assert Counter(agents_of(got["s"])) == {"a1": 2, "a2": 2}
    assert set(got["s"].placements) == {"s-k0", "s-k1", "s-k2", "s-k3"}  # type: ignore[union-attr]


def test_a_session_is_placed_whole_or_not_at_all() -> None:
    fleet = [agent("a1", cpu=4), agent("a2", cpu=4, reserved_cpu=2)]
    pending = [
        session("big", cpu=2, mem=1 * GiB, n=4),  # 3 slots free: fits 3 of 4
        session("small", at=1, cpu=2, mem=1 * GiB, n=3),  # the same 3 slots
    ]
    got = run(pending, fleet)
    assert info(got["big"]) == (
        "no-available-instances: live agents in resource group 'default' have room for 3 of 4"
        " kernels of 2.0 cpu and 1 GiB each"
    )
    assert Counter(agents_of(got["small"])) == {"a1": 2, "a2": 1}


# --- capacity ---------------------------------------------------------------------------------


def test_no_room_names_what_was_needed() -> None:
    fleet = [agent("a1", cpu=2, mem=4 * GiB, group="gpu", reserved_cpu=1)]
    got = run([session("s", cpu=2, mem=4 * GiB, group="gpu")], fleet)
    assert info(got["s"]) == (
        "no-available-instances: no live agent in resource group 'gpu' has 2.0 cpu and 4 GiB free"
    )
    never = run([session("s", cpu=4, mem=4 * GiB, group="gpu")], fleet)
    assert info(never["s"]).startswith("no-available-instances: the live agents of resource")
    assert "even when idle" in info(never["s"])


def never(s: PendingSession, fleet: list[AgentView]) -> tuple[str, str] | None:
    return never_holds(s.resources, s.cluster_size, s.cluster_mode, s.resource_group, fleet)


def test_never_holds_names_the_largest_live_agent_of_the_group() -> None:
    fleet = [
        agent("a1", cpu=4, mem=8 * GiB),
        agent("a2", cpu=8, mem=4 * GiB, slots={"gpu": 1}),
        agent("big", cpu=64, mem=512 * GiB, group="other"),  # another group's: not counted
        agent("dead", cpu=64, mem=512 * GiB, live=False),
    ]
    assert never(session("s", cpu=1000), fleet) == (
        "resources.cpu",
        "asks 1000 cpu but the largest live agent of resource group 'default', a2, has 8 cpu",
    )
    assert never(session("s", cpu=1, mem=64 * GiB), fleet) == (
        "resources.mem",
        "asks 64 GiB but the largest live agent of resource group 'default', a1, has 8 GiB",
    )
    assert never(session("s", slots={"gpu": 2}), fleet) == (
        "resources.gpu",
        "asks 2 gpu but the largest live agent of resource group 'default', a2, has 1 gpu",
    )
    assert never(session("s", slots={"tpu": 1}), fleet) == (
        "resources.tpu",
        "asks 1 tpu but no live agent of resource group 'default' offers tpu",
    )
    # Each dimension fits some agent, but no agent has both at once.
    field, why = never(session("s", cpu=6, mem=6 * GiB), fleet) or ("", "")
    assert field == "resources" and "no live agent of resource group 'default' has all" in why
    # Multi-node: each kernel fits, the group holds 3 of 4 even idle; single-node: one agent.
    assert never(session("s", cpu=4, mem=1 * GiB, n=4), fleet) == (
        "cluster_size",
        "4 kernels of 4.0 cpu and 1 GiB each, but the live agents of resource group 'default'"
        " hold 3 of them even when idle",
    )
    assert never(session("s", cpu=3, mem=1 * GiB, n=3, mode="single-node"), fleet) == (
        "resources.cpu",
        "the 3 kernels of this single-node session ask 9 cpu on one agent but the largest live"
        " agent of resource group 'default', a2, has 8 cpu",
    )
    # What the scheduler could place (now or once agents free up) is never refused.
    for fits in (session("s", cpu=8, mem=4 * GiB), session("s", cpu=2, mem=GiB, n=6)):
        assert never(fits, fleet) is None
        assert run([fits], [agent("a1", cpu=4, mem=8 * GiB, reserved_cpu=4), *fleet[1:]])
    assert never(session("s", cpu=2, mem=GiB, n=2, mode="single-node"), fleet) is None


def test_never_holds_waits_for_a_group_with_no_live_agent() -> None:
    """Agents still starting (or all lost): the session waits for them, as it always did."""
    assert never(session("s", cpu=1000), []) is None
    assert never(session("s", cpu=1000), [agent("a1", live=False)]) is None
    assert never(session("s", cpu=1000, group="gpu"), [agent("a1")]) is None


def test_200_sessions_compete_for_little_capacity_without_over_commit() -> None:
    rng = random.Random(7)
    fleet = [agent(f"a{i}", cpu=4, mem=8 * GiB, reserved_cpu=i * 0.5) for i in range(3)]
    pending = [
        session(
            f"s{i:03}",
            at=rng.randrange(50),
            cpu=rng.choice([0.5, 1, 1.5]),
            mem=rng.choice([1, 2]) * GiB,
            n=rng.choice([1, 1, 2]),
            owner=f"u{i % 7}",
        )
        for i in range(200)
    ]
    for strategy in ("dispersed", "concentrated"):
        got = run(pending, fleet, strategy=strategy)
        placed = assert_within_capacity(pending, fleet, list(got.values()))
        assert 0 < placed < 200
        rejected = [d for d in got.values() if isinstance(d, Unschedulable)]
        assert all(d.status_info.startswith("no-available-instances: ") for d in rejected)


def assert_within_capacity(
    pending: list[PendingSession], fleet: list[AgentView], out: list[Scheduled | Unschedulable]
) -> int:
    """Every session decided once; each agent's placements fit its free room. Returns kernels
    placed."""
    by_id = {s.session_id: s for s in pending}
    agents = {a.agent_id: a for a in fleet}
    assert sorted(d.session_id for d in out) == sorted(by_id)
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    slots: dict[str, Counter[str]] = {}  # agent -> slot -> amount placed
    kernels = 0
    for d in out:
        s = by_id[d.session_id]
        if isinstance(d, Unschedulable):
            assert d.status_info.split(": ")[0] in (
                "predicate-checks-failed",
                "no-available-instances",
            )
            assert len(d.status_info) > len("no-available-instances: ")
            continue
        assert sorted(d.placements) == sorted(s.kernel_ids)
        if s.cluster_mode == "single-node":
            assert len(set(d.placements.values())) == 1, d
        for agent_id in d.placements.values():
            a = agents[agent_id]
            assert a.live and a.resource_group == s.resource_group
            cpu[agent_id] += s.resources.cpu
            mem[agent_id] += s.resources.mem
            slots.setdefault(agent_id, Counter()).update(s.resources.slots)
            kernels += 1
    for agent_id in cpu:
        a = agents[agent_id]
        assert cpu[agent_id] <= a.capacity.cpu - a.reserved_cpu + 1e-6, agent_id
        assert mem[agent_id] <= a.capacity.mem - a.reserved_mem, agent_id
        for slot, placed in slots[agent_id].items():
            if placed > 0:
                offered = a.capacity.slots.get(slot, 0) - a.reserved_slots.get(slot, 0)
                assert placed <= offered + 1e-6, (agent_id, slot)
    return kernels


SLOTS = ("gpu", "tpu")
fleets = st.lists(
    st.builds(
        agent,
        st.sampled_from([f"a{i}" for i in range(12)]),
        st.integers(1, 16).map(lambda c: c / 2),
        st.integers(1, 16).map(lambda g: g * GiB),
        group=st.sampled_from(["default", "gpu"]),
        reserved_cpu=st.integers(0, 10).map(lambda c: c / 4),
        reserved_mem=st.integers(0, 8).map(lambda g: g * GiB),
        images=st.dictionaries(st.sampled_from(["i1", "i2"]), st.sampled_from([MiB, 3 * GiB])),
        live=st.booleans(),
        slots=st.dictionaries(st.sampled_from(SLOTS), st.integers(0, 8).map(lambda g: g / 2)),
        reserved_slots=st.dictionaries(st.just("gpu"), st.integers(0, 4).map(lambda g: g / 2)),
    ),
    max_size=10,
    unique_by=lambda a: a.agent_id,
)
requests = st.lists(
    st.builds(
        session,
        st.uuids().map(str),
        st.integers(0, 20),
        st.integers(1, 12).map(lambda c: c / 4),
        st.integers(1, 8).map(lambda g: g * GiB // 2),
        n=st.integers(1, 4),
        owner=st.sampled_from(["u1", "u2", "u3"]),
        image=st.sampled_from(["i1", "i2", "i3"]),
        group=st.sampled_from(["default", "gpu", "none"]),
        slots=st.sampled_from(
            [
                None,
                None,
                {"gpu": 0},
                {"gpu": 0.5},
                {"gpu": 1},
                {"gpu": 2},
                {"tpu": 1},
                {"gpu": 1, "tpu": 0.5},
            ]
        ),
        mode=st.sampled_from(["multi-node", "single-node"]),
    ),
    max_size=40,
    unique_by=lambda s: s.session_id,
)
policies = st.builds(
    Policy,
    strategy=st.sampled_from(["concentrated", "dispersed"]),
    image_locality=st.booleans(),
    fifo_strict=st.booleans(),
    order=st.sampled_from(["fifo", "drf"]),
)


@settings(max_examples=300, deadline=None)
@given(fleets, requests, policies, st.sampled_from([None, 2]))
def test_property_never_over_commits_and_decides_every_session(
    fleet: list[AgentView], pending: list[PendingSession], policy: Policy, per_owner: int | None
) -> None:
    limits = Limits(max_sessions_per_owner=per_owner)
    out = plan(pending, fleet, {"u1": 1}, limits, policy)
    assert_within_capacity(pending, fleet, out)
    assert plan(list(reversed(pending)), list(reversed(fleet)), {"u1": 1}, limits, policy) == out
    scheduled_per_owner = Counter(
        s.owner
        for s in pending
        for d in out
        if d.session_id == s.session_id and isinstance(d, Scheduled)
    )
    if per_owner is not None:
        assert scheduled_per_owner["u1"] <= per_owner - 1
        assert all(v <= per_owner for v in scheduled_per_owner.values())


quotas = st.dictionaries(
    st.sampled_from(["u1", "u2", "u3"]),
    st.builds(
        Quota,
        max_cpu=st.none() | st.integers(0, 12).map(lambda c: c / 2),
        max_mem=st.none() | st.integers(0, 12).map(lambda g: g * GiB),
        max_slots=st.dictionaries(st.sampled_from(SLOTS), st.integers(0, 6).map(lambda g: g / 2)),
        max_sessions=st.none() | st.integers(0, 4),
        max_kernels_per_session=st.none() | st.integers(1, 4),
    ),
)
usages = st.dictionaries(
    st.sampled_from(["u1", "u2", "u3"]),
    st.builds(
        Usage,
        st.integers(0, 8).map(lambda c: c / 2),
        st.integers(0, 8).map(lambda g: g * GiB),
        st.dictionaries(st.just("gpu"), st.integers(1, 4).map(lambda g: g / 2)),
        st.integers(0, 3),
    ),
)


@settings(max_examples=300, deadline=None)
@given(fleets, requests, policies, quotas, usages)
def test_property_no_owner_goes_over_its_quota(
    fleet: list[AgentView],
    pending: list[PendingSession],
    policy: Policy,
    quota: dict[str, Quota],
    usage: dict[str, Usage],
) -> None:
    before = {o: u.copy() for o, u in usage.items()}
    out = plan(pending, fleet, {}, Limits(), policy, quotas=quota, usage=usage)
    assert usage == before  # read only
    assert_within_capacity(pending, fleet, out)
    by_id = {s.session_id: s for s in pending}
    charged = {o: u.copy() for o, u in usage.items()}
    for d in out:
        s = by_id[d.session_id]
        q = quota.get(s.owner)
        if not isinstance(d, Scheduled) or q is None:
            continue
        if s.owner not in charged:
            charged[s.owner] = Usage()
        used = charged[s.owner]
        assert not quota_failures(q, used, s.resources, s.cluster_size), (s, used, q)
        used.add(
            s.resources.cpu * s.cluster_size,
            s.resources.mem * s.cluster_size,
            {k: v * s.cluster_size for k, v in s.resources.slots.items() if v > 0},
            1,
        )
    for owner, used in charged.items():  # what started stays within the quota
        q = quota.get(owner)
        if q is None or owner not in {
            by_id[d.session_id].owner for d in out if isinstance(d, Scheduled)
        }:
            continue
        if q.max_cpu is not None:
            assert used.cpu <= q.max_cpu + 1e-6
        if q.max_mem is not None:
            assert used.mem <= q.max_mem
        if q.max_sessions is not None:
            assert used.sessions <= q.max_sessions
        for slot, most in q.max_slots.items():
            # A session asking none of a slot is not held back by that slot's quota, so an
            # owner already over it (usage) stays where they were.
            was = usage[owner].slots.get(slot, 0) if owner in usage else 0
            assert used.slots.get(slot, 0) <= max(most, was) + 1e-6
    # A session refused by its quota says which limit, with numbers.
    for d in out:
        s = by_id[d.session_id]
        if isinstance(d, Unschedulable) and s.owner not in quota:
            assert "user " not in d.status_info


# Roomier than test_scheduling's fleets, most holding big images: locality decides often.
roomy_fleets = st.lists(
    st.builds(
        agent,
        st.sampled_from([f"a{i}" for i in range(12)]),
        st.integers(4, 16),
        st.integers(8, 32).map(lambda g: g * GiB),
        group=st.sampled_from(["default", "default", "gpu"]),
        reserved_cpu=st.integers(0, 12).map(lambda c: c / 4),
        reserved_mem=st.integers(0, 8).map(lambda g: g * GiB),
        images=st.dictionaries(st.sampled_from(["i1", "i2"]), st.sampled_from([3 * GiB, 8 * GiB])),
        live=st.booleans() | st.just(True),
        slots=st.dictionaries(st.just("gpu"), st.integers(0, 8).map(lambda g: g / 2)),
    ),
    max_size=12,
    unique_by=lambda a: a.agent_id,
)


@settings(max_examples=200, deadline=None)
@given(
    fleets | roomy_fleets,
    requests,
    st.sampled_from(["concentrated", "dispersed"]),
    st.booleans(),
)
def test_property_each_kernel_goes_to_a_best_scoring_agent_with_room(
    fleet: list[AgentView], pending: list[PendingSession], strategy: str, locality: bool
) -> None:
    """A brute-force replay of the policy: every pick is the best score among agents with room
    at that moment, and every no-room rejection really had no room (non-strict FIFO)."""
    policy = Policy(strategy=strategy, image_locality=locality)  # type: ignore[arg-type]
    out = plan(pending, fleet, {}, Limits(), policy)
    by_id = {s.session_id: s for s in pending}
    free = {
        a.agent_id: [a.capacity.cpu - a.reserved_cpu, a.capacity.mem - a.reserved_mem]
        for a in fleet
        if a.live
    }
    free_slots = {  # may go negative (reserved above capacity): no Counter arithmetic
        a.agent_id: {k: a.capacity.slots.get(k, 0) - a.reserved_slots.get(k, 0) for k in SLOTS}
        for a in fleet
        if a.live
    }

    def take(agent_id: str, s: PendingSession, times: int) -> None:
        free[agent_id][0] -= s.resources.cpu * times
        free[agent_id][1] -= s.resources.mem * times
        for k, v in s.resources.slots.items():
            free_slots[agent_id][k] -= v * times

    def candidates(s: PendingSession, times: int = 1) -> dict[str, float]:
        group = [a for a in fleet if a.live and a.resource_group == s.resource_group]
        holders = [a for a in group if s.image in a.images]
        size = max((a.images[s.image] for a in holders), default=0)
        bonus = locality_bonus(size, len(holders), len(group), 0.25 if locality else 0)
        scores = {}
        for a in group:
            f_cpu, f_mem = free[a.agent_id]
            if (
                f_cpu + 1e-9 >= s.resources.cpu * times
                and f_mem >= s.resources.mem * times
                and all(
                    free_slots[a.agent_id][k] >= v * times
                    for k, v in s.resources.slots.items()
                    if v > 0
                )
            ):
                used = (1 - f_cpu / a.capacity.cpu + 1 - f_mem / a.capacity.mem) / 2
                score = used if strategy == "concentrated" else 1 - used
                scores[a.agent_id] = score + (bonus if a in holders else 0)
        return scores

    for d in out:
        s = by_id[d.session_id]
        single = s.cluster_mode == "single-node"
        if isinstance(d, Unschedulable):
            if d.status_info.startswith("no-available-instances"):
                if single:
                    assert not candidates(s, s.cluster_size), d
                    continue
                taken = []
                for _ in range(s.cluster_size):  # greedy fill of identical kernels is maximal
                    scores = candidates(s)
                    if not scores:
                        break
                    best = max(scores, key=scores.__getitem__)
                    take(best, s, 1)
                    taken.append(best)
                assert len(taken) < s.cluster_size, d
                for best in taken:
                    take(best, s, -1)
            continue
        if single:  # one block, scored before it is placed
            scores = candidates(s, s.cluster_size)
            chosen = next(iter(d.placements.values()))
            assert chosen in scores
            assert scores[chosen] >= max(scores.values()) - 1e-9
            take(chosen, s, s.cluster_size)
            continue
        for kernel_id in s.kernel_ids:
            scores = candidates(s)
            chosen = d.placements[kernel_id]
            assert chosen in scores
            assert scores[chosen] >= max(scores.values()) - 1e-9
            take(chosen, s, 1)


# --- resource slots ---------------------------------------------------------------------------


def test_slots_are_reserved_within_a_plan_and_counted_with_what_agents_hold() -> None:
    fleet = [
        agent("g1", slots={"gpu": 2}, reserved_slots={"gpu": 1}),
        agent("g2", slots={"gpu": 2}),
    ]
    pending = [session(f"s{i}", at=i, mem=1 * GiB, slots={"gpu": 1}) for i in range(4)]
    got = run(pending, fleet)
    assert sorted(a for i in range(3) for a in agents_of(got[f"s{i}"])) == ["g1", "g2", "g2"]
    assert info(got["s3"]) == (
        "no-available-instances: no live agent in resource group 'default' has"
        " 1.0 cpu, 1 GiB and gpu 1 free"
    )


def test_fractional_slots_add_up_exactly() -> None:
    fleet = [agent("g1", cpu=64, slots={"cuda.shares": 1.0})]
    pending = [
        session(f"s{i:02}", at=i, mem=1 * GiB, slots={"cuda.shares": 0.1}) for i in range(11)
    ]
    got = run(pending, fleet)
    assert [isinstance(got[f"s{i:02}"], Scheduled) for i in range(11)] == [True] * 10 + [False]


def test_a_session_that_does_not_fit_gives_its_slots_back() -> None:
    fleet = [
        agent("g1", slots={"gpu": 3}, reserved_slots={"gpu": 1}),
        agent("g2", slots={"gpu": 1}),
    ]
    pending = [
        session("big", mem=1 * GiB, n=4, slots={"gpu": 1}),  # 3 gpus free in the group
        session("fits", at=1, mem=1 * GiB, n=3, slots={"gpu": 1}),
    ]
    got = run(pending, fleet)
    assert info(got["big"]) == (
        "no-available-instances: live agents in resource group 'default' have room for 3 of 4"
        " kernels of 1.0 cpu, 1 GiB and gpu 1 each"
    )
    assert Counter(agents_of(got["fits"])) == {"g1": 2, "g2": 1}


def test_a_bigger_slot_request_without_room_does_not_stop_a_smaller_one() -> None:
    fleet = [agent("g1", slots={"gpu": 2}, reserved_slots={"gpu": 1})]
    pending = [
        session("two", mem=1 * GiB, slots={"gpu": 2}),
        session("one", at=1, mem=1 * GiB, slots={"gpu": 1}),
        session("again", at=2, mem=1 * GiB, slots={"gpu": 2}),
    ]
    got = run(pending, fleet)
    assert info(got["two"]).endswith("has 1.0 cpu, 1 GiB and gpu 2 free")
    assert agents_of(got["one"]) == ["g1"]
    assert info(got["again"]) == info(got["two"])


def test_a_slot_no_agent_offers_enough_of_is_named() -> None:
    fleet = [agent("g1", slots={"gpu": 2}), agent("g2", slots={"gpu": 1}), agent("c1")]
    got = run(
        [
            session("gpu4", slots={"gpu": 4}),
            session("tpu", at=1, slots={"tpu": 1}),
            session("both", at=2, slots={"gpu": 3, "tpu": 1}),
            session("three", at=3, n=4, slots={"gpu": 1}),  # 3 gpus in the whole group
            session("zero", at=4, slots={"tpu": 0}),  # asking 0 is not asking
        ],
        fleet,
        fifo_strict=True,  # none of these can ever fit, so none blocks the group
    )
    assert info(got["gpu4"]) == (
        "no-available-instances: no live agent of resource group 'default' offers"
        " gpu 4 per kernel (the most is 2)"
    )
    assert info(got["tpu"]) == (
        "no-available-instances: no live agent of resource group 'default' offers"
        " tpu 1 per kernel (none offers tpu)"
    )
    assert info(got["both"]) == (
        "no-available-instances: no live agent of resource group 'default' offers"
        " gpu 3 per kernel (the most is 2) nor tpu 1 per kernel (none offers tpu)"
    )
    assert info(got["three"]) == (
        "no-available-instances: the live agents of resource group 'default' cannot hold"
        " 4 kernel(s) of 1.0 cpu, 4 GiB and gpu 1 even when idle"
    )
    assert agents_of(got["zero"]) == ["c1"]


def test_cpu_only_sessions_still_land_on_gpu_agents() -> None:
    # g1 is the emptiest (dispersed) though it has no gpu left: cpu-only sessions go there.
    fleet = [
        agent("c1", cpu=8, reserved_cpu=4),
        agent("g1", cpu=16, slots={"gpu": 1}, reserved_slots={"gpu": 1}),
    ]
    pending = [
        session("gpu", cpu=1, slots={"gpu": 1}),  # no room: must not hide g1 from the rest
        session("cpu", at=1, cpu=1),
        session("gpu-again", at=2, cpu=2, slots={"gpu": 1}),
        session("cpu-again", at=3, cpu=2),
    ]
    for strategy in ("dispersed", "concentrated"):
        got = run(pending, fleet, strategy=strategy)
        assert info(got["gpu"]).endswith("has 1.0 cpu, 4 GiB and gpu 1 free")
        assert info(got["gpu-again"]).endswith("has 2.0 cpu, 4 GiB and gpu 1 free")
        expected = "g1" if strategy == "dispersed" else "c1"
        assert agents_of(got["cpu"]) == [expected]
        assert agents_of(got["cpu-again"]) == [expected]


def test_gpu_requests_walk_only_the_agents_offering_gpus() -> None:
    # 200 big cpu agents score best (dispersed) and stay listed for the cpu-only session, yet
    # a gpu request looks only at the 4 gpu agents.
    fleet = [agent(f"c{i:03}", cpu=64, mem=256 * GiB) for i in range(200)]
    fleet += [agent(f"g{i}", slots={"gpu": 1}) for i in range(4)]
    pending = [session(f"s{i}", at=i, slots={"gpu": 1}) for i in range(6)]
    pending.append(session("cpu", at=9))
    stats = PlanStats()
    out = plan(pending, fleet, {}, Limits(), Policy(), {}, stats)
    assert sorted(a for d in out[:4] for a in agents_of(d)) == ["g0", "g1", "g2", "g3"]
    assert all(isinstance(d, Unschedulable) for d in out[4:6])
    assert agents_of(out[6]) == ["c000"]
    assert stats.agents_examined <= 12, stats
    assert_within_capacity(pending, fleet, out)


def test_gpu_sessions_prefer_gpu_agents_holding_the_image() -> None:
    fleet = [
        agent("c1", images={"big": 5 * GiB}),
        agent("g1", slots={"gpu": 1}),
        agent("g2", slots={"gpu": 1}, images={"big": 5 * GiB}),
    ]
    got = run([session("s", image="big", slots={"gpu": 1})], fleet)
    assert agents_of(got["s"]) == ["g2"]


# --- cluster mode -----------------------------------------------------------------------------


def test_single_node_puts_every_kernel_on_one_agent() -> None:
    fleet = [agent("a1", cpu=4), agent("a2", cpu=4, reserved_cpu=1)]
    for strategy in ("dispersed", "concentrated"):
        got = run(
            [session("s", cpu=1, mem=1 * GiB, n=3, mode="single-node")], fleet, strategy=strategy
        )
        placed = agents_of(got["s"])
        assert len(placed) == 3 and len(set(placed)) == 1
        assert set(placed) == ({"a1"} if strategy == "dispersed" else {"a2"})


def test_single_node_is_placed_together_or_not_at_all() -> None:
    # 2 cpu free on each agent: 4 kernels of 1 cpu fit across them, not on one.
    fleet = [agent("a1", cpu=4, reserved_cpu=2), agent("a2", cpu=4, reserved_cpu=2)]
    pending = [
        session("single", cpu=1, mem=1 * GiB, n=4, mode="single-node"),
        session("multi", at=1, cpu=1, mem=1 * GiB, n=4),
    ]
    got = run(pending, fleet)
    assert info(got["single"]) == (
        "no-available-instances: no live agent in resource group 'default' has 4.0 cpu and"
        " 4 GiB free for the 4 kernels of this single-node session"
    )
    assert Counter(agents_of(got["multi"])) == {"a1": 2, "a2": 2}  # multi-node: unchanged


def test_single_node_blocks_count_slots_together() -> None:
    fleet = [
        agent("g1", slots={"gpu": 2}),
        agent("g2", slots={"gpu": 4}, reserved_slots={"gpu": 1}),
    ]
    got = run(
        [
            session("two", mem=1 * GiB, n=2, slots={"gpu": 1}, mode="single-node"),
            session("three", at=1, mem=1 * GiB, n=3, slots={"gpu": 1}, mode="single-node"),
        ],
        fleet,
    )
    assert set(agents_of(got["two"])) == {"g1"}
    assert set(agents_of(got["three"])) == {"g2"}


def test_single_node_too_big_for_any_agent_says_so() -> None:
    fleet = [agent("a1", cpu=4, mem=32 * GiB, slots={"gpu": 2}), agent("a2", cpu=2, mem=64 * GiB)]
    got = run(
        [
            session("cpu", cpu=4, mem=2 * GiB, n=2, mode="single-node"),
            session("gpu", at=1, cpu=1, mem=2 * GiB, n=2, slots={"gpu": 2}, mode="single-node"),
            session("mix", at=2, cpu=1.5, mem=20 * GiB, n=2, mode="single-node"),
            session("multi", at=3, cpu=4, mem=2 * GiB, n=2),
        ],
        fleet,
        fifo_strict=True,  # none of these can ever fit, so none blocks the group
    )
    assert info(got["cpu"]) == (
        "no-available-instances: single-node session needs 8.0 cpu and 4 GiB on one agent"
        " (2 kernels); the most any live agent of resource group 'default' has: 4.0 cpu"
    )
    assert info(got["gpu"]) == (
        "no-available-instances: single-node session needs 2.0 cpu, 4 GiB and gpu 4 on one"
        " agent (2 kernels); the most any live agent of resource group 'default' has: gpu 2"
    )
    # 3 cpu and 40 GiB: a1 has the cpu, a2 the mem, neither both.
    assert info(got["mix"]) == (
        "no-available-instances: single-node session needs 3.0 cpu and 40 GiB on one agent"
        " (2 kernels); no live agent of resource group 'default' has all of it at once"
    )
    assert info(got["multi"]).endswith(
        "cannot hold 2 kernel(s) of 4.0 cpu and 2 GiB even when idle"
    )


def test_one_kernel_sessions_are_the_same_in_either_mode() -> None:
    fleet = [agent("a1", cpu=2), agent("a2", cpu=4, reserved_cpu=1)]
    for cpu in (1, 3, 8):
        single = run([session("s", cpu=cpu, mode="single-node")], fleet)["s"]
        multi = run([session("s", cpu=cpu)], fleet)["s"]
        assert single == multi


def test_a_failed_single_node_block_does_not_stop_smaller_kernels() -> None:
    fleet = [agent("a1", cpu=2), agent("a2", cpu=2)]
    pending = [
        session("single", cpu=1.5, mem=1 * GiB, n=2, mode="single-node"),
        session("multi", at=1, cpu=1.5, mem=1 * GiB, n=2),
        session("one", at=2, cpu=0.5, mem=1 * GiB),
    ]
    got = run(pending, fleet)
    assert info(got["single"]).startswith("no-available-instances: single-node session needs 3.0")
    assert Counter(agents_of(got["multi"])) == {"a1": 1, "a2": 1}
    assert agents_of(got["one"]) == ["a1"]


def test_strict_fifo_holds_the_group_behind_a_single_node_session_that_could_fit() -> None:
    fleet = [agent("a1", cpu=4, reserved_cpu=2), agent("a2", cpu=4, reserved_cpu=2)]
    pending = [
        session("single", cpu=1, mem=1 * GiB, n=3, mode="single-node"),
        session("small", at=1, cpu=1, mem=1 * GiB),
    ]
    got = run(pending, fleet, fifo_strict=True)
    assert "single-node session" in info(got["single"])
    assert info(got["small"]).startswith("no-available-instances: queued behind session 'single'")


# --- FIFO -------------------------------------------------------------------------------------


def fifo_case() -> tuple[list[PendingSession], list[AgentView]]:
    pending = [
        session("first", at=0, cpu=3),
        session("blocked", at=1, cpu=3),
        session("small", at=2, cpu=1),
        session("huge", at=-1, cpu=100),  # never fits: must not block anyone
        session("other-group", at=3, cpu=1, group="gpu"),
    ]
    return pending, [agent("a1", cpu=4), agent("g1", cpu=4, group="gpu")]


def test_non_strict_fifo_lets_smaller_sessions_go_ahead() -> None:
    got = run(*fifo_case(), fifo_strict=False)
    assert agents_of(got["first"]) == ["a1"]
    assert info(got["blocked"]).startswith("no-available-instances: no live agent")
    assert agents_of(got["small"]) == ["a1"]
    assert agents_of(got["other-group"]) == ["g1"]


def test_strict_fifo_blocks_its_resource_group_behind_the_head() -> None:
    got = run(*fifo_case(), fifo_strict=True)
    assert "even when idle" in info(got["huge"])
    assert agents_of(got["first"]) == ["a1"]
    assert info(got["blocked"]).startswith("no-available-instances: no live agent")
    assert info(got["small"]) == (
        "no-available-instances: queued behind session 'blocked'"
        " (strict FIFO in resource group 'default')"
    )
    assert agents_of(got["other-group"]) == ["g1"]


def test_strict_fifo_still_reports_predicate_failures_first() -> None:
    pending, fleet = fifo_case()
    got = run(pending, fleet, limits=Limits(max_cpu_per_session=2), fifo_strict=True)
    assert info(got["first"]).startswith("predicate-checks-failed")
    assert agents_of(got["small"]) == ["a1"]  # predicate failures never block the queue


# --- DRF ---------------------------------------------------------------------------------------


def drf_plan(
    pending: list[PendingSession],
    fleet: list[AgentView],
    usage: dict[str, Usage] | None = None,
    **policy: object,
) -> dict[str, Scheduled | Unschedulable]:
    out = plan(pending, fleet, {}, Limits(), Policy(order="drf", **policy), usage=usage or {})
    assert_within_capacity(pending, fleet, out)
    return {d.session_id: d for d in out}


def test_drf_a_thousand_pending_sessions_do_not_starve_another_owners_one() -> None:
    pending = [session(f"alice{i:04}", at=i, owner="alice") for i in range(1000)]
    pending.append(session("bob", at=1000, owner="bob"))
    # A full agent (alice's kernels hold it): nobody fits, nothing is placed.
    full = [agent("a1", cpu=8, mem=32 * GiB, reserved_cpu=8, reserved_mem=32 * GiB)]
    alice_runs = {"alice": Usage(cpu=8.0, mem=32 * GiB, sessions=8)}
    got = drf_plan(pending, full, alice_runs)
    assert not any(isinstance(d, Scheduled) for d in got.values())
    # One of alice's sessions ends: the first pass with room places bob's, not alice's next.
    one_free = [agent("a1", cpu=8, mem=32 * GiB, reserved_cpu=7, reserved_mem=28 * GiB)]
    alice_runs = {"alice": Usage(cpu=7.0, mem=28 * GiB, sessions=7)}
    got = drf_plan(pending, one_free, alice_runs)
    assert agents_of(got["bob"]) == ["a1"]
    assert [d.session_id for d in got.values() if isinstance(d, Scheduled)] == ["bob"]
    fifo = {
        d.session_id: d for d in plan(pending, one_free, {}, Limits(), Policy(), usage=alice_runs)
    }
    assert agents_of(fifo["alice0000"]) == ["a1"] and info(fifo["bob"])  # FIFO starves bob
    # On an idle fleet with room for a few, bob's one goes second, after alice's oldest.
    out = plan(pending, [agent("a1", cpu=3)], {}, Limits(), Policy(order="drf"))
    assert [d.session_id for d in out[:3]] == ["alice0000", "bob", "alice0001"]
    assert [d.session_id for d in out if isinstance(d, Scheduled)] == [
        "alice0000", "bob", "alice0001"
    ]  # fmt: skip


def test_drf_counts_usage_slots_and_this_plans_placements_ties_by_enqueue_order() -> None:
    fleet = [agent("a1", cpu=16, mem=64 * GiB, slots={"gpu": 4})]
    pending = [
        session("g1", at=0, cpu=1, mem=GiB, owner="gpu-user", slots={"gpu": 1}),
        session("g2", at=1, cpu=1, mem=GiB, owner="gpu-user", slots={"gpu": 1}),
        session("c1", at=2, cpu=2, mem=GiB, owner="cpu-user"),
        session("c2", at=3, cpu=2, mem=GiB, owner="cpu-user"),
        session("c3", at=4, cpu=2, mem=GiB, owner="cpu-user"),
        session("m1", at=5, cpu=1, mem=GiB, owner="busy"),
    ]
    # busy already holds 12 GiB of 64 (0.1875); a gpu-user session weighs 1 gpu of 4 (0.25),
    # a cpu-user one 2 cpu of 16 (0.125). Equal shares go by enqueue order (g2 before c3).
    out = plan(
        pending, fleet, {}, Limits(), Policy(order="drf"),
        usage={"busy": Usage(mem=12 * GiB, sessions=1)},
    )  # fmt: skip
    assert [d.session_id for d in out] == ["g1", "c1", "c2", "m1", "g2", "c3"]
    idle = plan(pending, fleet, {}, Limits(), Policy(order="drf"))
    assert [d.session_id for d in idle] == ["g1", "c1", "m1", "c2", "g2", "c3"]
    assert all(isinstance(d, Scheduled) for d in out)


def test_drf_with_strict_fifo_holds_the_group_behind_the_smallest_share() -> None:
    fleet = [agent("a1", cpu=4, reserved_cpu=2), agent("g1", cpu=4, group="gpu")]
    pending = [
        session("a-small", at=0, cpu=1, owner="a"),
        session("a-more", at=1, cpu=1, owner="a"),
        session("b-big", at=2, cpu=3, owner="b"),
        session("c-other-group", at=3, cpu=1, owner="c", group="gpu"),
    ]
    # a holds 2 cpu of 8 now: b (0) goes first though enqueued later, its 3 cpu do not fit
    # next to a's 2 (they would on the idle agent) and hold the group, not another group.
    got = drf_plan(pending, fleet, {"a": Usage(cpu=2.0, sessions=1)}, fifo_strict=True)
    assert info(got["b-big"]).startswith("no-available-instances: no live agent")
    assert info(got["a-small"]) == (
        "no-available-instances: queued behind session 'b-big'"
        " (strict FIFO in resource group 'default')"
    )
    assert agents_of(got["c-other-group"]) == ["g1"]
    loose = drf_plan(pending, fleet, {"a": Usage(cpu=2.0, sessions=1)})
    assert agents_of(loose["a-small"]) == ["a1"] and agents_of(loose["a-more"]) == ["a1"]


def dominant_share(held: dict[str, float], total: dict[str, float]) -> float:
    return max((held.get(r, 0) / t for r, t in total.items() if t > 0), default=0.0)


def session_ask(s: PendingSession) -> dict[str, float]:
    n = s.cluster_size
    ask = {"cpu": s.resources.cpu * n, "mem": float(s.resources.mem * n)}
    ask.update((k, v * n) for k, v in s.resources.slots.items() if v > 0)
    return ask


@settings(max_examples=300, deadline=None)
@given(fleets, requests, policies, usages)
def test_property_drf_decides_the_smallest_dominant_share_first(
    fleet: list[AgentView], pending: list[PendingSession], policy: Policy, usage: dict[str, Usage]
) -> None:
    """A brute-force replay: each decided session is the oldest of the owner with the smallest
    dominant share at that moment (usage + what the plan placed so far), ties by enqueue order;
    nothing over-commits and every session is decided once."""
    policy = msgspec.structs.replace(policy, order="drf")
    out = plan(pending, fleet, {}, Limits(), policy, usage=usage)
    assert_within_capacity(pending, fleet, out)
    assert plan(list(reversed(pending)), list(reversed(fleet)), {}, Limits(), policy,
                usage=usage) == out  # fmt: skip
    total: Counter[str] = Counter()
    for a in fleet:
        if a.live:
            total.update({"cpu": a.capacity.cpu, "mem": a.capacity.mem, **a.capacity.slots})
    held: dict[str, Counter[str]] = {}
    for owner, u in usage.items():
        held[owner] = Counter({"cpu": u.cpu, "mem": u.mem, **u.slots})
    left = sorted(pending, key=lambda s: (s.enqueued_at, s.session_id))
    by_id = {s.session_id: s for s in pending}
    for d in out:
        heads: dict[str, PendingSession] = {}
        for s in left:
            heads.setdefault(s.owner, s)
        want = min(
            heads.values(),
            key=lambda s: (
                dominant_share(held.get(s.owner, Counter()), total),
                s.enqueued_at,
                s.session_id,
            ),
        )
        got = by_id[d.session_id]
        assert d.session_id == want.session_id or (
            math.isclose(
                dominant_share(held.get(got.owner, Counter()), total),
                dominant_share(held.get(want.owner, Counter()), total),
                rel_tol=1e-9,
            )
        ), (d, want)
        left.remove(got)
        if isinstance(d, Scheduled):
            held.setdefault(got.owner, Counter()).update(session_ask(got))


def drf_fair_shares(
    demands: dict[str, dict[str, float]], total: dict[str, float]
) -> dict[str, float]:
    """DRF's max-min fair allocation (progressive filling, divisible demands): every owner's
    dominant share rises at the same pace until the owner's whole demand is met or a resource
    the owner uses runs out."""
    cap = {o: dominant_share(d, total) for o, d in demands.items()}
    per = {o: {r: d.get(r, 0) / t / cap[o] for r, t in total.items()} for o, d in demands.items()
           if cap[o] > 0}  # fmt: skip
    share = dict.fromkeys(demands, 0.0)
    room = dict.fromkeys(total, 1.0)
    active = set(per)
    while active:
        rate = {r: sum(per[o][r] for o in active) for r in total}
        step = min(
            [cap[o] - share[o] for o in active] + [room[r] / rate[r] for r in total if rate[r] > 0]
        )
        for o in active:
            share[o] += step
        for r in total:
            room[r] -= step * rate[r]
        full = {r for r in total if rate[r] > 0 and room[r] <= 1e-12}
        active = {
            o for o in active
            if share[o] < cap[o] - 1e-12 and not any(per[o][r] > 0 for r in full)
        }  # fmt: skip
    return share


def simulate(order: str, steps: int = 40, end_p: float = 0.05, seed: int = 3,
             fifo_strict: bool = False) -> dict[str, tuple[float, float]]:  # fmt: skip
    """Pass after pass on 8 agents of 16 cpu / 128 GiB: 'many' enqueues 1,000 small sessions
    first, then 'mid' 100 medium ones, then 'big' 10 large ones of 4 kernels; after each pass
    every running session ends with probability end_p. Returns each owner's time-averaged
    dominant share and the time-averaged DRF fair share for what they asked at each pass."""
    rng = random.Random(seed)
    caps = {f"a{i}": (16.0, 128 * GiB) for i in range(8)}
    total = {
        "cpu": sum(c for c, _ in caps.values()),
        "mem": float(sum(m for _, m in caps.values())),
    }
    pending: dict[str, PendingSession] = {}
    for owner, count, cpu, mem, n in (
        ("many", 1000, 1, 2 * GiB, 1),
        ("mid", 100, 4, 8 * GiB, 1),
        ("big", 10, 2, 24 * GiB, 4),
    ):
        for i in range(count):
            s = session(f"{owner}{i:04}", len(pending), cpu, mem, n=n, owner=owner)
            pending[s.session_id] = s
    owners = ("many", "mid", "big")
    running: dict[str, tuple[PendingSession, list[str]]] = {}
    measured = dict.fromkeys(owners, 0.0)
    fair = dict.fromkeys(owners, 0.0)
    policy = Policy(order=order, strategy="concentrated", fifo_strict=fifo_strict)  # type: ignore[arg-type]
    for _ in range(steps):
        reserved = {a: [0.0, 0] for a in caps}
        usage: dict[str, Usage] = {}
        for s, on in running.values():
            for a in on:
                reserved[a][0] += s.resources.cpu
                reserved[a][1] += s.resources.mem
            ask = session_ask(s)
            usage.setdefault(s.owner, Usage()).add(ask["cpu"], int(ask["mem"]), {}, 1)
        fleet = [
            agent(a, cpu, mem, reserved_cpu=reserved[a][0], reserved_mem=int(reserved[a][1]))
            for a, (cpu, mem) in caps.items()
        ]
        queue = list(pending.values())
        out = plan(queue, fleet, {}, Limits(), policy, usage=usage)
        assert_within_capacity(queue, fleet, out)
        for d in out:
            if isinstance(d, Scheduled):
                running[d.session_id] = (pending.pop(d.session_id), list(d.placements.values()))
        held = {o: Counter[str]() for o in owners}
        demand = {o: Counter[str]() for o in owners}
        for s, _ in running.values():
            held[s.owner].update(session_ask(s))
        for s in [*pending.values(), *(s for s, _ in running.values())]:
            demand[s.owner].update(session_ask(s))
        fair_now = drf_fair_shares({o: dict(d) for o, d in demand.items()}, total)
        for o in owners:
            measured[o] += dominant_share(held[o], total) / steps
            fair[o] += fair_now[o] / steps
        for sid in sorted(running):
            if rng.random() < end_p:
                del running[sid]
    return {o: (measured[o], fair[o]) for o in owners}


def off_fair(shares: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each owner's distance from the fair share, as a fraction of it."""
    return {o: abs(got - fair) / fair for o, (got, fair) in shares.items()}


@pytest.mark.parametrize("fifo_strict", [False, True])
def test_drf_shares_stay_within_10_percent_of_the_fair_share_and_fifo_does_not(
    fifo_strict: bool,
) -> None:
    drf = simulate("drf", fifo_strict=fifo_strict)
    assert all(fair > 0.05 for _, fair in drf.values()), drf  # every owner is contending
    assert max(off_fair(drf).values()) <= 0.10, drf
    fifo = simulate("fifo", fifo_strict=fifo_strict)
    assert max(off_fair(fifo).values()) > 0.10, fifo  # the test can fail
    assert fifo["mid"][0] < 0.5 * fifo["mid"][1] and fifo["big"][0] < 0.5 * fifo["big"][1]


# --- agents that do not count -----------------------------------------------------------------


def test_dead_agents_and_other_resource_groups_get_nothing() -> None:
    fleet = [
        agent("dead", cpu=64, live=False),
        agent("gpu1", cpu=64, group="gpu"),
        agent("small", cpu=2),
    ]
    got = run([session(f"s{i}", at=i) for i in range(3)], fleet)
    assert agents_of(got["s0"]) == ["small"]
    assert agents_of(got["s1"]) == ["small"]
    assert info(got["s2"]) == (
        "no-available-instances: no live agent in resource group 'default' has 1.0 cpu and"
        " 4 GiB free"
    )
    empty = run([session("s", group="tpu")], fleet)
    assert info(empty["s"]) == (
        "no-available-instances: resource group 'tpu' has no live agents (resource groups with"
        " live agents: 'default', 'gpu')"  # a misspelt group: which ones there are
    )
    alone = run([session("s", group="tpu")], [agent("dead", cpu=64, live=False)])
    assert info(alone["s"]).endswith("(resource groups with live agents: none yet)"), alone
    many = [agent(f"a{i:02}", cpu=1, group=f"g{i:02}") for i in range(12)]
    crowded = info(run([session("s", group="tpu")], many)["s"])
    assert crowded.endswith("'g07' and 4 more (hoist agents lists them))"), crowded


# --- input checks and cost --------------------------------------------------------------------


def test_bad_input_names_the_field() -> None:
    with pytest.raises(InvalidField, match="kernel_ids"):
        PendingSession(
            session_id="s",
            owner="o",
            image="i",
            resources=Resources(cpu=1, mem=1),
            cluster_size=2,
            resource_group="g",
            kernel_ids=["k", "k"],
            enqueued_at=T0,
        )
    with pytest.raises(InvalidField, match="cluster_mode"):
        session("s", mode="one-node")
    with pytest.raises(InvalidField, match="strategy"):
        Policy(strategy="random")  # type: ignore[arg-type]
    with pytest.raises(InvalidField, match="order"):
        Policy(order="lifo")  # type: ignore[arg-type]
    with pytest.raises(InvalidField, match="agents"):
        plan([], [agent("a"), agent("a")], {}, Limits(), Policy())
    with pytest.raises(InvalidField, match="pending"):
        plan([session("s"), session("s")], [], {}, Limits(), Policy())


@pytest.mark.parametrize("strategy", ["dispersed", "concentrated"])
@pytest.mark.parametrize("cpus", [[16, 32, 64], [2, 4]], ids=["roomy", "scarce"])
def test_work_grows_with_sessions_not_sessions_times_agents(strategy: str, cpus: list[int]) -> None:
    rng = random.Random(1)
    fleet = [
        agent(
            f"a{i:03}",
            cpu=rng.choice(cpus),
            mem=rng.choice([16, 128]) * GiB,
            reserved_cpu=rng.choice([0, 1]),
            images={"big": 4 * GiB} if i % 5 == 0 else None,
        )
        for i in range(100)
    ]
    pending = [
        session(
            f"s{i:04}",
            at=i,
            cpu=rng.choice([0.5, 1, 2, 4]),
            mem=rng.choice([1, 2, 8]) * GiB,
            n=rng.choice([1, 1, 1, 2]),
            owner=f"u{i % 50}",
            image=rng.choice(["big", "small"]),
        )
        for i in range(1000)
    ]
    stats = PlanStats()
    policy = Policy(strategy=strategy)  # type: ignore[arg-type]
    out = plan(pending, fleet, {}, Limits(), policy, {}, stats)
    placed = assert_within_capacity(pending, fleet, out)
    assert placed > 100
    kernels = sum(s.cluster_size for s in pending)
    # Scanning every agent for every kernel would be ~100 per kernel.
    assert stats.agents_examined < 5 * kernels, stats
