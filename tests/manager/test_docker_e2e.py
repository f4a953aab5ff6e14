"""End to end on a real Docker Engine and registry (tests/infra): a two-kernel session whose
image must be pulled goes PULLING, then RUNNING with real containers; destroyed, they are gone."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import docker
import pytest

from agent.pulls import PullPolicy
from agent.runtime.base import LABEL_AGENT, LABEL_KERNEL
from agent.runtime.docker import DockerRuntime
from domain.subjects import SESSION_DESTROY
from eventstore.store import EventStore
from tests.agent.agent_harness import config, running
from tests.infra.images import remove_local
from tests.infra.proxy import RegistryProxy
from tests.manager.harness import MB, create, manager, request, until
from transport.client import Client


@pytest.fixture
def agent_ids() -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"d{tag}a", f"d{tag}b"]


@pytest.fixture
async def client(docker_engine: str, agent_ids: list[str]) -> AsyncIterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=docker_engine, version="1.41")
    yield client
    for agent_id in agent_ids:
        label = f"{LABEL_AGENT}={agent_id}"
        for c in client.containers.list(all=True, filters={"label": label}):
            c.remove(force=True)
    client.close()


async def test_two_kernels_pull_then_run_in_real_containers_then_go(
    nc: Client,
    store: EventStore,
    docker_engine: str,
    big_image: str,
    slow_proxy: RegistryProxy,
    agent_ids: list[str],
    client: docker.DockerClient,
) -> None:
    image = f"{slow_proxy.host}/hoist/big:1"  # 20 MB/s: the pull takes a few seconds
    remove_local(docker_engine, image)
    a, b = agent_ids
    cfgs = [
        config(x, runtime="docker", cpu=1, mem=512 * MB, resource_group="default",
               pulls=PullPolicy(backoff_s=0.1))
        for x in agent_ids
    ]  # fmt: skip
    async with (
        running(nc, store, DockerRuntime(a, base_url=docker_engine), cfgs[0]),
        running(nc, store, DockerRuntime(b, base_url=docker_engine), cfgs[1]),
        manager(nc) as m,
    ):
        created = await create(
            nc, image=image, cluster_size=2, resources={"cpu": 0.5, "mem": 64 * MB}
        )
        sid = created["session_id"]
        pulling = await until(
            nc, sid, lambda s: any(k["status"] == "PULLING" for k in s["kernels"]), 20, "pulling"
        )
        assert pulling["status"] == "PULLING"
        assert all(k["pull_task_id"] for k in pulling["kernels"] if k["status"] == "PULLING")
        done = await until(nc, sid, within=90)
        assert done["status"] == "RUNNING", done
        assert {k["agent_id"] for k in done["kernels"]} == {a, b}
        for k in done["kernels"]:
            [container] = client.containers.list(
                filters={"label": f"{LABEL_KERNEL}={k['kernel_id']}"}
            )
            assert container.status == "running"
            assert container.id == k["container_id"]
        for kernel in m.fleet.sessions[sid].kernels.values():
            seen = [c.status.value for c in kernel.status_history]
            assert seen.index("PULLING") < seen.index("RUNNING"), seen

        await request(nc, SESSION_DESTROY, {"session_id": sid})
        gone = await until(nc, sid, lambda s: s["status"] == "TERMINATED", 60, "terminated")
        assert {k["status_info"] for k in gone["kernels"]} == {"user-requested"}
        for k in done["kernels"]:
            label = f"{LABEL_KERNEL}={k['kernel_id']}"
            assert client.containers.list(all=True, filters={"label": label}) == []
