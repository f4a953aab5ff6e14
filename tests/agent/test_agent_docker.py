"""The agent on a real Docker Engine and a real registry (tests/infra): pulls, kernels, restarts."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import docker
import pytest

from agent.pulls import PullPolicy
from agent.runtime.base import (
    LABEL_AGENT,
    LABEL_ASKED_SEQ,
    LABEL_KERNEL,
    LABEL_SESSION,
    SLEEP_FOREVER,
)
from agent.runtime.docker import DockerRuntime
from domain import events as ev
from domain import rpc
from eventstore.store import EventStore
from tests.agent.agent_harness import (
    agent_events,
    call,
    config,
    event_of,
    progress_log,
    running,
    store_fixture,  # noqa: F401 - the `store` fixture
    wait_for,
)
from tests.infra.images import remove_local
from tests.infra.proxy import RegistryProxy
from tests.infra.registry import Registry, blob_path, manifest_path
from transport import progress
from transport.client import Client

MiB = 1024 * 1024
STAY_UP = {"command": list(SLEEP_FOREVER)}  # a kernel runs its image's command unless told


@pytest.fixture
def agent_id() -> str:
    return f"d{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def client(docker_engine: str, agent_id: str) -> AsyncIterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=docker_engine, version="1.41")
    yield client
    for c in client.containers.list(all=True, filters={"label": f"{LABEL_AGENT}={agent_id}"}):
        c.remove(force=True)
    client.close()


def docker_config(agent_id: str, **pulls: float) -> object:
    return config(agent_id, runtime="docker", pulls=PullPolicy(backoff_s=0.1, **pulls))  # type: ignore[arg-type]


async def test_a_missing_image_is_pulled_once_for_20_callers_with_progress(
    nc: Client,
    store: EventStore,
    agent_id: str,
    docker_engine: str,
    registry: Registry,
    big_image: str,
    slow_proxy: RegistryProxy,
) -> None:
    image = f"{slow_proxy.host}/hoist/big:1"  # 20 MB/s: a few seconds, many updates
    remove_local(docker_engine, image)
    runtime = DockerRuntime(agent_id, base_url=docker_engine)
    async with (
        running(nc, store, runtime, docker_config(agent_id)),  # type: ignore[arg-type]
        progress_log(nc, agent_id) as seen,
    ):
        mark = registry.mark()
        replies = await asyncio.gather(
            *(call(nc, agent_id, rpc.CHECK_AND_PULL, {"images": [image]}) for _ in range(20))
        )
        task_ids = {r[image]["task_id"] for r in replies}
        assert len(task_ids) == 1, replies
        [task_id] = task_ids
        pulled = await event_of(store, agent_id, ev.ImagePulled, within=120, task_id=task_id)
        assert pulled.image == image and pulled.digest.startswith("sha256:")
        assert pulled.size_bytes >= 60 * MiB and pulled.duration_s > 0
        status = await call(nc, agent_id, rpc.PULL_STATUS, {"task_id": task_id})
        assert status["state"] == "done" and status["current"] == status["total"]
        again = await call(nc, agent_id, rpc.CHECK_AND_PULL, {"images": [image]})
        assert again[image] == {"present": True, "digest": pulled.digest, "size": pulled.size_bytes}

    # Exactly one pull reached the registry: one manifest fetch, every blob fetched once.
    counts = registry.counts(mark)
    assert registry.count("GET", manifest_path("hoist/big"), mark) == 1, counts
    blobs = Counter(r.path for r in registry.requests(mark) if r.method == "GET")
    blobs = Counter({p: n for p, n in blobs.items() if re.fullmatch(blob_path("hoist/big"), p)})
    assert len(blobs) >= 4 and set(blobs.values()) == {1}, counts

    ours = seen.of(task_id)
    assert len(ours) >= 5, "a 60 MB pull at 20 MB/s reports progress several times"
    currents = [p.current for p in ours]
    assert currents == sorted(currents), currents
    last = ours[-1]
    assert last.done and last.error is None and last.current == last.total >= 60 * MiB
    late = await progress.latest(nc.jetstream(), agent_id, task_id)
    assert late == last
    kinds = [type(e) for e in await agent_events(store, agent_id)]
    assert kinds == [ev.AgentRegistered, ev.ImagePullStarted, ev.ImagePulled]


async def test_create_sync_destroy_real_containers(
    nc: Client,
    store: EventStore,
    agent_id: str,
    docker_engine: str,
    small_image: str,
    client: docker.DockerClient,
) -> None:
    runtime = DockerRuntime(agent_id, base_url=docker_engine)
    async with running(nc, store, runtime, docker_config(agent_id)):  # type: ignore[arg-type]
        reply = await call(nc, agent_id, rpc.CHECK_AND_PULL, {"images": [small_image]})
        if "task_id" in reply[small_image]:
            await event_of(store, agent_id, ev.ImagePulled, within=60, image=small_image)
        kernel = {"session_id": "s1", "image": small_image, "spec": STAY_UP}
        limits = {"cpu": 0.5, "mem": 64 * MiB}
        created = await call(
            nc, agent_id, rpc.CREATE_KERNEL, {"kernel_id": "k1", **kernel, "resources": limits}
        )
        again = await call(
            nc, agent_id, rpc.CREATE_KERNEL, {"kernel_id": "k1", **kernel, "resources": limits}
        )
        assert again == {"container_id": created["container_id"], "existed": True}
        container = client.containers.get(created["container_id"])
        assert container.status == "running"
        assert container.attrs["HostConfig"]["NanoCpus"] == 500_000_000
        assert container.attrs["HostConfig"]["Memory"] == 64 * MiB
        labels = container.labels
        assert (labels[LABEL_KERNEL], labels[LABEL_SESSION], labels[LABEL_AGENT]) == (
            "k1",
            "s1",
            agent_id,
        )

        stray = await call(
            nc, agent_id, rpc.CREATE_KERNEL, {"kernel_id": "k-stray", **kernel, "resources": limits}
        )
        synced = await call(nc, agent_id, rpc.SYNC_KERNELS, {"running": ["k1", "k-gone"]})
        assert synced == {
            "running": ["k1"],
            "terminating": [],
            "terminated": ["k-gone"],
            "destroyed": ["k-stray"],
        }
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(stray["container_id"])

        destroyed = await call(nc, agent_id, rpc.DESTROY_KERNEL, {"kernel_id": "k1"})
        assert destroyed == {"destroyed": True}
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(created["container_id"])


async def test_a_restarted_agent_reports_its_containers_and_images(
    nc: Client,
    store: EventStore,
    agent_id: str,
    docker_engine: str,
    small_image: str,
    client: docker.DockerClient,
) -> None:
    cfg = docker_config(agent_id)
    kernel = {
        "session_id": "s1",
        "image": small_image,
        "resources": {"cpu": 0.2, "mem": 32 * MiB},
        "spec": STAY_UP,
    }
    async with running(nc, store, DockerRuntime(agent_id, base_url=docker_engine), cfg):  # type: ignore[arg-type]
        reply = await call(nc, agent_id, rpc.CHECK_AND_PULL, {"images": [small_image]})
        if "task_id" in reply[small_image]:
            await event_of(store, agent_id, ev.ImagePulled, within=60, image=small_image)
        created = await call(nc, agent_id, rpc.CREATE_KERNEL, {"kernel_id": "k1", **kernel})
        # Asked from stream sequence 12 (another manager's create, say): labelled with it.
        fresh = await call(
            nc, agent_id, rpc.CREATE_KERNEL, {"kernel_id": "k2", **kernel, "seq": 12}
        )
    labels = client.containers.get(fresh["container_id"]).labels
    assert labels[LABEL_ASKED_SEQ] == "12", labels
    # The process is gone; its containers are not.
    async with running(nc, store, DockerRuntime(agent_id, base_url=docker_engine), cfg) as agent:  # type: ignore[arg-type]
        rereg = (await agent_events(store, agent_id))[-1]
        assert isinstance(rereg, ev.AgentReregistered)
        assert small_image in rereg.images
        beat = await agent.send_heartbeat()
        assert sorted((k.kernel_id, k.container_id, k.status) for k in beat.kernels) == [
            ("k1", created["container_id"], "running"),
            ("k2", fresh["container_id"], "running"),
        ]
        # A view that has not folded sequence 12 yet: k2 is spared across the restart.
        synced = await call(nc, agent_id, rpc.SYNC_KERNELS, {"running": ["k1"], "view_seq": 10})
        assert (synced["running"], synced["spared"]) == (["k1"], ["k2"]), synced
        assert client.containers.get(created["container_id"]).status == "running"
        assert client.containers.get(fresh["container_id"]).status == "running"
        passed = await call(nc, agent_id, rpc.SYNC_KERNELS, {"running": ["k1"], "view_seq": 12})
        assert passed["destroyed"] == ["k2"], passed


async def test_a_stalled_docker_pull_fails_with_the_stall_reason(
    nc: Client,
    store: EventStore,
    agent_id: str,
    docker_engine: str,
    stall_image: str,
    stall_proxy: RegistryProxy,
) -> None:
    image = f"{stall_proxy.host}/hoist/stall:1"  # every download hangs after 1 MB
    remove_local(docker_engine, image)
    runtime = DockerRuntime(agent_id, base_url=docker_engine)
    cfg = docker_config(agent_id, stall_timeout_s=2)
    async with (
        running(nc, store, runtime, cfg),  # type: ignore[arg-type]
        progress_log(nc, agent_id) as seen,
    ):
        reply = await call(nc, agent_id, rpc.CHECK_AND_PULL, {"images": [image]})
        task_id = reply[image]["task_id"]
        failed = await event_of(store, agent_id, ev.ImagePullFailed, within=60, task_id=task_id)
        assert failed.reason == "stalled: no progress for 2s"
        status = await call(nc, agent_id, rpc.PULL_STATUS, {"task_id": task_id})
        assert (status["state"], status["reason"]) == ("failed", failed.reason)
        assert await runtime.has_image(image) is None
    last = seen.of(task_id)[-1]
    assert last.done and last.error == failed.reason and last.current > 0


async def test_pull_cancel_stops_a_docker_pull_its_last_kernel_left(
    nc: Client,
    store: EventStore,
    agent_id: str,
    docker_engine: str,
    big_image: str,
    slow_proxy: RegistryProxy,
) -> None:
    image = f"{slow_proxy.host}/hoist/big:1"  # 20 MB/s: seconds of download to stop
    remove_local(docker_engine, image)
    runtime = DockerRuntime(agent_id, base_url=docker_engine)
    async with (
        running(nc, store, runtime, docker_config(agent_id)),  # type: ignore[arg-type]
        progress_log(nc, agent_id) as seen,
    ):
        asked = {"images": [image], "kernel_ids": ["k1"]}
        task_id = (await call(nc, agent_id, rpc.CHECK_AND_PULL, asked))[image]["task_id"]
        await wait_for(lambda: any(p.current > 0 for p in seen.of(task_id)), 30, "bytes")
        cancel = {"image": image, "kernel_ids": ["k1"], "reason": "k1 cancelled"}
        reply = await call(nc, agent_id, rpc.PULL_CANCEL, cancel)
        assert reply == {"task_id": task_id, "state": "cancelled", "cancelled": True}, reply
        failed = await event_of(store, agent_id, ev.ImagePullFailed, within=15, task_id=task_id)
        assert failed.cancelled and failed.reason == "k1 cancelled"
        status = await call(nc, agent_id, rpc.PULL_STATUS, {"task_id": task_id})
        assert status["state"] == "cancelled", status
        assert await runtime.has_image(image) is None
        assert ev.ImagePulled not in {type(e) for e in await agent_events(store, agent_id)}
        # Idempotent: nothing in flight any more, nothing changes.
        assert await call(nc, agent_id, rpc.PULL_CANCEL, cancel) == {}
    last = seen.of(task_id)[-1]
    assert last.done and last.cancelled and last.error == "k1 cancelled"
    assert 0 < last.current < last.total  # where it stopped, not a full bar
