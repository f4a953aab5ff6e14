"""The manager killed with SIGKILL at random moments while sessions are in flight: restarted,
it replays the log and every session still reaches RUNNING, each kernel with one container."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from agent.runtime.dummy import DummyConfig, DummyRuntime
from domain import events as ev
from domain.codec import decode
from domain.subjects import SESSION_CREATE, SESSION_GET
from eventstore.store import EventStore
from services.stack.natsserver import NatsServer
from tests.agent.agent_harness import config, running, wait_for
from tests.manager.harness import GB, MB, create_payload, request
from transport.client import Client

SESSIONS = 60
KILLS = 6


class CountingRuntime(DummyRuntime):
    """Records every container it really made, per kernel."""

    def __init__(self, agent_id: str, cfg: DummyConfig) -> None:
        super().__init__(agent_id, cfg)
        self.made: defaultdict[str, list[str]] = defaultdict(list)

    async def create(
        self,
        kernel_id: str,
        session_id: str,
        image: str,
        cpu: float,
        mem_bytes: int,
        command: Sequence[str] | None = None,
    ) -> str:
        container_id = await super().create(kernel_id, session_id, image, cpu, mem_bytes, command)
        self.made[kernel_id].append(container_id)
        return container_id


async def start_manager(url: str, log: Path) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.manager", "--nats-url", url,
        "--pull-check-interval", "0.3", "--log-level", "WARNING",
        stdout=asyncio.subprocess.PIPE, stderr=log.open("ab"),
    )  # fmt: skip
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.strip() == b"manager ready", (line, tail(log))
    return proc


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-2000:]


async def create_until_answered(
    nc: Client, payload: dict[str, Any], log: Path | None = None, within_s: float = 60
) -> dict[str, Any]:
    """A client retrying with the same request_id while the manager is down; a create no
    manager answers in ``within_s`` fails the test with the managers' ``log``, not its
    timeout."""
    end = time.monotonic() + within_s
    while True:
        try:
            reply = await request(nc, SESSION_CREATE, payload, within=1)
        except (NatsTimeoutError, NoRespondersError) as e:
            if time.monotonic() > end:
                seen = "" if log is None else tail(log)
                raise AssertionError(f"create unanswered {within_s} s ({e!r}); {seen}") from None
            await asyncio.sleep(0.05)
            continue
        assert "error" not in reply, reply
        return reply  # type: ignore[no-any-return]


async def create_all(
    nc: Client,
    payloads: list[dict[str, Any]],
    rng: random.Random,
    pause_s: float,
    log: Path | None = None,
) -> list[dict[str, Any]]:
    """A client creating sessions one after the other, a random pause up to ``pause_s``
    between them, each retried until answered."""
    out = []
    for p in payloads:
        out.append(await create_until_answered(nc, p, log))
        await asyncio.sleep(rng.uniform(0, pause_s))
    return out


async def test_sigkill_at_random_moments_converges(
    nats_server: NatsServer, nc: Client, store: EventStore, tmp_path: Path
) -> None:
    rng = random.Random(7)
    cfg = DummyConfig(
        default_size=20 * MB, bandwidth_bps=100 * MB, tick_s=0.02, create_delay_s=0.05,
        preloaded={"base:1"},
    )  # fmt: skip
    runtimes = {f"a{i}": CountingRuntime(f"a{i}", cfg) for i in range(4)}
    log = tmp_path / "manager.log"
    async with running(
        nc, store, runtimes["a0"], config("a0", cpu=64, mem=256 * GB, resource_group="default")
    ), running(
        nc, store, runtimes["a1"], config("a1", cpu=64, mem=256 * GB, resource_group="default")
    ), running(
        nc, store, runtimes["a2"], config("a2", cpu=64, mem=256 * GB, resource_group="default")
    ), running(
        nc, store, runtimes["a3"], config("a3", cpu=64, mem=256 * GB, resource_group="default")
    ):  # fmt: skip
        proc = await start_manager(nats_server.url, log)
        payloads = [
            create_payload(
                request_id=f"r{i}",
                image=rng.choice(["base:1", "py:3", "r:4", "go:1"]),
                cluster_size=rng.choice([1, 1, 2, 3]),
            )
            for i in range(SESSIONS)
        ]

        creating = asyncio.create_task(create_all(nc, payloads, rng, 0.03, log))
        try:
            for _ in range(KILLS):
                await asyncio.sleep(rng.uniform(0.05, 0.5))
                proc.kill()  # SIGKILL: no cleanup of any kind
                await proc.wait()
                proc = await start_manager(nats_server.url, log)
            created = await creating
            sids = [c["session_id"] for c in created]
            assert len(set(sids)) == SESSIONS

            async def all_settled() -> bool:
                for sid in sids:
                    s = await request(nc, SESSION_GET, {"session_id": sid})
                    if s["status"] != "RUNNING":
                        return False
                return True

            await wait_for(all_settled, 30, "every session RUNNING")
        finally:
            proc.kill()
            await proc.wait()

    assert "Traceback" not in tail(log), tail(log)
    # One container per kernel, and it is the one the log says.
    made = {k: v for rt in runtimes.values() for k, v in rt.made.items()}
    assert all(len(v) == 1 for v in made.values()), {k: v for k, v in made.items() if len(v) > 1}
    created_events: defaultdict[str, list[str]] = defaultdict(list)
    async for rec in store.replay():
        event = decode(rec.data, rec.headers)
        if isinstance(event, ev.KernelCreated):
            created_events[event.kernel_id].append(event.container_id)
    kernels = sum(p["cluster_size"] for p in payloads)
    assert len(created_events) == kernels == len(made)
    assert all(len(v) == 1 and v == made[k] for k, v in created_events.items())
