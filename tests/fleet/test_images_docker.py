"""Images as a fleet on a real Docker Engine and registry (tests/infra): a preload job with
progress, unload refused while a container uses the image, image GC's LRU order and what it
never removes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import docker
import pytest

from agent.gc import GcPolicy
from agent.runtime.base import LABEL_AGENT
from agent.runtime.docker import DockerRuntime
from domain import events as ev
from domain import rpc
from domain.subjects import JOB, PRELOAD, SESSION_DESTROY, UNLOAD
from eventstore.store import EventStore
from tests.agent.agent_harness import agent_events, call, config, event_of, running
from tests.fleet.fleet_harness import admin, pull, run_kernel
from tests.infra.images import remove_all_local, remove_local
from tests.infra.proxy import RegistryProxy
from tests.manager.harness import GB, MB, create, manager, until
from transport.client import Client


@pytest.fixture
def agent_id() -> str:
    return f"i{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def cleanup(docker_engine: str, agent_id: str) -> AsyncIterator[None]:
    yield
    client = docker.DockerClient(base_url=docker_engine, version="1.41")
    for c in client.containers.list(all=True, filters={"label": f"{LABEL_AGENT}={agent_id}"}):
        c.remove(force=True)
    client.close()


class UnmeasuredDockerRuntime(DockerRuntime):
    """An engine whose filesystem this host cannot measure (as a remote one)."""

    async def filesystem(self) -> None:
        return None


def docker_agent(agent_id: str, **overrides: object) -> object:
    values: dict[str, object] = {
        "runtime": "docker",
        "cpu": 2,
        "mem": 2 * GB,
        "disk": 100 * GB,
        "resource_group": "default",
        "gc": GcPolicy(lease_s=0, interval_s=3600),
    }
    return config(agent_id, **{**values, **overrides})


async def test_a_preload_job_on_docker_reports_progress_and_pins_the_image(
    nc: Client,
    store: EventStore,
    docker_engine: str,
    slow_proxy: RegistryProxy,
    big_image: str,
    agent_id: str,
    cleanup: None,
) -> None:
    image = f"{slow_proxy.host}/hoist/big:1"  # 20 MB/s: a few seconds of progress
    remove_local(docker_engine, image)
    runtime = DockerRuntime(agent_id, base_url=docker_engine)
    async with running(nc, store, runtime, docker_agent(agent_id)) as agent, manager(nc):  # type: ignore[arg-type]
        job = await admin(nc, PRELOAD, {"images": [image], "agents": [agent_id]})
        samples = []
        while job["state"] == "running":
            await asyncio.sleep(0.1)
            job = await admin(nc, JOB, {"job_id": job["job_id"]})
            samples.append(job["agents"][agent_id]["images"][image]["current"])
        result = job["agents"][agent_id]
        assert result["state"] == "succeeded", result
        pulled = result["images"][image]
        assert pulled["state"] == "pulled" and pulled["current"] == pulled["total"] >= 60 * MB
        assert samples == sorted(samples) and len({s for s in samples if s}) >= 3, samples
        assert job["overall"]["succeeded"] == 1 and job["overall"]["current"] == pulled["total"]
        marked = await event_of(store, agent_id, ev.ImagePreloaded, image=image)
        assert marked.pinned and marked.reason == f"preload: job {job['job_id']}"
        assert image in agent.image_gc.preloaded and await runtime.has_image(image) is not None


async def test_unload_is_refused_for_an_image_a_container_uses(
    nc: Client,
    store: EventStore,
    docker_engine: str,
    small_image: str,
    agent_id: str,
    cleanup: None,
) -> None:
    remove_local(docker_engine, small_image)
    runtime = DockerRuntime(agent_id, base_url=docker_engine)
    async with running(nc, store, runtime, docker_agent(agent_id)), manager(nc):  # type: ignore[arg-type]
        created = await create(
            nc, image=small_image, resources={"cpu": 0.5, "mem": 64 * MB}, max_wait=60
        )
        assert created["status"] == "RUNNING", created
        [kernel] = created["kernels"]
        target = {"images": [small_image], "agents": [agent_id]}
        reply = await admin(nc, UNLOAD, target)
        assert reply["agents"][agent_id][small_image] == {
            "removed": False,
            "reason": f"in-use: kernel {kernel['kernel_id']} RUNNING",
        }
        # The agent refuses on its own too (the manager's view could lag).
        direct = await call(nc, agent_id, rpc.UNLOAD, {"images": [small_image]})
        assert direct[small_image] == {
            "removed": False,
            "reason": f"in-use: kernels {kernel['kernel_id']}",
        }
        assert await runtime.has_image(small_image) is not None
        await admin(nc, SESSION_DESTROY, {"session_id": created["session_id"]})
        await until(nc, created["session_id"], lambda s: s["status"] == "TERMINATED", 30)
        reply = await admin(nc, UNLOAD, target)
        assert reply["agents"][agent_id][small_image] == {"removed": True}
        assert await runtime.has_image(small_image) is None


async def test_image_gc_removes_least_recently_used_first_and_never_what_is_needed(
    nc: Client,
    store: EventStore,
    docker_engine: str,
    small_image: str,
    big_image: str,
    stall_image: str,
    agent_id: str,
    cleanup: None,
) -> None:
    oldest, older, used = stall_image, small_image, big_image
    remove_all_local(docker_engine)  # only these three take part
    # GC counts the images against --disk here (test_gc_disk_docker fills a real filesystem).
    runtime = UnmeasuredDockerRuntime(agent_id, base_url=docker_engine)
    async with running(nc, store, runtime, docker_agent(agent_id)) as agent:  # type: ignore[arg-type]
        for image in (oldest, older, used):  # pulled in this order: "oldest" used least recently
            await pull(nc, agent, image)
            assert await runtime.has_image(image) is not None
        await run_kernel(nc, agent, "gc-k1", used)
        sizes = {i.image: i.size_bytes for i in await runtime.list_images()}
        total = sum(sizes.values())
        # A disk on which the images are above 85 %, and removing "oldest" alone does not get
        # them to 80 % but removing "older" as well does.
        disk = int((total - sizes[oldest] - sizes[older] // 2) / 0.8)
        assert total > 0.85 * disk, "other images on the engine make this test meaningless"
        agent.capacity = ev.Capacity(cpu=agent.capacity.cpu, mem=agent.capacity.mem, disk=disk)  # type: ignore[union-attr]

        report = await call(nc, agent_id, rpc.IMAGE_GC, {})
        assert [r["image"] for r in report["removed"]] == [oldest, older]
        pct = round(total / disk * 100)
        for r in report["removed"]:
            assert r["reason"].startswith(f"gc: --disk {pct}% used (")
            assert "> 85%, least recently used (last used" in r["reason"]
        assert report["kept"][used] == "in-use: kernel gc-k1"
        assert report["used_after"] <= 0.8 * disk and report["note"] == ""
        removed = [e for e in await agent_events(store, agent_id) if type(e) is ev.ImageRemoved]
        assert [(e.image, e.reason) for e in removed] == [
            (r["image"], r["reason"]) for r in report["removed"]
        ]
        assert await runtime.has_image(oldest) is None and await runtime.has_image(used)

        # Never removed: pinned by a preload job, about to be used, wanted by a policy.
        await pull(nc, agent, oldest)
        await pull(nc, agent, older)
        await call(nc, agent_id, rpc.PRELOAD, {"images": [older]})
        await call(nc, agent_id, rpc.PIN_IMAGES, {"expected": [oldest]})
        report = await call(nc, agent_id, rpc.IMAGE_GC, {})
        assert report["removed"] == []
        assert {i: report["kept"][i] for i in (oldest, older, used)} == {
            oldest: "about-to-use: a kernel scheduled on this agent needs it",
            older: "pinned: preloaded",
            used: "in-use: kernel gc-k1",
        }
        assert report["note"].startswith("--disk stays at") and report["measured"] == "--disk"
        await call(nc, agent_id, rpc.PIN_IMAGES, {"expected": [], "policy": [oldest]})
        report = await call(nc, agent_id, rpc.IMAGE_GC, {})
        assert report["removed"] == []
        assert report["kept"][oldest] == "pinned: a prepull policy wants it"
        await call(nc, agent_id, rpc.PIN_IMAGES, {"policy": []})
        report = await call(nc, agent_id, rpc.IMAGE_GC, {})
        assert [r["image"] for r in report["removed"]] == [oldest]  # the pins were the reason
        await call(nc, agent_id, rpc.DESTROY_KERNEL, {"kernel_id": "gc-k1"})
