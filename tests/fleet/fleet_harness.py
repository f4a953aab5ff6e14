"""Helpers for the fleet tests: dummy agents with their own disks and slower heartbeats (100 fit
in one process), admin requests, and reading events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from agent.gc import GcPolicy
from agent.pulls import PullPolicy
from agent.server import AgentServer
from domain import rpc
from eventstore.store import EventStore
from tests.agent.agent_harness import call, config, running, wait_for
from tests.manager.harness import GB, MB, dummy, request
from transport.client import Client


@asynccontextmanager
async def fleet(
    nc: Client,
    store: EventStore,
    disks: dict[str, int],
    *,
    cpu: float = 4,
    resource_group: str = "default",
    heartbeat_s: float = 0.2,
    gc: GcPolicy | None = None,
    **dummy_cfg: Any,
) -> AsyncIterator[dict[str, AgentServer]]:
    """Dummy agents, one per ``disks`` entry (agent id -> disk bytes)."""
    async with AsyncExitStack() as stack:
        out = {}
        for agent_id, disk in disks.items():
            cfg = config(
                agent_id,
                cpu=cpu,
                mem=8 * GB,
                disk=disk,
                resource_group=resource_group,
                heartbeat_interval_s=heartbeat_s,
                pulls=PullPolicy(backoff_s=0.05, stall_timeout_s=60, max_parallel=4),
                gc=gc or GcPolicy(interval_s=3600),
            )
            runtime = dummy(agent_id, **dummy_cfg)
            out[agent_id] = await stack.enter_async_context(running(nc, store, runtime, cfg))
        yield out


async def admin(nc: Client, subject: str, payload: Any, within: float = 30) -> Any:
    reply = await request(nc, subject, payload, within)
    assert "error" not in reply, reply
    return reply


async def pull(nc: Client, agent: AgentServer, image: str) -> None:
    """Check-and-pull ``image`` on ``agent`` and wait until it is held (its GC knows it)."""
    await call(nc, agent.id, rpc.CHECK_AND_PULL, {"images": [image]}, within=60)
    await wait_for(lambda: image in agent.image_gc.last_used, 60, f"{image} pulled")


async def run_kernel(nc: Client, agent: AgentServer, kernel_id: str, image: str) -> None:
    """A kernel of ``image`` (half a core, 64 MB) on ``agent``, its container created."""
    created = await call(
        nc,
        agent.id,
        rpc.CREATE_KERNEL,
        {"kernel_id": kernel_id, "session_id": "s1", "image": image,
         "resources": {"cpu": 0.5, "mem": 64 * MB}},
    )  # fmt: skip
    assert "container_id" in created, created
