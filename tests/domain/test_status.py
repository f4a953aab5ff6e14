"""The kernel status machine: every allowed transition works, every other one is refused."""

from __future__ import annotations

import copy
import itertools

import pytest

from domain.errors import IllegalTransition
from domain.status import (
    AGENT_RESOURCE_OCCUPYING,
    TERMINAL,
    TRANSITIONS,
    USER_RESOURCE_OCCUPYING,
    KernelStatus,
    check_transition,
)
from tests.domain.histories import COMMANDS, session_at

S = KernelStatus
ALLOWED = [(old, new) for old, nexts in TRANSITIONS.items() for new in sorted(nexts)]
# Staying PENDING with a new status_info is the one self-move (a failed scheduling attempt).
ILLEGAL = [
    (old, new)
    for old, new in itertools.product(S, S)
    if new not in TRANSITIONS[old] and (old, new) != (S.PENDING, S.PENDING)
]


def test_table_covers_every_status_and_terminals_are_final() -> None:
    assert set(TRANSITIONS) == set(S)
    assert {s for s, nexts in TRANSITIONS.items() if not nexts} == TERMINAL
    # Every status is reachable from PENDING.
    seen, todo = {S.PENDING}, [S.PENDING]
    while todo:
        for nxt in TRANSITIONS[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    assert seen == set(S)


def test_occupancy_sets() -> None:
    assert S.PULLING in AGENT_RESOURCE_OCCUPYING
    assert S.PULLING not in USER_RESOURCE_OCCUPYING
    assert AGENT_RESOURCE_OCCUPYING - USER_RESOURCE_OCCUPYING == {S.PULLING}
    assert not (AGENT_RESOURCE_OCCUPYING | USER_RESOURCE_OCCUPYING) & (TERMINAL | {S.PENDING})


@pytest.mark.parametrize(("old", "new"), ALLOWED, ids=lambda s: str(s))
def test_allowed_transition(old: KernelStatus, new: KernelStatus) -> None:
    check_transition(old, new)
    session, kernel_id = session_at(old)
    session.collect_events()
    history = len(session.kernels[kernel_id].status_history)
    COMMANDS[new](session, kernel_id)
    kernel = session.kernels[kernel_id]
    assert kernel.status == new
    assert kernel.status_info
    assert len(kernel.status_history) == history + 1
    assert kernel.status_history[-1].status == new
    assert len(session.collect_events()) == 1


@pytest.mark.parametrize(("old", "new"), ILLEGAL, ids=lambda s: str(s))
def test_illegal_transition_is_refused_and_not_applied(
    old: KernelStatus, new: KernelStatus
) -> None:
    session, kernel_id = session_at(old)
    session.collect_events()
    before = copy.deepcopy(session)
    with pytest.raises(IllegalTransition) as info:
        COMMANDS[new](session, kernel_id)
    assert f"from {old} to {new}" in str(info.value)
    assert (info.value.old, info.value.new) == (old, new)
    assert session.pending_events == []
    assert session == before


def test_check_transition_names_both_statuses_and_the_way_out() -> None:
    with pytest.raises(IllegalTransition, match="from PULLING to RUNNING") as info:
        check_transition(S.PULLING, S.RUNNING, "k1")
    assert "CANCELLED, PREPARED" in str(info.value)
    assert "kernel k1" in str(info.value)
    with pytest.raises(IllegalTransition, match="TERMINATED is final"):
        check_transition(S.TERMINATED, S.RUNNING)
