"""The AgentReservations aggregate: reserve refuses room the agent lacks, release frees only
what the session holds, and the fold is the occupancy."""

from __future__ import annotations

import pytest

from domain import events as ev
from domain.errors import NotNow
from domain.reservation import AgentReservations, over_capacity

CAPACITY = ev.Capacity(cpu=4.0, mem=8 * 2**30, disk=2**30, slots={"gpu": 1.0})
ONE = ev.Resources(cpu=1.0, mem=2**30)


def test_reserve_until_full_then_refuse_naming_the_resource() -> None:
    r = AgentReservations.reserve(None, "a1", CAPACITY, "s1", ["k1", "k2", "k3"], ONE)
    with pytest.raises(NotNow, match=r"cpu 5.0 > 4.0"):
        AgentReservations.reserve(r, "a1", CAPACITY, "s2", ["k4", "k5"], ONE)
    assert len(r.pending_events) == 1  # the refused one recorded nothing
    gpu = ev.Resources(cpu=0.5, mem=1, slots={"gpu": 1.0})
    AgentReservations.reserve(r, "a1", CAPACITY, "s3", ["k6"], gpu)
    with pytest.raises(NotNow, match="gpu"):
        AgentReservations.reserve(r, "a1", CAPACITY, "s4", ["k7"], gpu)
    with pytest.raises(NotNow, match="already hold"):
        AgentReservations.reserve(r, "a1", CAPACITY, "s1", ["k1"], ONE)


def test_release_frees_only_the_sessions_kernels_and_the_fold_agrees() -> None:
    r = AgentReservations.reserve(None, "a1", CAPACITY, "s1", ["k1", "k2"], ONE)
    AgentReservations.reserve(r, "a1", CAPACITY, "s2", ["k3"], ONE)
    r.release("s2", ["k1", "k3"], "kernels ended")  # k1 is s1's: untouched
    r.release("s9", ["k2"], "kernels ended")  # nothing of s9's: nothing recorded
    assert set(r.held) == {"k1", "k2"}
    events = r.collect_events()
    assert [type(e).__name__ for e in events] == [
        "CapacityReserved",
        "CapacityReserved",
        "CapacityReleased",
    ]
    folded = ev.rebuild(events)
    assert isinstance(folded, AgentReservations) and folded.held == r.held
    assert over_capacity(CAPACITY, folded.held) is None
    assert over_capacity(ev.Capacity(cpu=1.0, mem=2**40, disk=1), folded.held) == "cpu 2.0 > 1.0"
