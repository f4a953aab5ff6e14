"""The runner's quarantine of what a read model cannot fold or store, with no production code
changed: a fold that raises on one event (the other models still take it), and a batch whose
DuckDB write fails on a value (written again one record at a time: only that record is
skipped).  Either way the rest of the batch is in the models, the runner keeps following, and
a rebuild of the same log without the failure has the event: it was the model's fault."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from domain.agent import Agent
from eventstore.repository import Repository
from eventstore.store import EventStore, Recorded
from projections import ALL
from projections import runner as runner_module
from projections.agents import ImagesProjection
from projections.runner import Runner
from projections.table import Changes, Table
from tests.projections.conftest import rebuilt, rows

BAD = "agent-bad"  # the one event the injected failure is about: this agent's registration


def _agent(agent_id: str) -> Agent:
    return Agent.register(
        agent_id=agent_id,
        resource_group="default",
        capacity={"cpu": 4, "mem": 2**32, "disk": 2**36},
        runtime="dummy",
        images={f"img-{agent_id}:1": {"digest": f"sha256:{agent_id}", "size_bytes": 100}},
    )


async def _register_three(repo: Repository) -> dict[str, int]:
    """agent-a, agent-bad, agent-c registered (appended before the runner starts, so its
    catch-up reads them as one batch); agent id -> the sequence of its registration."""
    seqs = {}
    for agent_id in ("agent-a", BAD, "agent-c"):
        [seqs[agent_id]] = await repo.save(_agent(agent_id))
    return seqs


def _spy_batches(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The sequences of every batch the runner folds, in order."""
    batches: list[list[int]] = []
    fold = Runner._fold

    def spy(self: Runner, batch: list[Recorded], poison: dict[int, str] | None = None) -> None:
        batches.append([r.seq for r in batch])
        fold(self, batch, poison)

    monkeypatch.setattr(Runner, "_fold", spy)
    return batches


def _agent_ids(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    return [r["agent_id"] for r in rows(con, f"SELECT agent_id FROM {table} ORDER BY agent_id")]


def _quarantine(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    return rows(con, "SELECT seq, subject, event_type, reason FROM quarantine ORDER BY seq")


@pytest.fixture
def con(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect(str(tmp_path / "models.duckdb"))
    yield con
    con.close()


async def _follow_then_append_one(
    runner: Runner, repo: Repository, con: duckdb.DuckDBPyConnection, last: int
) -> asyncio.Task[int]:
    """Start following; wait until the three registrations are committed, then append a valid
    registration (agent-d) and wait for it too: the runner still follows after a quarantine."""
    task = asyncio.create_task(runner.run(follow=True))
    assert await runner.wait_for(last, 10.0), (runner.committed, task)
    [after] = await repo.save(_agent("agent-d"))
    assert await runner.wait_for(after, 10.0), runner.committed
    assert not task.done()
    return task


async def _stop(task: asyncio.Task[int]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_fold_that_raises_quarantines_the_event_the_other_models_take_it(
    store: EventStore,
    repo: Repository,
    con: duckdb.DuckDBPyConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seqs = await _register_three(repo)
    batches = _spy_batches(monkeypatch)
    runner = None
    with monkeypatch.context() as m:
        reported = ImagesProjection._reported

        def failing(self: ImagesProjection, e: Any, seq: int) -> None:
            if e.originator_id == BAD:
                raise RuntimeError("injected fold failure")
            reported(self, e, seq)

        # Handlers are bound when a projection is built: patch before the runner builds them.
        m.setattr(ImagesProjection, "_reported", failing)
        runner = Runner(con, store, ALL)
        task = await _follow_then_append_one(runner, repo, con, max(seqs.values()))
        await _stop(task)

    assert batches[0] == sorted(seqs.values())  # the three were one batch
    assert _quarantine(con) == [
        {
            "seq": seqs[BAD],
            "subject": f"hoist.events.agent.{BAD}",
            "event_type": "AgentRegistered",
            "reason": "read model images cannot fold it: RuntimeError: injected fold failure",
        }
    ]
    # The agents model took the event; the images model skipped it and only it.
    assert _agent_ids(con, "agents") == ["agent-a", BAD, "agent-c", "agent-d"]
    assert _agent_ids(con, "agent_images") == ["agent-a", "agent-c", "agent-d"]

    # Not the event's fault: the same log rebuilt without the failure has it everywhere.
    clean = await rebuilt(store)
    assert _quarantine(clean) == []
    assert _agent_ids(clean, "agents") == ["agent-a", BAD, "agent-c", "agent-d"]
    assert _agent_ids(clean, "agent_images") == ["agent-a", BAD, "agent-c", "agent-d"]


async def test_a_write_that_fails_on_a_value_quarantines_only_that_record(
    store: EventStore,
    repo: Repository,
    con: duckdb.DuckDBPyConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seqs = await _register_three(repo)
    batches = _spy_batches(monkeypatch)
    failed_writes: list[str] = []
    with monkeypatch.context() as m:
        write = runner_module.write

        def failing(cur: duckdb.DuckDBPyConnection, table: Table, actual: str, ch: Changes) -> None:
            values = [*ch.appended, *(r.values() for r in ch.rows.values() if r is not None)]
            if any(BAD in tuple(v) for v in values):  # a value equal to it, not a substring
                failed_writes.append(table.name)
                raise duckdb.ConversionException(f"injected: {table.name} cannot hold it")
            write(cur, table, actual, ch)

        m.setattr(runner_module, "write", failing)
        runner = Runner(con, store, ALL)
        task = await _follow_then_append_one(runner, repo, con, max(seqs.values()))
        await _stop(task)

    bad = seqs[BAD]
    assert batches[0] == sorted(seqs.values())  # the three were one batch
    assert failed_writes == ["agents", "agents"]  # the batch's write, then bad's own
    assert _quarantine(con) == [
        {
            "seq": bad,
            "subject": f"hoist.events.agent.{BAD}",
            "event_type": "AgentRegistered",
            "reason": "read model write failed: ConversionException: injected: agents cannot "
            "hold it",
        }
    ]
    # Its rows were never written, in any model; the rest of the batch was.
    assert _agent_ids(con, "agents") == ["agent-a", "agent-c", "agent-d"]
    assert _agent_ids(con, "agent_images") == ["agent-a", "agent-c", "agent-d"]
    assert rows(con, "SELECT DISTINCT seq FROM projection_meta") == [{"seq": runner.seq}]

    # A restarted runner on the file neither retries nor forgets it.
    assert await Runner(con, store, ALL).run(follow=False) == runner.seq
    assert [q["seq"] for q in _quarantine(con)] == [bad]

    clean = await rebuilt(store)
    assert _quarantine(clean) == []
    assert _agent_ids(clean, "agents") == ["agent-a", BAD, "agent-c", "agent-d"]
    assert _agent_ids(clean, "agent_images") == ["agent-a", BAD, "agent-c", "agent-d"]
