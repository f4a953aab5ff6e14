"""Session and Agent aggregates: commands, derived state, and rebuilding from stored events."""

from __future__ import annotations

import pytest

from domain import events as ev
from domain.agent import Agent
from domain.codec import decode, encode
from domain.errors import DomainError, IllegalTransition, InvalidField, UnknownKernel
from domain.liveness import AgentLiveness
from domain.session import Session
from domain.status import KernelStatus
from tests.domain.histories import (
    V1_PULLED,
    full_agent_history,
    full_session_history,
    new_agent,
    new_session,
    only_kernel,
)

S = KernelStatus


def stored(events: list[ev.Event]) -> list[ev.Event]:
    return [decode(*encode(e)) for e in events]


# --- Session -----------------------------------------------------------------------------


def test_enqueue_creates_pending_kernels() -> None:
    session = new_session(cluster_size=3)
    assert len(session.id) == 32
    assert len(session.kernels) == 3
    assert session.status == S.PENDING
    assert session.status_info == "enqueued"
    assert session.resources == ev.Resources(cpu=1.5, mem=256 * 2**20)
    assert all(k.agent_id is None for k in session.kernels.values())
    (created,) = session.collect_events()
    assert isinstance(created, ev.SessionEnqueued)
    assert created.kernel_ids == list(session.kernels)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("owner", ""),
        ("image", " "),
        ("resources", {"cpu": 0, "mem": 1}),
        ("resources", {"cpu": 1}),
        ("resource_group", "a.b"),
        ("cluster_size", 0),
        ("cluster_size", True),
        ("request_id", ""),
        ("session_id", "has space"),
    ],
)
def test_enqueue_rejects_bad_input_naming_the_field(field: str, value: object) -> None:
    kwargs: dict[str, object] = {
        "owner": "alice",
        "image": "busybox:1",
        "resources": {"cpu": 1, "mem": 1},
        "resource_group": "default",
        field: value,
    }
    with pytest.raises(ValueError, match=field):
        Session.enqueue(**kwargs)  # type: ignore[arg-type]


def test_rebuilt_session_equals_original() -> None:
    events = full_session_history()
    first_session = [e for e in events if e.originator_id == events[0].originator_id]
    original = ev.rebuild(first_session)
    rebuilt = ev.rebuild(stored(first_session))
    assert isinstance(rebuilt, Session)
    assert rebuilt == original
    assert rebuilt.version == len(first_session)
    assert rebuilt.status == S.ERROR
    k1, k2 = rebuilt.kernels.values()
    assert (k1.agent_id, k1.pull_task_id, k1.container_id) == ("agent-1", "pull-1", "c1")
    assert k2.status_info == "failed-to-start"


def test_rebuild_from_commands_equals_live_aggregate() -> None:
    session = new_session(cluster_size=2)
    k1, k2 = session.kernels
    session.schedule({k1: "agent-1", k2: "agent-1"})
    session.mark_pulling(k1, "pull-1")
    events = list(session.collect_events())
    assert ev.rebuild(stored(events)) == session


def test_every_status_change_carries_status_info() -> None:
    events = full_session_history()
    sessions: dict[str, Session] = {}
    for event in stored(events):
        before = sessions.get(event.originator_id)
        lengths = (
            {} if before is None else {k: len(v.status_history) for k, v in before.kernels.items()}
        )
        after = event.mutate(before)
        assert isinstance(after, Session)
        sessions[event.originator_id] = after
        changed = [
            k for k in after.kernels.values() if len(k.status_history) > lengths.get(k.kernel_id, 0)
        ]
        if isinstance(event, ev.HookSkipped):  # a note: no status changes
            assert not changed, changed
            continue
        assert changed, f"{type(event).__name__} changed no kernel"
        for kernel in changed:
            last = kernel.status_history[-1]
            assert last.status == kernel.status
            assert last.status_info and last.status_info == kernel.status_info
            assert last.at == event.timestamp


def test_derived_session_status() -> None:
    session = new_session(cluster_size=2)
    k1, k2 = session.kernels
    session.schedule({k1: "agent-1", k2: "agent-2"})
    session.mark_pulling(k1, "pull-1")
    session.mark_prepared(k2)
    assert session.status == S.PULLING
    session.mark_creating(k2)
    session.mark_created(k2, "c2")
    assert session.status == S.PULLING  # the slowest kernel decides
    assert session.status_info == "pulling"
    session.mark_prepared(k1)
    session.mark_creating(k1)
    session.mark_created(k1, "c1")
    assert session.status == S.RUNNING
    session.mark_terminating(k1, "user-requested")
    assert session.status == S.TERMINATING
    session.mark_terminated(k1, "terminated")
    session.mark_terminated(k2, "agent-lost")
    assert session.status == S.TERMINATED

    cancelled = new_session(cluster_size=2)
    for kernel_id in cancelled.kernels:
        cancelled.cancel(kernel_id, "user-requested")
    assert cancelled.status == S.CANCELLED


def test_derived_status_pulling_kernel_is_slowest() -> None:
    session = new_session(cluster_size=2)
    k1, k2 = session.kernels
    session.schedule({k1: "agent-1", k2: "agent-2"})
    session.mark_pulling(k1, "pull-1")
    assert session.status == S.SCHEDULED
    session.mark_prepared(k2)
    assert session.status == S.PULLING


