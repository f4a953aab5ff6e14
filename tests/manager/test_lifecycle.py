"""Sessions driven from create to RUNNING and back, with in-process dummy agents."""

from __future__ import annotations

from nats.aio.client import Client

from services.eventstore.store import EventStore
from tests.manager.harness import agents, create, manager, until


async def test_a_session_whose_image_is_present_runs(nc: Client, store: EventStore) -> None:
    async with agents(nc, store, ["a1"]), manager(nc):
        created = await create(nc, max_wait=5)
        assert created["status"] == "RUNNING", created
        [kernel] = created["kernels"]
        assert kernel["agent_id"] == "a1" and kernel["container_id"]
