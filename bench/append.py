"""Event store against raw nats-py, in one run on one embedded nats-server.

Appends: 100 concurrent aggregates, each appending one event at a time with the concurrency
(Nats-Expected-Last-Subject-Sequence) and idempotency (Nats-Msg-Id) headers, through
EventStore.append and as raw ``js.publish`` calls with the same payloads and headers.
Reads: replaying the whole stream and loading every aggregate, through the store and with a raw
nats-py ordered consumer.  Each side runs ``--rounds`` times, alternating; the best rate counts.

    python bench/append.py [--events 20000] [--aggregates 100] [--rounds 2]

Target: every ratio store/raw >= 0.9 (issue 37).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from eventstore.store import EventStore, Message, Write
from services.stack.natsserver import NatsServer
from transport.client import connect

PAYLOAD = b'{"session_id":"s","kernel":"k","image":"python:3.12","resources":{"cpu":2}}' * 2


def subject(prefix: str, aggregate: int) -> str:
    return f"{prefix}.session.agg{aggregate}"


async def append_store(store: EventStore, prefix: str, events: int, aggregates: int) -> None:
    async def one(a: int) -> None:
        subj, last = subject(prefix, a), 0
        for i in range(events // aggregates):
            message = Message(PAYLOAD, {"Hoist-Type": "SessionCreated"})
            [last] = await store.append(
                [Write(subj, [message], expected_last_seq=last)], idempotency_key=f"{subj}-{i}"
            )

    await asyncio.gather(*(one(a) for a in range(aggregates)))


async def append_raw(nc: Client, prefix: str, events: int, aggregates: int) -> None:
    js = nc.jetstream()

    async def one(a: int) -> None:
        subj, last = subject(prefix, a), 0
        for i in range(events // aggregates):
            headers = {
                "Hoist-Type": "SessionCreated",
                "Nats-Expected-Last-Subject-Sequence": str(last),
                "Nats-Msg-Id": f"{subj}-{i}",
            }
            last = (await js.publish(subj, PAYLOAD, headers=headers)).seq

    await asyncio.gather(*(one(a) for a in range(aggregates)))


async def replay_store(store: EventStore, prefix: str) -> int:
    n = 0
    async for _ in store.replay(subject_filter=f"{prefix}.>"):
        n += 1
    return n


async def raw_ordered_read(nc: Client, stream: str, filter_subject: str) -> int:
    """What a caller without the store writes: an ordered consumer read until caught up."""
    sub = await nc.jetstream().subscribe(
        filter_subject,
        stream=stream,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
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


async def load_store(store: EventStore, prefix: str, aggregates: int) -> int:
    loaded = await asyncio.gather(
        *(store.read_subject(subject(prefix, a)) for a in range(aggregates))
    )
    return sum(map(len, loaded))


async def load_raw(nc: Client, stream: str, prefix: str, aggregates: int) -> int:
    counts = await asyncio.gather(
        *(raw_ordered_read(nc, stream, subject(prefix, a)) for a in range(aggregates))
    )
    return sum(counts)


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def main(events: int, aggregates: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp) / "nats") as server:
        raw_nc = await nats.connect(server.url)  # stock nats-py: the baseline
        nc = await connect(server.url)  # Hoist's client, as every Hoist process uses
        store = EventStore(nc, "BENCH", ["bench.>"])
        await store.ensure_stream()
        total = events // aggregates * aggregates
        best: dict[str, float] = {}

        def record(name: str, seconds: float, count: int) -> None:
            best[name] = max(best.get(name, 0.0), count / seconds)

        for r in range(rounds):
            # Fresh subjects every round so each starts from empty aggregates.
            raw, via = f"bench.raw{r}", f"bench.store{r}"
            record(
                "append raw",
                await timed(lambda p=raw: append_raw(raw_nc, p, events, aggregates)),
                total,
            )
            record(
                "append store",
                await timed(lambda p=via: append_store(store, p, events, aggregates)),
                total,
            )
            for prefix in (raw, via):  # replay and load both, each side reading the same data
                n_raw = 0
                n_store = 0

                async def do_raw(p: str = prefix) -> None:
                    nonlocal n_raw
                    n_raw = await raw_ordered_read(raw_nc, "BENCH", f"{p}.>")

                async def do_store(p: str = prefix) -> None:
                    nonlocal n_store
                    n_store = await replay_store(store, p)

                record("replay raw", await timed(do_raw), total)
                record("replay store", await timed(do_store), total)
                assert n_raw == n_store == total, (n_raw, n_store, total)
                record(
                    "load raw",
                    await timed(lambda p=prefix: load_raw(raw_nc, "BENCH", p, aggregates)),
                    total,
                )
                record(
                    "load store",
                    await timed(lambda p=prefix: load_store(store, p, aggregates)),
                    total,
                )
        await nc.close()
        await raw_nc.close()

    print(f"{total} events over {aggregates} aggregates, best of {rounds} rounds (events/s)")
    print(f"{'':8} {'raw nats-py':>12} {'EventStore':>12} {'ratio':>7}")
    ok = True
    for what in ("append", "replay", "load"):
        raw_rate, store_rate = best[f"{what} raw"], best[f"{what} store"]
        ratio = store_rate / raw_rate
        ok &= ratio >= 0.9
        print(f"{what:8} {raw_rate:12,.0f} {store_rate:12,.0f} {ratio:7.2f}")
    print("target ratio >= 0.9:", "met" if ok else "NOT met")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--aggregates", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.aggregates, args.rounds))
