"""DockerRuntime against a real Docker Engine and a real registry (see tests/infra)."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator

import docker
import pytest

from agent.runtime.base import (
    LABEL_AGENT,
    LABEL_KERNEL,
    LABEL_SESSION,
    ImageInUse,
    ImageNotFound,
    ImageProgress,
    KernelCreateError,
    KernelExists,
    PullProgress,
    TransientPullError,
)
from agent.runtime.docker import DockerRuntime, classify
from services.stack.natsserver import free_port
from tests.infra.images import remove_local
from tests.infra.proxy import RegistryProxy
from tests.infra.registry import Registry, blob_path, manifest_path

MiB = 1024 * 1024


@pytest.fixture
async def runtime(docker_engine: str) -> AsyncIterator[DockerRuntime]:
    rt = DockerRuntime(f"test-{uuid.uuid4().hex[:8]}", base_url=docker_engine)
    yield rt
    for k in await rt.list_kernels():
        await rt.destroy(k.kernel_id)
    await rt.close()


@pytest.fixture
def client(docker_engine: str) -> docker.DockerClient:
    return docker.DockerClient(base_url=docker_engine, version="1.41")


async def test_pull_streams_monotonic_layer_progress_to_the_total(
    runtime: DockerRuntime, progress_image: str, registry: Registry, docker_engine: str
) -> None:
    remove_local(docker_engine, progress_image)
    mark = registry.mark()
    updates: list[PullProgress] = []
    pulled = await runtime.pull(progress_image, updates.append)

    per_layer: dict[str, list[PullProgress]] = defaultdict(list)
    for p in updates:
        per_layer[p.layer].append(p)
    assert len(per_layer) == 4, per_layer.keys()  # 4 layers of random bytes
    for layer, seq in per_layer.items():
        currents = [p.current for p in seq]
        assert currents == sorted(currents), f"layer {layer} went backwards: {currents}"
        assert seq[-1].status == "Pull complete"
        assert seq[-1].current == seq[-1].total > 0, seq[-1]
    downloading = [p for p in updates if p.status == "Downloading"]
    # Straight from a local registry dockerd reports a layer only a few times (throttled); the
    # slow-registry test below shows the many updates of a real download.
    assert {p.layer for p in downloading} == set(per_layer), "every layer reports its bytes"
    summed = ImageProgress()
    for p in updates:
        summed.add(p)
    assert summed.current == summed.total >= 60 * MiB

    assert pulled.image == progress_image and pulled.digest.startswith("sha256:")
    assert pulled.size_bytes >= 60 * MiB
    assert await runtime.has_image(progress_image) == pulled
    assert progress_image in {i.image for i in await runtime.list_images()}

    # At the registry: one manifest fetch by digest, each blob (config + 4 layers) once.
    repo = "hoist/progress"
    assert registry.count("GET", manifest_path(repo), mark) == 1, registry.counts(mark)
    blobs = [r.path for r in registry.requests(mark) if r.method == "GET"]
    blob_gets = [b for b in blobs if "/blobs/" in b]
    assert len(blob_gets) == 5 and len(set(blob_gets)) == 5, registry.counts(mark)
    assert registry.count("GET", blob_path(repo), mark) == 5


async def test_missing_image_is_not_found_without_retries(
    runtime: DockerRuntime, registry: Registry
) -> None:
    mark = registry.mark()
    with pytest.raises(ImageNotFound) as err:
        await runtime.pull(f"{registry.host}/hoist/nope:1", lambda p: None)
    assert "not found" in err.value.reason and not err.value.retryable
    assert registry.count("GET", manifest_path("hoist/nope"), mark) == 1


async def test_missing_tag_is_not_found(
    runtime: DockerRuntime, small_image: str, registry: Registry
) -> None:
    with pytest.raises(ImageNotFound):
        await runtime.pull(f"{registry.host}/hoist/small:nope", lambda p: None)


async def test_unreachable_registry_is_transient(runtime: DockerRuntime) -> None:
    with pytest.raises(TransientPullError) as err:
        await runtime.pull(f"127.0.0.1:{free_port()}/hoist/x:1", lambda p: None)
    assert err.value.retryable and "connection refused" in err.value.reason


def test_daemon_messages_are_classified() -> None:
    image = "r/x:1"
    assert isinstance(classify(image, "unauthorized: authentication required"), Exception)
    assert type(classify(image, "unauthorized: authentication required")).__name__ == (
        "Unauthorized"
    )
    assert type(classify(image, "pull access denied for x")).__name__ == "Unauthorized"
    assert type(classify(image, "manifest unknown", 404)) is ImageNotFound
    assert type(classify(image, "toomanyrequests: rate limit", 500)) is TransientPullError


async def test_cancel_aborts_a_stalled_pull(
    runtime: DockerRuntime, stall_image: str, stall_proxy: RegistryProxy, docker_engine: str
) -> None:
    remove_local(docker_engine, stall_image)  # else its layers "Already exist"
    image = f"{stall_proxy.host}/hoist/stall:1"
    got_bytes = asyncio.Event()

    def on_progress(p: PullProgress) -> None:
        if p.current > 0:
            got_bytes.set()

    task = asyncio.create_task(runtime.pull(image, on_progress))
    await asyncio.wait_for(got_bytes.wait(), 30)
    await asyncio.sleep(1)  # stalled: the proxy forwards nothing more
    assert not task.done()
    assert stall_proxy.open_connections > 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 15)
    assert await runtime.has_image(image) is None
    # The daemon dropped the pull: a retry of the same layers is not stuck behind it. (Docker
    # 20.10 leaves its stalled registry connections open, though; they end with the proxy.)
    pulled = await asyncio.wait_for(runtime.pull(stall_image, lambda p: None), 60)
    assert pulled.size_bytes >= 8 * MiB


async def test_a_slow_registry_gives_many_progress_updates(
    runtime: DockerRuntime, big_image: str, slow_proxy: RegistryProxy, docker_engine: str
) -> None:
    remove_local(docker_engine, big_image)
    updates: list[PullProgress] = []
    await runtime.pull(f"{slow_proxy.host}/hoist/big:1", updates.append)
    downloading = [p for p in updates if p.status == "Downloading"]
    assert len(downloading) >= 20, len(downloading)


async def test_create_runs_a_limited_labelled_container_and_destroy_removes_it(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient
) -> None:
    await runtime.pull(small_image, lambda p: None)
    cid = await runtime.create("k1", "s1", small_image, cpu=0.5, mem_bytes=64 * MiB)

    [ctr] = client.containers.list(filters={"label": f"{LABEL_KERNEL}=k1"} | {})
    assert ctr.id == cid and ctr.status == "running"
    host = ctr.attrs["HostConfig"]
    assert host["NanoCpus"] == 500_000_000 and host["Memory"] == 64 * MiB
    assert host["NetworkMode"] == "none"
    assert ctr.labels[LABEL_SESSION] == "s1" and ctr.labels[LABEL_AGENT] == runtime.agent_id

    [k] = await runtime.list_kernels()
    assert (k.kernel_id, k.session_id, k.container_id, k.running) == ("k1", "s1", cid, True)
    assert (k.cpu, k.mem_bytes) == (0.5, 64 * MiB)  # from its labels, for a restarted agent
    with pytest.raises(KernelExists) as err:
        await runtime.create("k1", "s1", small_image, cpu=0.5, mem_bytes=64 * MiB)
    assert err.value.container_id == cid
    with pytest.raises(ImageInUse):
        await runtime.remove_image(small_image)

    assert await runtime.destroy("k1") is True
    assert client.containers.list(all=True, filters={"label": f"{LABEL_KERNEL}=k1"}) == []
    assert await runtime.list_kernels() == []
    assert await runtime.destroy("k1") is False


async def test_kernels_are_listed_per_agent_and_survive_a_new_runtime(
    runtime: DockerRuntime, small_image: str, docker_engine: str
) -> None:
    await runtime.pull(small_image, lambda p: None)
    cid = await runtime.create("k2", "s2", small_image, cpu=0.25, mem_bytes=32 * MiB)
    restarted = DockerRuntime(runtime.agent_id, base_url=docker_engine)
    other = DockerRuntime("someone-else", base_url=docker_engine)
    try:
        assert [k.container_id for k in await restarted.list_kernels()] == [cid]
        assert await other.list_kernels() == []
    finally:
        await restarted.close()
        await other.close()


async def test_create_needs_the_image_and_valid_resources(
    runtime: DockerRuntime, registry: Registry
) -> None:
    with pytest.raises(KernelCreateError, match="not on this host"):
        await runtime.create("k3", "s3", f"{registry.host}/hoist/absent:1", 1, 64 * MiB)
    with pytest.raises(ValueError, match="cpu"):
        await runtime.create("k3", "s3", "x:1", 0, 64 * MiB)
    with pytest.raises(ValueError, match="mem_bytes"):
        await runtime.create("k3", "s3", "x:1", 1, 1024)


async def test_remove_image(runtime: DockerRuntime, small_image: str) -> None:
    await runtime.pull(small_image, lambda p: None)
    assert await runtime.remove_image(small_image) is True
    assert await runtime.has_image(small_image) is None
    assert await runtime.remove_image(small_image) is False
