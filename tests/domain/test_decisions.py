"""The Session's decisions: what a request or an observed fact means for its kernels.

The manager's services only get a session, call one of these and save; each is tested here
without any I/O, from every status where it matters.
"""

from __future__ import annotations

import pytest

from domain.errors import NotNow
from domain.session import Session
from domain.status import PRE_RUNNING, KernelStatus
from tests.domain.histories import new_session, session_at

S = KernelStatus


def two_on(agents: tuple[str, str] = ("a1", "a2")) -> tuple[Session, str, str]:
    session = new_session(cluster_size=2)
    k1, k2 = session.kernels
    session.schedule({k1: agents[0], k2: agents[1]})
    session.start_preparing()
    return session, k1, k2


def statuses(session: Session) -> list[S]:
    return [k.status for k in session.kernels.values()]


def test_start_preparing_marks_the_scheduled_kernels_preparing_with_their_agent() -> None:
    session, k1, _ = two_on()
    assert statuses(session) == [S.PREPARING, S.PREPARING]
    assert [c.status for c in session.kernels[k1].status_history] == [
        S.PENDING,
        S.SCHEDULED,
        S.PREPARING,
    ]
    assert session.kernels[k1].status_info == "preparing: asking a1 for the image"
    before = len(session.pending_events)
    session.start_preparing()  # nothing SCHEDULED any more: nothing recorded
    assert len(session.pending_events) == before


def test_kernels_on_an_agent_holding_the_image_are_prepared_without_asking() -> None:
    session = new_session(cluster_size=2)
    k1, k2 = session.kernels
    session.schedule({k1: "a1", k2: "a2"})
    session.start_preparing(holding={"a1"})
    assert statuses(session) == [S.PREPARED, S.PREPARING]
    assert session.kernels[k1].status_info == "image-present: a1 holds it, by the event log"
    session.start_creating()  # k2 still waits for its image: nothing asked for yet
    assert statuses(session) == [S.PREPARED, S.PREPARING]
    everywhere = new_session(cluster_size=2)
    e1, e2 = everywhere.kernels
    everywhere.schedule({e1: "a1", e2: "a2"})
    everywhere.start_preparing(holding={"a1", "a2"})
    everywhere.start_creating()
    assert statuses(everywhere) == [S.CREATING, S.CREATING]


def test_an_image_missing_at_create_sends_the_kernel_back_while_its_sibling_runs() -> None:
    session = new_session(cluster_size=2)
    k1, k2 = session.kernels
    session.schedule({k1: "a1", k2: "a2"})
    session.start_preparing(holding={"a1", "a2"})
    session.start_creating()
    session.created(k1, container_id="c1")
    session.image_missing(k2)
    assert statuses(session) == [S.RUNNING, S.PREPARING]
    assert session.kernels[k2].status_info == (
        f"image-missing: a2 had no {session.image} at the create;"
        " checking again, pulling it if need be"
    )
    session.image_missing(k2)  # not CREATING any more: nothing recorded
    assert len(session.kernels[k2].status_history) == 5
    session.image_checked("a2", "task-2")
    session.start_creating()  # k2 waits for its pull: nothing asked
    assert statuses(session) == [S.RUNNING, S.PULLING]
    session.image_ready("a2")
    session.start_creating()  # the running sibling does not hold k2 back
    assert statuses(session) == [S.RUNNING, S.CREATING]


def test_no_container_is_asked_for_beside_a_sibling_that_failed() -> None:
    session = new_session(cluster_size=2)
    k1, k2 = session.kernels
    session.schedule({k1: "a1", k2: "a2"})
    session.start_preparing(holding={"a1"})
    session.image_checked("a2", None, error="no room for the image")
    session.start_creating()  # k2 CANCELLED: k1 is not sent a create
    assert statuses(session) == [S.PREPARED, S.CANCELLED]
    session.wind_down()
    assert statuses(session) == [S.CANCELLED, S.CANCELLED]
    assert session.kernels[k1].status_info.startswith("sibling-failed: kernel ")


def test_an_image_missing_twice_fails_the_kernel_instead_of_going_round() -> None:
    session = new_session()
    [k] = session.kernels
    session.schedule({k: "a1"})
    session.start_preparing(holding={"a1"})
    session.start_creating()
    session.image_missing(k)
    session.image_checked("a1", None)  # the agent says it holds it after all
    session.start_creating()
    session.image_missing(k)
    assert (session.kernels[k].status, session.kernels[k].status_info) == (
        S.ERROR,
        f"failed-to-start: image-missing again: a1 had no {session.image} at the create",
    )


@pytest.mark.parametrize("status", list(S))
def test_destroy_from_every_status(status: S) -> None:
    session, kid = session_at(status)
    session.destroy()
    k = session.kernels[kid]
    if status in PRE_RUNNING:
        assert (k.status, k.status_info) == (S.CANCELLED, "user-requested")
    elif status is S.RUNNING:
        assert (k.status, k.status_info) == (S.TERMINATING, "user-requested")
    else:
        assert k.status is status  # nothing to do for a stopping or final kernel


@pytest.mark.parametrize("status", [S.RUNNING, S.TERMINATING])
def test_forced_destroy_records_terminated_at_once(status: S) -> None:
    session, kid = session_at(status)
    session.destroy(forced=True)
    k = session.kernels[kid]
    assert (k.status, k.status_info) == (S.TERMINATED, "force-terminated")


