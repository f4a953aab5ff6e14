"""The kept index (domain.placement_index): kept through changes and plans, it decides as one
built afresh for the call (``plan``) does, and is left as it was."""

from __future__ import annotations

import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.placement_index import AgentIndex
from domain.quota import Quota, Usage
from domain.scheduling import (
    AgentView,
    Limits,
    PendingSession,
    PlanStats,
    Policy,
    plan,
    plan_indexed,
)
from tests.domain.test_scheduling import (
    GiB,
    agent,
    fleets,
    policies,
    quotas,
    requests,
    roomy_fleets,
    session,
    usages,
)

image_sizes = st.dictionaries(st.sampled_from(["i1", "i3"]), st.sampled_from([2**20, 5 * GiB]))


def index_state(index: AgentIndex) -> object:
    """What an index holds that a plan reads, comparable across two indexes."""
    return {
        name: (
            [k[:2] for k in g.order],
            {s: [k[:2] for k in o] for s, o in g.slot_orders.items() if o},
            {i: [k[:2] for k in o] for i, o in g.holder_orders.items() if o},
            {a: (x.free_cpu, x.free_mem, dict(x.free_slots)) for a, x in g.agents.items()},
            {i: dict(h) for i, h in g.holders.items()},
        )
        for name, g in index.groups.items()
    } | {"totals": {k: v for k, v in index.totals.items() if v}}


@settings(max_examples=400, deadline=None)
@given(
    fleets | roomy_fleets,
    requests,
    policies,
    quotas,
    usages,
    image_sizes,
    st.sampled_from([None, 2]),
)
def test_property_a_kept_index_plans_as_one_built_for_the_call(
    fleet: list[AgentView],
    pending: list[PendingSession],
    policy: Policy,
    quota: dict[str, Quota],
    usage: dict[str, Usage],
    sizes: dict[str, int],
    per_owner: int | None,
) -> None:
    limits = Limits(max_sessions_per_owner=per_owner, max_cluster_size=3)
    index = AgentIndex(policy, fleet)
    before = index_state(index)
    full = plan(pending, fleet, {"u1": 1}, limits, policy, sizes, quotas=quota, usage=usage)
    kept = plan_indexed(pending, index, {"u1": 1}, limits, sizes, quotas=quota, usage=usage)
    assert kept == full
    assert index_state(index) == before  # what the plan reserved was given back
    again = plan_indexed(pending, index, {"u1": 1}, limits, sizes, quotas=quota, usage=usage)
    assert again == full


changes = st.lists(
    st.tuples(st.integers(0, 9), st.booleans(), st.sampled_from(["default", "gpu"])), max_size=30
)


@settings(max_examples=200, deadline=None)
@given(fleets, fleets, changes, requests, policies)
def test_property_an_index_kept_through_changes_equals_one_built_afresh(
    first: list[AgentView],
    later: list[AgentView],
    steps: list[tuple[int, bool, str]],
    pending: list[PendingSession],
    policy: Policy,
) -> None:
    """Views replaced, moved to another group, dead and back, plans run in between: the kept
    index holds what one built from the final views holds, and plans the same."""
    views = {a.agent_id: a for a in first}
    index = AgentIndex(policy, first)
    pool = later or first
    for i, live, group in steps:
        if not pool:
            break
        view = msgspec.structs.replace(pool[i % len(pool)], live=live, resource_group=group)
        views[view.agent_id] = view
        index.put(view)
        plan_indexed(pending[:3], index, {}, Limits())
    fresh = AgentIndex(policy, list(views.values()))
    assert index_state(index) == index_state(fresh)
    assert plan_indexed(pending, index, {}, Limits()) == plan(
        pending, list(views.values()), {}, Limits(), policy
    )


def test_one_pending_session_visits_a_few_agents_of_a_thousand() -> None:
    rng = random.Random(7)
    fleet = [
        agent(f"a{i:04}", cpu=rng.choice([8, 16]), reserved_cpu=rng.choice([0, 2, 8]))
        for i in range(1000)
    ]
    for strategy in ("dispersed", "concentrated"):
        index = AgentIndex(Policy(strategy=strategy), fleet)  # type: ignore[arg-type]
        stats = PlanStats()
        out = plan_indexed([session("s", cpu=1)], index, {}, Limits(), stats=stats)
        assert out == plan([session("s", cpu=1)], fleet, {}, Limits(), index.policy)
        # agents without any room left the lists; the first with room is taken
        assert stats.agents_examined <= 2, (strategy, stats)
