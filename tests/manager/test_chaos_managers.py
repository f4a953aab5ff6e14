"""Chaos with several managers (real processes, SIGKILL): the leader killed again and again
under load, and leadership flipping every few hundred milliseconds, never book an agent over
its capacity (the log's reservations folded, event by event) nor give a kernel two
containers; a standby takes over within the lease TTL plus a second."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.runtime.dummy import DummyConfig
from domain.admission import lease_holder
from domain.subjects import SESSION_DESTROY, SESSION_GET, manager_lease
from eventstore.store import EventStore
from services.stack.natsserver import NatsServer
from tests.agent.agent_harness import config, running, wait_for
from tests.manager.booking_check import overbooked
from tests.manager.harness import GB, MB, create_payload, request
from tests.manager.test_restart import (
    CountingRuntime,
    create_all,
    create_until_answered,
    tail,
)
from transport.client import Client

TTL = 1.0  # the least per-message TTL nats-server takes


async def start_manager(url: str, manager_id: str, log: Path, *extra: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.manager", "--nats-url", url,
        "--manager-id", manager_id, "--lease-ttl", str(TTL), "--pull-check-interval", "0.3",
        "--no-bulk-read", "--log-level", "WARNING", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=log.open("ab"),
    )  # fmt: skip
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.strip() == b"manager ready", (line, tail(log))
    return proc


async def leader(store: EventStore) -> str | None:
    last = await store.last(manager_lease())
    return None if last is None else lease_holder(last.subject, last.headers, last.data)


async def settled_counts(nc: Client, sids: list[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for sid in sids:
        out[(await request(nc, SESSION_GET, {"session_id": sid}))["status"]] += 1
    return out


@asynccontextmanager
async def serving(
    nc: Client, store: EventStore, runtimes: dict[str, CountingRuntime], cpu: float
) -> AsyncIterator[None]:
    """The runtimes' agents, each of ``cpu`` cores, serving in this process."""
    async with AsyncExitStack() as stack:
        for agent_id, runtime in runtimes.items():
            cfg = config(agent_id, cpu=cpu, mem=256 * GB, resource_group="default")
            await stack.enter_async_context(running(nc, store, runtime, cfg))
        yield


def tail_all(path: Path) -> str:
    return path.read_text(errors="replace")


def one_container_each(runtimes: dict[str, CountingRuntime]) -> dict[str, list[str]]:
    made = {k: v for rt in runtimes.values() for k, v in rt.made.items()}
    return {k: v for k, v in made.items() if len(v) > 1}