def test_scheduling_failed_records_only_new_reasons() -> None:
    session = new_session()
    session.collect_events()
    session.scheduling_failed("no-available-instances")
    session.scheduling_failed("no-available-instances")
    session.scheduling_failed("predicate-checks-failed: concurrency")
    events = session.collect_events()
    assert [e.status_info for e in events] == [  # type: ignore[attr-defined]
        "no-available-instances",
        "predicate-checks-failed: concurrency",
    ]
    assert session.status == S.PENDING
    assert session.status_info == "predicate-checks-failed: concurrency"


def test_schedule_must_place_exactly_the_sessions_kernels() -> None:
    session = new_session(cluster_size=2)
    k1, _ = session.kernels
    session.collect_events()
    with pytest.raises(InvalidField, match=r"placements: .*missing"):
        session.schedule({k1: "agent-1"})
    with pytest.raises(InvalidField, match="unknown"):
        session.schedule({**dict.fromkeys(session.kernels, "agent-1"), "nope": "agent-1"})
    with pytest.raises(ValueError, match="placements"):
        session.schedule(dict.fromkeys(session.kernels, "bad agent"))
    assert session.pending_events == []
    assert session.status == S.PENDING


def test_commands_name_unknown_kernels_and_bad_arguments() -> None:
    session = new_session()
    kernel_id = only_kernel(session)
    session.collect_events()
    with pytest.raises(UnknownKernel, match="has no kernel nope"):
        session.cancel("nope", "user-requested")
    with pytest.raises(InvalidField, match="status_info"):
        session.cancel(kernel_id, "")
    session.schedule({kernel_id: "agent-1"})
    with pytest.raises(ValueError, match="task_id"):
        session.mark_pulling(kernel_id, "a/b")
    with pytest.raises(IllegalTransition, match="from SCHEDULED to PENDING"):
        session.scheduling_failed("no-available-instances")
    assert len(session.collect_events()) == 1


# --- Agent -------------------------------------------------------------------------------


def test_agent_history_rebuilds() -> None:
    events = full_agent_history()
    agent = ev.rebuild(stored(events))
    assert isinstance(agent, Agent)
    assert agent == ev.rebuild(events)
    assert agent.version == len(events)
    assert agent.status_info == "reregistered"
    assert agent.pulls == {}
    assert agent.images == {
        "127.0.0.1:5000/busybox:1": ev.HeldImage(digest="sha256:bb", size_bytes=2_000_000)
    }


def test_agent_pulls_and_images() -> None:
    agent = new_agent()
    image = "127.0.0.1:5000/busybox:1"
    agent.pull_started(image, "pull-1")
    assert agent.pulls == {image: "pull-1"}
    with pytest.raises(DomainError, match=r"already pulls .* as task pull-1"):
        agent.pull_started(image, "pull-2")
    with pytest.raises(DomainError, match="no pull of"):
        agent.pulled(image, "pull-2", "sha256:x", 1, 1.0)
    with pytest.raises(InvalidField, match="size_bytes"):
        agent.pulled(image, "pull-1", "sha256:x", -1, 1.0)
    agent.pulled(image, "pull-1", "sha256:x", 10, 0.5)
    assert agent.pulls == {}
    assert agent.images[image] == ev.HeldImage(digest="sha256:x", size_bytes=10)
    agent.image_removed(image, "unload-requested")
    assert image not in agent.images
    with pytest.raises(DomainError, match="holds no image"):
        agent.image_removed(image, "unload-requested")
    events = agent.collect_events()
    assert [type(e).__name__ for e in events] == [
        "AgentRegistered",
        "ImagePullStarted",
        "ImagePulled",
        "ImageRemoved",
    ]


def test_agent_liveness_counts_losses_and_rebuilds() -> None:
    liveness = AgentLiveness.mark_lost(None, "agent-1", "heartbeat-timeout: no heartbeat")
    AgentLiveness.mark_lost(liveness, "agent-1", "x" * 5000)  # outside text is cut, not refused
    events = liveness.collect_events()
    assert [e.originator_version for e in events] == [1, 2]
    rebuilt = ev.rebuild(stored(events))
    assert isinstance(rebuilt, AgentLiveness) and rebuilt.losses == 2
    assert len(rebuilt.status_info) == 1024 and rebuilt.status_info.endswith("\u2026")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("agent_id", "agent.1"),
        ("capacity", {"cpu": 1, "mem": 1}),
        ("capacity", {"cpu": 1, "mem": 0, "disk": 0}),
        ("runtime", ""),
        ("images", {"x": {"digest": ""}}),
    ],
)
def test_register_rejects_bad_input_naming_the_field(field: str, value: object) -> None:
    kwargs: dict[str, object] = {
        "agent_id": "agent-1",
        "resource_group": "default",
        "capacity": {"cpu": 1, "mem": 1, "disk": 0},
        "runtime": "dummy",
        field: value,
    }
    with pytest.raises(ValueError, match=field):
        Agent.register(**kwargs)  # type: ignore[arg-type]


def test_agent_with_v1_event_in_history_loads() -> None:
    events = full_agent_history()[:2]  # registered, pull started
    data, headers = V1_PULLED
    history = [*stored(events), decode(data, headers)]
    agent = ev.rebuild(history)
    assert isinstance(agent, Agent)
    assert agent.pulls == {}
    assert agent.images["127.0.0.1:5000/busybox:1"].size_bytes == 2_000_000
