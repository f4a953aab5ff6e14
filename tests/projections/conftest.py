"""A real event store and the read-model helpers the projection tests share."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import duckdb
import pytest

from domain import subjects
from domain.agent import Agent
from domain.liveness import AgentLiveness
from domain.prepull import PrepullPolicy
from domain.session import Session
from eventstore.repository import Repository
from eventstore.store import EventStore
from projections import ALL
from projections.runner import Runner
from transport.client import Client


@pytest.fixture
async def store(nc: Client) -> AsyncIterator[EventStore]:
    store = EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
    await store.ensure_stream()
    yield store


@pytest.fixture
def repo(store: EventStore) -> Repository:
    return Repository(store)


def rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cur = con.cursor()
    result = cur.execute(sql)
    names = [d[0] for d in result.description]
    return [dict(zip(names, r, strict=True)) for r in result.fetchall()]


async def rebuilt(store: EventStore, until_seq: int | None = None) -> duckdb.DuckDBPyConnection:
    """Every read model from scratch, in memory."""
    con = duckdb.connect()
    await Runner(con, store, ALL).run(follow=False, until_seq=until_seq)
    return con


async def scripted_history(
    repo: Repository, sessions: int = 12, seed: int = 7, prefix: str = "agent"
) -> int:
    """Agents and sessions through many lives (run, pull, pull failure, cancel, error,
    preload marks, agent lost and back) and a prepull policy set, replaced, removed and set
    again; returns the last stream sequence."""
    rng = random.Random(seed)
    agents = []
    for i in range(2):
        agent = Agent.register(
            agent_id=f"{prefix}-{i}",
            resource_group="default",
            capacity={"cpu": 16, "mem": 2**36, "disk": 2**40},
            runtime="dummy",
            images={"base:1": {"digest": "sha256:base", "size_bytes": 1000}},
        )
        await repo.save(agent)
        agents.append(agent)
    last = 0
    policy: PrepullPolicy | None = None
    for n in range(sessions):
        agent = agents[n % 2]
        if n < 4:  # interleaved with the rest, so crashes and batches cut through them
            policy = PrepullPolicy.set(
                policy,
                name=f"{prefix}-policy",
                resource_groups=["default"] if n % 2 else [],
                rules=[{"kind": "images", "images": [f"img:{n}"]}],
                priority=n,
            )
            if n == 2:
                policy.remove()
            await repo.save(policy)
            # agent-0: unpinned then pinned; agent-1: pinned.
            agent.mark_preloaded("base:1", f"preload: job j{n}", pinned=n > 0)
        image = f"img:{n % 3}"
        session = Session.enqueue(
            owner=f"user-{n % 3}",
            image=image,
            resources={"cpu": 1.0, "mem": 2**30},
            resource_group="default",
            cluster_size=rng.choice([1, 2]),
        )
        await repo.save(session)
        kernels = list(session.kernels)
        if rng.random() < 0.2:
            session.scheduling_failed("no-available-instances")
            await repo.save(session)
        session.schedule({k: agent.id for k in kernels})
        await repo.save(session)
        life = rng.choice(["run", "pull", "pull-fail", "cancel", "error", "stay"])
        task = f"t{n}"
        for k in kernels:
            if life == "cancel":
                session.cancel(k, "user-requested")
                continue
            session.mark_preparing(k)
            if life.startswith("pull"):
                session.mark_pulling(k, task)
        if life.startswith("pull"):
            agent.pull_started(f"{image}-{n}", task)
            await repo.save(session, agent)
            if life == "pull-fail":
                agent.pull_failed(f"{image}-{n}", task, "manifest unknown")
                for k in kernels:
                    session.cancel(k, "image-pull-failed")
                await repo.save(session, agent)
                continue
            agent.pulled(f"{image}-{n}", task, f"sha256:{n}", 5000 + n, 0.5)
        if life != "cancel":
            for k in kernels:
                session.mark_prepared(k)
                session.mark_creating(k)
                if life == "error":
                    session.creation_failed(k, "no such file")
                else:
                    session.mark_created(k, f"c-{k}")
        if life in ("run", "pull") and rng.random() < 0.5:
            for k in kernels:
                session.mark_terminating(k, "user-requested")
                session.mark_terminated(k, "exited")
        seqs = await repo.save(session, agent)
        last = seqs[-1] if seqs else last
    await repo.save(AgentLiveness.mark_lost(None, agents[0].id, "heartbeat-timeout"))
    agents[0].image_removed("base:1", "gc-disk-pressure")
    await repo.save(agents[0])
    agents[0].reregister(
        resource_group="default",
        capacity={"cpu": 8, "mem": 2**35, "disk": 2**40},
        runtime="dummy",
        images={"img:0-0": {"digest": "sha256:0", "size_bytes": 5000}},
    )
    return (await repo.save(agents[0]))[-1]
