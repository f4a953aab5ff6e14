"""Repository: domain aggregates saved and loaded through the event store."""

from __future__ import annotations

import asyncio

import pytest

from domain.agent import Agent
from domain.session import Session
from domain.status import KernelStatus
from domain.subjects import agent_events, session_events
from eventstore.repository import NotFound, Repository, kind_of, loaded_seq
from eventstore.store import ConcurrencyError, EventStore


def new_session() -> Session:
    return Session.enqueue(
        owner="alice", image="python:3.12", resources={"cpu": 1, "mem": 2**30}, resource_group="rg"
    )


def new_agent(agent_id: str = "agent-1") -> Agent:
    return Agent.register(
        agent_id=agent_id,
        resource_group="rg",
        capacity={"cpu": 8, "mem": 2**34, "disk": 2**40},
        runtime="dummy",
    )


def test_kinds_match_the_subjects_of_the_domain() -> None:
    assert (kind_of(Session), kind_of(Agent)) == ("session", "agent")


async def test_save_then_get_rebuilds_the_aggregate(store: EventStore) -> None:
    repo = Repository(store)
    session = new_session()
    [seq] = await repo.save(session)
    assert loaded_seq(session) == seq
    [record] = await store.read_subject(session_events(session.id))
    assert record.seq == seq

    loaded = await repo.get(Session, session.id)
    assert (loaded.id, loaded.version, loaded.owner) == (session.id, 1, "alice")
    assert loaded.status == KernelStatus.PENDING
    assert loaded_seq(loaded) == seq
    by_kind = await repo.get("session", session.id)
    assert isinstance(by_kind, Session)


async def test_get_unknown_raises_not_found_naming_it(store: EventStore) -> None:
    with pytest.raises(NotFound, match="no session with id 'nope'"):
        await Repository(store).get(Session, "nope")


async def test_save_of_several_aggregates_is_one_atomic_append(store: EventStore) -> None:
    repo = Repository(store)
    session, agent = new_session(), new_agent()
    await repo.save(session, agent)
    session = await repo.get(Session, session.id)
    agent = await repo.get(Agent, agent.id)
    [kernel_id] = session.kernels
    session.schedule({kernel_id: agent.id})
    agent.pull_started("python:3.12", "task-1")

    # Someone else changes the agent meanwhile: the whole save is refused, the session too.
    other = await repo.get(Agent, agent.id)
    other.pull_started("python:3.11", "task-0")
    await repo.save(other)
    with pytest.raises(ConcurrencyError) as caught:
        await repo.save(session, agent)
    assert caught.value.subject == agent_events(agent.id)
    assert len(await store.read_subject(session_events(session.id))) == 1

    # Reload, decide again, succeed: both aggregates move together.
    session = await repo.get(Session, session.id)
    agent = await repo.get(Agent, agent.id)
    session.schedule({kernel_id: agent.id})
    agent.pull_started("python:3.12", "task-1")
    seqs = await repo.save(session, agent)
    assert len(seqs) == 2
    assert (await repo.get(Session, session.id)).status == KernelStatus.SCHEDULED
    assert (await repo.get(Agent, agent.id)).pulls == {
        "docker.io/library/python:3.11": "task-0",
        "docker.io/library/python:3.12": "task-1",
    }


async def test_two_copies_racing_one_wins_the_other_reloads(store: EventStore) -> None:
    repo = Repository(store)
    session = new_session()
    await repo.save(session)
    [kernel_id] = session.kernels
    first, second = await asyncio.gather(
        repo.get(Session, session.id), repo.get(Session, session.id)
    )
    first.schedule({kernel_id: "agent-1"})
    await repo.save(first)
    second.cancel(kernel_id, "user-requested")
    with pytest.raises(ConcurrencyError):
        await repo.save(second)
    second = await repo.get(Session, session.id)
    assert second.kernel(kernel_id).status == KernelStatus.SCHEDULED
    second.cancel(kernel_id, "user-requested")
    await repo.save(second)
    assert (await repo.get(Session, session.id)).status == KernelStatus.CANCELLED
    assert len(await store.read_subject(session_events(session.id))) == 3


async def test_retried_save_with_the_request_id_appends_once(store: EventStore) -> None:
    repo = Repository(store)
    session, agent = new_session(), new_agent()
    first = await repo.save(session, agent, request_id="req-1")
    # The retry re-runs the command: same ids, fresh (equal) aggregates.
    again_session = Session.enqueue(
        owner="alice",
        image="python:3.12",
        resources={"cpu": 1, "mem": 2**30},
        resource_group="rg",
        session_id=session.id,
    )
    assert await repo.save(again_session, new_agent(), request_id="req-1") == first
    assert (await store.js.stream_info(store.stream)).state.messages == 2


async def test_save_without_pending_events_appends_nothing(store: EventStore) -> None:
    repo = Repository(store)
    session = new_session()
    await repo.save(session)
    assert await repo.save(session) == []
    with pytest.raises(ValueError, match="passed twice"):
        await repo.save(session, session)
