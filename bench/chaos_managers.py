"""Several managers under chaos: the failover time, and no double-booking over a long run.

Real processes on one embedded nats-server: ``--agents`` dummy agents (bench/lifecycle.py's
agents role, 1000 cpu each) and two managers
(``python -m services.manager --lease-ttl TTL``).  ``bench/lifecycle.py --nats-nodes 3
--managers 2`` measures the same failover on a three-node cluster.

1. Failover (``--kills`` times): a client creates a session every 20 ms (``max_wait``, so
   each reply comes when it is RUNNING); the leading manager is SIGKILLed, and the killed one
   restarted once the other leads.  Failover = from the lease's lapse (its message gone from
   the stream, or another manager's in its place) to the first RUNNING reply after it; also
   kill -> lapse (the rest of the TTL).  Median and worst over the kills.
2. Flips (``--flip-seconds``): both managers step down after 0.3 s of leading (a test knob), so
   leadership flips every few hundred milliseconds, while sessions of 100 cpu (ten fit an
   agent) are created and destroyed;
   afterwards every agent's reservations are folded from the log, event by event: over
   capacity anywhere is a failure.

    python bench/chaos_managers.py [--agents 4] [--ttl 2] [--kills 10] [--flip-seconds 60]
        [--no-fence]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from domain.admission import lease_holder
from domain.subjects import SESSION_CREATE, SESSION_DESTROY, manager_lease
from eventstore.store import EventStore, event_store
from tests.manager.booking_check import overbooked
from transport.client import Client, connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import fleet, manager  # the same child processes as the lifecycle bench

IMAGE = "bench/base:1"  # what lifecycle.py's dummy agents hold


async def _now(values: list[float]) -> list[float]:
    return values


async def poll(read: Any, done: Any) -> Any:
    """``await read()`` every 10 ms until ``done(value)``; the value."""
    while not done(value := await read()):  # noqa: ASYNC110 - the value is read, not waited
        await asyncio.sleep(0.01)
    return value


async def leader(store: EventStore) -> str | None:
    # As the managers read it: the lease expires, so a read below an earlier one is no lag.
    last = await store.last(manager_lease(), urgent=True, expiring=True)
    return None if last is None else lease_holder(last.subject, last.headers, last.data)


async def create(
    nc: Client, n: int, tag: str, wait: float = 20, cpu: float = 0.25
) -> tuple[float, dict]:
    payload = {
        "owner": f"user-{n % 7}",
        "image": IMAGE,
        "resources": {"cpu": cpu, "mem": 64 * 1024 * 1024},
        "max_wait": wait,
        "request_id": f"{tag}-{n}",
    }
    while True:
        try:
            msg = await nc.request(SESSION_CREATE, json.dumps(payload).encode(), wait + 5)
            return time.monotonic(), json.loads(msg.data)
        except Exception:  # no manager answers for a moment: the client retries, same id
            await asyncio.sleep(0.05)


async def failover(
    url: str, nc: Client, log: Path, kills: int, ttl: float, managers: int = 2
) -> None:
    """``managers`` managers on the server(s) at ``url`` (agents running there), the leader
    SIGKILLed ``kills`` times under load; prints each kill and the median and worst."""
    store = event_store(nc)
    procs = {m: await manager(url, m, log, ttl=ttl) for m in (f"m{i + 1}" for i in range(managers))}
    running_at: list[float] = []
    counter = 0
    stop = asyncio.Event()

    async def client() -> None:
        nonlocal counter
        tasks = set()
        while not stop.is_set():
            counter += 1

            async def one(n: int) -> None:
                at, reply = await create(nc, n, "fo")
                if reply.get("status") == "RUNNING":
                    running_at.append(at)

            task = asyncio.ensure_future(one(counter))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(0.02)
        await asyncio.gather(*tasks, return_exceptions=True)

    load = asyncio.ensure_future(client())
    lapse_s, failover_s = [], []
    try:
        await asyncio.sleep(2)
        for _ in range(kills):
            killed = await leader(store)
            assert killed in procs, killed
            procs[killed].send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            await procs[killed].wait()
            holder = await poll(lambda: leader(store), lambda h, k=killed: h != k)
            lapsed_at = time.monotonic()
            await poll(lambda: _now(running_at), lambda ts, at=lapsed_at: any(t > at for t in ts))
            first = min(t for t in running_at if t > lapsed_at)
            lapse_s.append(lapsed_at - killed_at)
            failover_s.append(first - lapsed_at)
            print(
                f"  killed {killed}: lease lapsed after {lapse_s[-1]:.2f} s, then"
                f" {holder or 'nobody yet'}; first RUNNING {failover_s[-1] * 1000:.0f} ms later",
                flush=True,
            )
            procs[killed] = await manager(url, killed, log, ttl=ttl)
            await asyncio.sleep(1)
    finally:
        stop.set()
        await load
        for proc in procs.values():
            proc.kill()
            await proc.wait()
    worst = max(a + b for a, b in zip(lapse_s, failover_s, strict=True))
    print(
        f"failover over {kills} SIGKILLs of the leader (lease TTL {ttl:g} s):"
        f" lease lapse -> first RUNNING median {statistics.median(failover_s) * 1000:.0f} ms,"
        f" worst {max(failover_s) * 1000:.0f} ms; kill -> lapse median"
        f" {statistics.median(lapse_s):.2f} s, worst {max(lapse_s):.2f} s"
        f" (kill -> RUNNING worst {worst:.2f} s, ratio to TTL + 1 s: {worst / (ttl + 1):.2f})"
    )


async def flips(args: argparse.Namespace, url: str, nc: Client, log: Path) -> None:
    extra = ["--step-down-after", "0.3", *(["--no-fence"] if args.no_fence else [])]
    procs = [await manager(url, m, log, *extra, ttl=1.0) for m in ("f1", "f2")]
    rng = random.Random(3)
    sids: list[str] = []
    try:
        end = time.monotonic() + args.flip_seconds
        while time.monotonic() < end:
            # 100 of an agent's 1000 cpu: ten fit, so the room binds and is fought over
            _, reply = await create(nc, len(sids), "flip", wait=0, cpu=100)
            sids.append(reply["session_id"])
            if len(sids) > 40 and rng.random() < 0.5:
                victim = rng.choice(sids[:-40])
                await nc.request(SESSION_DESTROY, json.dumps({"session_id": victim}).encode(), 10)
            await asyncio.sleep(0.01)
    finally:
        for proc in procs:
            proc.kill()
            await proc.wait()
    text = await asyncio.to_thread(log.read_text)
    led = [line for line in text.splitlines() if " leads (lease at " in line]
    problems, counts = await overbooked(event_store(nc))
    how = "no fence: the OCC alone" if args.no_fence else "fenced"
    print(
        f"flips for {args.flip_seconds:g} s ({how}):"
        f" {len(led)} takeovers, {len(sids)} creates, {counts['reserved']} reservations,"
        f" {counts['released']} releases; over capacity: {len(problems)}"
        + (f", first {problems[0]}" if problems else " (none)")
    )


async def main(args: argparse.Namespace) -> None:
    tracebacks = 0
    for phase in ("failover", "flips"):
        if (phase == "failover" and not args.kills) or (phase == "flips" and not args.flip_seconds):
            continue
        async with fleet(1, False, args.agents) as stack:
            nc = await connect(stack.url, name="bench-chaos")
            try:
                if phase == "failover":
                    await failover(stack.url, nc, stack.log, args.kills, args.ttl)
                else:
                    await flips(args, stack.url, nc, stack.log)
            finally:
                await nc.close()
        tracebacks += len(stack.lines("Traceback"))
    if tracebacks:
        print(f"{tracebacks} tracebacks in the process logs")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--ttl", type=float, default=2.0, help="the managers' lease TTL (seconds)")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--flip-seconds", type=float, default=60)
    p.add_argument("--no-fence", action="store_true", help="flips with the OCC alone")
    return p


if __name__ == "__main__":
    asyncio.run(main(parser().parse_args()))
