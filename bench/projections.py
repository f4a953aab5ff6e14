"""Projection catch-up against a raw ordered-consumer read of the same stream, in one run.

Setup (not measured): sessions built with the domain aggregates through their whole lives
(successful runs, pulls, cancellations, creation failures), agents registering and pulling
images; each session's events are encoded once and copied with fresh ids, then appended in
atomic batches of up to 1,000 events, several batches in flight.

Measured: a raw ordered consumer of stock nats-py reading the whole stream (the baseline of the
ratio), a raw batched direct get of stock nats-py reading it in 1,000-message pages (what
EventStore.replay asks for, for reference), and the projection runner building every read model
from scratch into a DuckDB file (replay through Hoist's nats-py client, decode, fold, batched
writes with checkpoints).  Prints the rates and the
ratio projections / ordered consumer (target >= 0.5).  With
``--rebuild-events N`` it also appends up to N events and times a full rebuild of all models
over them (target: 1M events in <= 30 s).

    python bench/projections.py [--events 500000] [--rebuild-events 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import duckdb
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import SlowConsumerError
from nats.js.api import ConsumerConfig, DeliverPolicy

from domain import subjects
from domain.agent import Agent
from domain.codec import encode
from domain.session import Session
from eventstore.bulk import BulkReader
from eventstore.store import MAX_BATCH, EventStore, Message, Write
from services.stack.natsserver import NatsServer
from transport.client import connect

# Run as a script, this file's directory comes first on sys.path and its name shadows the
# projections package: drop it before importing the runner.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
Runner = importlib.import_module("projections.runner").Runner
ALL = importlib.import_module("projections").ALL

AGENTS = 50
IN_FLIGHT = 4  # atomic batches appended concurrently


def _session_templates() -> list[tuple[list[str], list[Message]]]:
    """Sessions of different lives: (ids to replace, encoded events)."""
    out = []
    for shape in ("run", "run", "run", "pull", "cancel", "error"):
        s = Session.enqueue(
            owner="owner-x",
            image="registry.local/img:1",
            resources={"cpu": 1.0, "mem": 2**30},
            resource_group="default",
            cluster_size=2 if shape == "run" else 1,
        )
        kernels = list(s.kernels)
        s.scheduling_failed("no-available-instances")
        s.schedule({k: "agent-x" for k in kernels})
        for k in kernels:
            if shape == "cancel":
                s.cancel(k, "user-requested")
                continue
            s.mark_preparing(k)
            if shape == "pull":
                s.mark_pulling(k, "task-x")
            s.mark_prepared(k)
            s.mark_creating(k)
            if shape == "error":
                s.creation_failed(k, "no such file")
                continue
            s.mark_created(k, "container-x")
            s.mark_terminating(k, "user-requested")
            s.mark_terminated(k, "exited")
        messages = [Message(*encode(e)) for e in s.collect_events()]  # type: ignore[arg-type]
        out.append(([s.id, *kernels], messages))
    return out


def _agent_events(i: int) -> tuple[str, list[Message]]:
    a = Agent.register(
        agent_id=f"agent-{i}",
        resource_group="default",
        capacity={"cpu": 64, "mem": 2**38, "disk": 2**40},
        runtime="dummy",
        images={"registry.local/base:1": {"digest": "sha256:b", "size_bytes": 10**8}},
    )
    for j in range(20):
        a.pull_started(f"registry.local/img:{j}", f"t{j}")
        if j % 4 == 3:
            a.pull_failed(f"registry.local/img:{j}", f"t{j}", "manifest unknown")
        else:
            a.pulled(f"registry.local/img:{j}", f"t{j}", f"sha256:{j}", 10**7 * j, 1.5)
    a.reregister(
        resource_group="default", capacity={"cpu": 64, "mem": 2**38, "disk": 2**40}, runtime="dummy"
    )
    events = [Message(*encode(e)) for e in a.collect_events()]  # type: ignore[arg-type]
    return subjects.agent_events(a.id), events


async def append_events(store: EventStore, total: int, agents: bool = True) -> int:
    """Append about ``total`` events (with ``agents``: the agents' histories first, once per
    stream: a second registration is refused by every reader); returns how many."""
    writes: list[Write] = []
    for i in range(AGENTS if agents else 0):
        subject, messages = _agent_events(i)
        writes.append(Write(subject, messages))
    templates = _session_templates()
    owners = [f"user-{i}" for i in range(200)]
    count = sum(len(w.messages) for w in writes)
    n = 0
    while count < total:
        ids, messages = templates[n % len(templates)]
        fresh = [uuid.uuid4().hex for _ in ids]
        owner = owners[n % len(owners)].encode()
        agent = f"agent-{n % AGENTS}".encode()
        copied = []
        for m in messages:
            data = m.data.replace(b"owner-x", owner).replace(b"agent-x", agent)
            for old, new in zip(ids, fresh, strict=True):
                data = data.replace(old.encode(), new.encode())
            copied.append(Message(data, m.headers))
        writes.append(Write(subjects.session_events(fresh[0]), copied))
        count += len(copied)
        n += 1
    batches: list[list[Write]] = [[]]
    size = 0
    for w in writes:
        if size + len(w.messages) > MAX_BATCH:
            batches.append([])
            size = 0
        batches[-1].append(w)
        size += len(w.messages)
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def one(batch: list[Write]) -> None:
        async with sem:
            await store.append(batch)

    await asyncio.gather(*(one(b) for b in batches))
    return count


async def raw_read(nc: Client, stream: str) -> int:
    """An ordered consumer reading the whole stream, doing nothing with the messages."""
    sub = await nc.jetstream().subscribe(
        ">",
        stream=stream,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        # Big enough never to drop: the baseline is the best a raw reader gets.
        pending_msgs_limit=4_000_000,
        pending_bytes_limit=4 * 1024**3,
    )
    n = 0
    try:
        async for msg in sub.messages:
            n += 1
            if msg.metadata.num_pending == 0:
                return n
    finally:
        await sub.unsubscribe()
    return n


async def raw_direct(nc: Client, stream: str) -> int:
    """Batched direct gets of 1,000 messages, one page after the other, doing nothing with the
    messages (nats-py parses them, as for any reader)."""
    inbox = nc.new_inbox()
    page_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    n = 0
    last = 0
    pending = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal n, last, pending
        headers = msg.headers or {}
        if "Nats-Sequence" in headers:
            n += 1
            last = int(headers["Nats-Sequence"])
            pending = int(headers["Nats-Num-Pending"])
        elif not page_done.done():
            page_done.set_result(None)  # end of the batch (204) or nothing more (404)

    sub = await nc.subscribe(inbox, cb=on_msg)
    try:
        while True:
            req = json.dumps({"seq": last + 1, "batch": 1000}).encode()
            await nc.publish(f"$JS.API.DIRECT.GET.{stream}", req, reply=inbox)
            await page_done
            if pending == 0:
                return n
            page_done = asyncio.get_running_loop().create_future()
    finally:
        await sub.unsubscribe()


async def build(store: EventStore, db: Path, bulk: BulkReader | None) -> tuple[int, float]:
    con = duckdb.connect(str(db))
    start = time.perf_counter()
    runner = Runner(con, store, ALL, bulk=bulk)
    last = await runner.run(follow=False)
    elapsed = time.perf_counter() - start
    con.close()
    return last, elapsed


async def main(events: int, rebuild_events: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp) / "nats") as server:
        slow: list[Exception] = []

        async def on_error(e: Exception) -> None:  # counted, not printed one per drop
            if isinstance(e, SlowConsumerError):
                slow.append(e)
            else:
                print(f"nats error: {e}")

        raw_nc = await nats.connect(server.url, error_cb=on_error)  # stock nats-py
        nc = await connect(server.url, error_cb=on_error)  # Hoist's, as every Hoist process
        store = EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
        await store.ensure_stream()
        t0 = time.perf_counter()
        appended = await append_events(store, events)
        print(f"setup: appended {appended} events in {time.perf_counter() - t0:.1f}s")

        t0 = time.perf_counter()
        n_raw = await raw_read(raw_nc, subjects.EVENT_STREAM)
        raw_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        n_direct = await raw_direct(raw_nc, subjects.EVENT_STREAM)
        direct_s = time.perf_counter() - t0
        # As the manager runs it: far behind, a child process reads while this one folds.
        bulk = BulkReader(server.url, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
        last, proj_s = await build(store, Path(tmp) / "catchup.duckdb", bulk)
        raw_rate, proj_rate = n_raw / raw_s, last / proj_s
        print(f"raw ordered consumer: {n_raw} events in {raw_s:.2f}s = {raw_rate:,.0f} events/s")
        print(
            f"raw batched direct get: {n_direct} events in {direct_s:.2f}s ="
            f" {n_direct / direct_s:,.0f} events/s"
        )
        print(f"projections catch-up: {last} events in {proj_s:.2f}s = {proj_rate:,.0f} events/s")
        print(f"ratio projections/raw ordered consumer: {proj_rate / raw_rate:.2f} (target >= 0.5)")
        print(f"ratio projections/raw direct get: {proj_rate / (n_direct / direct_s):.2f}")
        print(f"slow-consumer drops (client buffer overflows) so far: {len(slow)}")

        if rebuild_events:
            more = rebuild_events - appended
            if more > 0:
                t0 = time.perf_counter()
                appended += await append_events(store, more, agents=False)
                print(f"setup: {appended} events in the stream ({time.perf_counter() - t0:.1f}s)")
            last, rebuild_s = await build(store, Path(tmp) / "rebuild.duckdb", bulk)
            print(f"slow-consumer drops (client buffer overflows) so far: {len(slow)}")
            print(
                f"full rebuild: {last} events in {rebuild_s:.1f}s = {last / rebuild_s:,.0f}"
                " events/s (target: 1M events <= 30 s)"
            )
        await nc.close()
        await raw_nc.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--rebuild-events", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.rebuild_events))
