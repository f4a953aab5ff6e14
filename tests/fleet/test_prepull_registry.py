"""Prepull of an image no agent has held, with the real registry and Docker Engine: the plan
takes its size from the registry's manifest (not skipped as "size unknown"), the agent pulls
it, and a second push of the same tag is pulled again at a later round (the manifest digest
the tag names changed)."""

from __future__ import annotations

import uuid

from agent.gc import GcPolicy
from agent.runtime.docker import DockerRuntime
from domain import events as ev
from domain.image_ref import canonical
from domain.subjects import POLICY_SET
from eventstore.store import EventStore
from services.manager.registry import RegistryClient
from tests.agent.agent_harness import config, event_of, running
from tests.fleet.fleet_harness import admin
from tests.infra.images import build_image, remove_local
from tests.infra.registry import Registry
from tests.manager.harness import GB, manager
from transport.client import Client


async def test_a_tag_no_agent_held_is_prepulled_and_pulled_again_after_a_push(
    nc: Client, store: EventStore, docker_engine: str, registry: Registry
) -> None:
    name = f"hoist/moving{uuid.uuid4().hex[:6]}"
    ref = build_image(registry, name, "latest", pad_mb=2, busybox=False)
    first = await RegistryClient().resolve(ref)
    agent_id = f"p{uuid.uuid4().hex[:8]}"
    runtime = DockerRuntime(agent_id, base_url=docker_engine)
    cfg = config(
        agent_id,
        runtime="docker",
        cpu=2,
        mem=2 * GB,
        disk=100 * GB,
        resource_group="default",
        gc=GcPolicy(lease_s=0, interval_s=3600),
    )
    try:
        async with (
            running(nc, store, runtime, cfg),  # type: ignore[arg-type]
            manager(nc, prepull_registry=True, prepull_interval_s=0.5),
        ):
            rule = {"kind": "images", "images": [ref]}
            reply = await admin(nc, POLICY_SET, {"name": "moving", "rules": [rule]})
            plan = reply["plans"][agent_id]
            assert plan["skipped"] == [], plan
            [wanted] = plan["desired"]
            assert wanted["image"] == canonical(ref) and wanted["size_bytes"] == first.size_bytes
            assert plan["to_pull"] == [canonical(ref)] and plan["refresh"] == {}
            pulled = await event_of(store, agent_id, ev.ImagePulled, image=ref, within=60)
            assert pulled.digest == first.digest

            build_image(registry, name, "latest", pad_mb=2, busybox=False)  # a new push
            second = await RegistryClient().resolve(ref)
            assert second.digest != first.digest
            again = await event_of(
                store, agent_id, ev.ImagePulled, image=ref, digest=second.digest, within=60
            )
            assert again.task_id != pulled.task_id
            held = await runtime.has_image(ref)
            assert held is not None and held.digest == second.digest
    finally:
        remove_local(docker_engine, ref)