async def test_sigkill_the_leader_repeatedly_under_load(
    nats_server: NatsServer, nc: Client, store: EventStore, tmp_path: Path
) -> None:
    """200 sessions of 0.25 cpu on 4 agents of 10 cpu (room for 160) while the leading
    manager is SIGKILLed five times: each time the standby leads within TTL + 1 s; in the end
    160 run, 40 wait, the log never over-books an agent, one container per kernel."""
    rng = random.Random(17)
    cfg = DummyConfig(default_size=8 * MB, bandwidth_bps=None, tick_s=0.02, preloaded={"base:1"})
    runtimes = {f"a{i}": CountingRuntime(f"a{i}", cfg) for i in range(4)}
    log = tmp_path / "managers.log"
    async with serving(nc, store, runtimes, cpu=10):
        procs = {m: await start_manager(nats_server.url, m, log) for m in ("m1", "m2")}
        payloads = [
            create_payload(request_id=f"r{i}", resources={"cpu": 0.25, "mem": 64 * MB})
            for i in range(200)
        ]

        creating = asyncio.create_task(create_all(nc, payloads, rng, 0.01, log))
        takeovers = []
        # The manager killed last, starting again while the load runs on (a process start
        # takes about as long as the pause between kills): the standby before the next kill.
        restarting: tuple[str, asyncio.Task[Any]] | None = None
        try:
            for _ in range(5):
                await asyncio.sleep(rng.uniform(0.2, 0.8))
                if restarting is not None:
                    procs[restarting[0]] = await restarting[1]
                    restarting = None
                killed = await leader(store)
                assert killed in procs, killed
                procs[killed].kill()  # SIGKILL: the lease stays until its TTL
                at = time.monotonic()
                await procs[killed].wait()
                other = next(m for m in procs if m != killed)

                async def other_leads(other: str = other) -> bool:
                    return await leader(store) == other

                await wait_for(other_leads, TTL + 5, f"{other} to lead")
                takeovers.append(time.monotonic() - at)
                again = start_manager(nats_server.url, killed, log)
                restarting = (killed, asyncio.create_task(again))
            assert restarting is not None
            procs[restarting[0]] = await restarting[1]
            restarting = None
            sids = [c["session_id"] for c in await creating]
            assert len(set(sids)) == 200

            counts: Counter[str] = Counter()

            async def all_placed() -> bool:
                nonlocal counts
                counts = await settled_counts(nc, sids)
                return counts == {"RUNNING": 160, "PENDING": 40}

            try:
                await wait_for(all_placed, 30, "160 sessions RUNNING, 40 PENDING")
            except AssertionError:
                raise AssertionError(f"{counts}; {tail_all(log)[-6000:]}") from None
        finally:
            if restarting is not None:  # a failure meanwhile: its process goes too
                with contextlib.suppress(Exception):
                    procs[restarting[0]] = await restarting[1]
            for proc in procs.values():
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    assert max(takeovers) < TTL + 1.0, takeovers
    assert "Traceback" not in tail(log), tail(log)
    problems, counts = await overbooked(store)
    assert problems == []
    assert counts["reserved"] >= 160, counts
    assert one_container_each(runtimes) == {}


@pytest.mark.parametrize("fencing", [True, False], ids=["fenced", "occ-alone"])
async def test_leadership_flipping_fast_never_double_books(
    nats_server: NatsServer, nc: Client, store: EventStore, tmp_path: Path, fencing: bool
) -> None:
    """Two managers that each step down after 0.3 s of leading, while sessions are created
    and destroyed on 12 slots: leadership flips every few hundred milliseconds, and neither
    the fenced batches nor (fencing off) the reservations' OCC alone ever over-book."""
    rng = random.Random(5)
    cfg = DummyConfig(default_size=8 * MB, bandwidth_bps=None, tick_s=0.02, preloaded={"base:1"})
    runtimes = {f"a{i}": CountingRuntime(f"a{i}", cfg) for i in range(3)}
    log = tmp_path / "managers.log"
    extra = ["--step-down-after", "0.3", *([] if fencing else ["--no-fence"])]
    async with serving(nc, store, runtimes, cpu=4):
        procs = [await start_manager(nats_server.url, m, log, *extra) for m in ("m1", "m2")]
        try:
            sids = []
            end = time.monotonic() + 8
            while time.monotonic() < end:
                p = create_payload(request_id=f"f{len(sids)}", resources={"cpu": 1, "mem": 64 * MB})
                sids.append((await create_until_answered(nc, p, log))["session_id"])
                if len(sids) > 12 and rng.random() < 0.5:  # churn: room freed and taken again
                    victim = rng.choice(sids[:-12])
                    await request(nc, SESSION_DESTROY, {"session_id": victim}, within=5)
                await asyncio.sleep(rng.uniform(0.01, 0.05))
        finally:
            for proc in procs:
                proc.kill()
                await proc.wait()
    # The lease messages expire: the managers' own words say who led when.
    leads = [line for line in tail_all(log).splitlines() if " leads (lease at " in line]
    holders = [line.split("manager ", 1)[1].split(" ", 1)[0] for line in leads]
    assert len(holders) >= 8 and len(set(holders)) == 2, holders  # flipped, again and again
    problems, counts = await overbooked(store)
    assert problems == []
    assert counts["reserved"] >= 12 and counts["released"] >= 5, counts
    assert one_container_each(runtimes) == {}
    assert "Traceback" not in tail(log), tail(log)