def test_force_cancel_only_before_running() -> None:
    session, kid = session_at(S.PULLING)
    session.force_cancel(kid, "stuck registry")
    assert session.kernels[kid].status_info == "force-cancelled: stuck registry"
    running, rid = session_at(S.RUNNING)
    before = len(running.pending_events)
    with pytest.raises(NotNow, match="destroy the session instead"):
        running.force_cancel(rid)
    assert len(running.pending_events) == before  # the refusal recorded nothing
    assert running.kernels[rid].status is S.RUNNING


def test_agents_lost_cancels_only_kernels_not_running_on_those_agents() -> None:
    session, k1, k2 = two_on()
    session.agents_lost({"a1": "heartbeat-timeout: no heartbeat for 15s"})
    assert session.kernels[k1].status is S.CANCELLED
    assert session.kernels[k1].status_info == (
        "agent-lost: a1 (heartbeat-timeout: no heartbeat for 15s)"
    )
    assert session.kernels[k2].status is S.PREPARING


def test_given_up_on_terminates_running_kernels_of_that_agent() -> None:
    session, kid = session_at(S.RUNNING)
    session.given_up_on("agent-1", "heartbeat-timeout: x", 15)
    k = session.kernels[kid]
    assert (k.status, k.status_info) == (S.TERMINATED, "agent-lost: agent-1 (heartbeat-timeout: x)")
    other, oid = session_at(S.RUNNING)
    other.given_up_on("agent-2", "heartbeat-timeout: x", 15)
    assert other.kernels[oid].status is S.RUNNING


def test_wind_down_after_a_sibling_failed() -> None:
    session, k1, k2 = two_on()
    session.image_checked("a1", None)
    session.image_checked("a2", None, error="bad-image: no such repository")
    assert session.kernels[k2].status_info == (
        "check-and-pull-failed: bad-image: no such repository"
    )
    session.wind_down()
    assert session.kernels[k1].status is S.CANCELLED
    assert session.kernels[k1].status_info.startswith(f"sibling-failed: kernel {k2} CANCELLED")


def test_image_checked_pulling_or_present() -> None:
    session, k1, k2 = two_on()
    session.image_checked("a1", "task-1")
    session.image_checked("a2", None)
    assert (session.kernels[k1].status, session.kernels[k1].pull_task_id) == (S.PULLING, "task-1")
    assert (session.kernels[k2].status, session.kernels[k2].status_info) == (
        S.PREPARED,
        "image-present: a2 holds it",
    )
    session.image_checked("a1", "task-2")  # a late answer changes nothing
    assert session.kernels[k1].pull_task_id == "task-1"


def test_image_ready_and_pull_ended() -> None:
    session, k1, k2 = two_on()
    session.image_checked("a1", "task-1")
    session.image_checked("a2", "task-2")
    session.image_ready("a1")
    session.pull_ended("a2", "image-pull-failed: manifest unknown", ["someone-else"])
    assert statuses(session) == [S.PREPARED, S.PULLING]  # not that kernel's pull
    session.pull_ended("a2", "image-pull-failed: manifest unknown", [k2])
    assert session.kernels[k1].status_info == "image-pulled"
    assert session.kernels[k2].status_info == "image-pull-failed: manifest unknown"


def test_start_creating_waits_for_every_kernel_then_created_or_failed() -> None:
    session, k1, k2 = two_on()
    session.image_checked("a1", None)
    session.image_checked("a2", "task-2")
    session.start_creating()
    assert statuses(session) == [S.PREPARED, S.PULLING]
    session.image_ready("a2")
    session.start_creating()
    assert statuses(session) == [S.CREATING, S.CREATING]
    session.created(k1, container_id="c1")
    session.created(k2, error="insufficient-resources: no room", detail="no room")
    assert session.kernels[k1].status is S.RUNNING
    assert (session.kernels[k2].status, session.kernels[k2].status_info) == (
        S.ERROR,
        "failed-to-start: insufficient-resources: no room",
    )
    session.created(k1, container_id="c2")  # not CREATING any more: left alone
    assert session.kernels[k1].container_id == "c1"


def test_container_removed_and_containers_gone() -> None:
    session, kid = session_at(S.TERMINATING)
    session.container_removed(kid, had_container=True)
    assert session.kernels[kid].status is S.TERMINATED
    running, rid = session_at(S.RUNNING)
    running.containers_gone("agent-1", [rid], exited=[rid])
    assert (
        running.kernels[rid].status_info == "container-exited: its process ended on agent agent-1"
    )
    gone, gid = session_at(S.RUNNING)
    gone.containers_gone("agent-9", [gid], exited=[])  # another agent's report: ignored
    assert gone.kernels[gid].status is S.RUNNING
    gone.containers_gone("agent-1", [gid], exited=[])
    assert gone.kernels[gid].status_info == "container-gone: not found on agent agent-1"


def test_a_scheduler_error_keeps_the_session_pending_with_its_reason_once() -> None:
    session = new_session(cluster_size=2)
    session.collect_events()
    session.scheduler_failed(KeyError("agent\nx"))
    session.scheduler_failed(KeyError("agent\nx"))  # the same again: nothing new
    session.scheduler_failed(RuntimeError())
    events = session.collect_events()
    assert [e.status_info for e in events] == [  # type: ignore[attr-defined]
        "scheduler-error: KeyError: 'agent\\nx'",
        "scheduler-error: RuntimeError",
    ]
    assert statuses(session) == [S.PENDING, S.PENDING]
    assert {k.status_info for k in session.kernels.values()} == {"scheduler-error: RuntimeError"}
    placed, k1, _ = two_on()
    placed.collect_events()
    placed.scheduler_failed(ValueError("late"))  # placed meanwhile: not why it waits
    assert placed.collect_events() == [] and placed.kernels[k1].status == S.PREPARING
