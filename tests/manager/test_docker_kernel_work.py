"""Kernels that run the user's work (issue 13) end to end on a real Docker Engine and registry
(tests/infra): the manager and docker agents in this process, the API over NATS as a client
calls it. Exit codes and logs of a batch session, a published port serving HTTP, exec, a named
volume across sessions, a single-node cluster's names, a kill from outside, an OOM kill, and a
gpu slot on an engine without a GPU driver."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import docker
import docker.errors
import pytest

from agent.pulls import PullPolicy
from agent.runtime.base import LABEL_AGENT, LABEL_KERNEL
from agent.runtime.docker import DockerRuntime
from agent.server import AgentServer
from domain.subjects import (
    SESSION_DESTROY,
    SESSION_EXEC,
    VOLUME_LIST,
    VOLUME_REMOVE,
)
from eventstore.store import EventStore
from tests.agent.agent_harness import config, running
from tests.infra.http import SERVE_HI, http_get
from tests.manager.harness import (
    ENDED,
    MB,
    create,
    ended,
    logs,
    manager,
    read_stream,
    request,
    until,
)
from transport.client import Client

SMALL = {"cpu": 0.5, "mem": 64 * MB}


def running_(s: dict[str, Any]) -> bool:
    return s["status"] == "RUNNING" or ended(s)


@pytest.fixture
def agent_id() -> str:
    return f"dk{uuid.uuid4().hex[:6]}"


@pytest.fixture
async def client(docker_engine: str, agent_id: str) -> AsyncIterator[docker.DockerClient]:
    """The engine; afterwards the agent's containers, volumes and networks are removed."""
    client = docker.DockerClient(base_url=docker_engine, version="1.41")
    yield client
    label = {"label": f"{LABEL_AGENT}={agent_id}"}
    for c in client.containers.list(all=True, filters=label):
        c.remove(force=True)
    for v in client.volumes.list(filters=label):
        try:
            v.remove(force=True)
        except docker.errors.APIError:
            pass
    for n in client.networks.list(filters=label):
        try:
            n.remove()
        except docker.errors.APIError:
            pass
    client.close()


@asynccontextmanager
async def docker_agent(
    nc: Client, store: EventStore, docker_engine: str, agent_id: str, **cfg: Any
) -> AsyncIterator[AgentServer]:
    values: dict[str, Any] = {
        "runtime": "docker",
        "cpu": 2,
        "mem": 1024 * MB,
        "resource_group": "default",
        "pulls": PullPolicy(backoff_s=0.1),
    }
    runtime = DockerRuntime(agent_id, base_url=docker_engine)
    async with AsyncExitStack() as stack:
        agent = await stack.enter_async_context(
            running(nc, store, runtime, config(agent_id, **{**values, **cfg}))
        )
        yield agent


async def test_a_batch_session_ends_with_exit_code_3_and_its_logs_show_hello(
    nc: Client,
    store: EventStore,
    docker_engine: str,
    small_image: str,
    agent_id: str,
    client: docker.DockerClient,
) -> None:
    async with docker_agent(nc, store, docker_engine, agent_id), manager(nc):
        created = await create(
            nc,
            image=small_image,
            resources=SMALL,
            session_type="batch",
            command=["sh", "-c", "echo hello; exit 3"],
        )
        sid = created["session_id"]
        done = await until(nc, sid, ended, 90, "ended")
        assert (done["status"], done["status_info"]) == ("TERMINATED", "exited: code 3"), done
        [kernel] = done["kernels"]
        assert kernel["exit_code"] == 3 and kernel["ran_s"] is not None, kernel
        assert await logs(nc, sid) == b"hello\n"
        # The ended container is kept (with its logs) until --keep-exited.
        [container] = client.containers.list(
            all=True, filters={"label": f"{LABEL_KERNEL}={kernel['kernel_id']}"}
        )
        assert container.attrs["State"]["ExitCode"] == 3


async def test_an_interactive_session_serves_http_on_its_reported_port(
    nc: Client,
    store: EventStore,
    docker_engine: str,
    small_image: str,
    agent_id: str,
    client: docker.DockerClient,
) -> None:
    async with docker_agent(nc, store, docker_engine, agent_id), manager(nc):
        created = await create(
            nc, image=small_image, resources=SMALL, command=["sh", "-c", SERVE_HI], ports=[8080]
        )
        view = await until(nc, created["session_id"], running_, 90, "running")
        assert view["status"] == "RUNNING", view
        [kernel] = view["kernels"]
        [port] = kernel["ports"]
        assert port["port"] == 8080 and port["host_port"] > 0, port
        body = await asyncio.to_thread(http_get, f"http://{port['host']}:{port['host_port']}/")
        assert body == b"hi\n"
        await request(nc, SESSION_DESTROY, {"session_id": created["session_id"]})
        gone = await until(nc, created["session_id"], ended, 60, "ended")
        assert gone["status"] == "TERMINATED", gone


async def test_exec_returns_output_and_exit_code(
    nc: Client,
    store: EventStore,
    docker_engine: str,
    small_image: str,
    agent_id: str,
    client: docker.DockerClient,
) -> None:
    async with docker_agent(nc, store, docker_engine, agent_id), manager(nc):
        created = await create(
            nc, image=small_image, resources=SMALL, command=["sleep", "infinity"], env={"X": "y"}
        )
        sid = created["session_id"]
        view = await until(nc, sid, running_, 90, "running")
        assert view["status"] == "RUNNING", view
        opened = await request(
            nc,
            SESSION_EXEC,
            {"session_id": sid, "command": ["sh", "-c", "echo out; echo $X; pwd; exit 5"],
             "workdir": "/bin"},
        )  # fmt: skip
        data, last = await read_stream(nc, opened)
        assert data == b"out\ny\n/bin\n" and last.get("exit_code") == 5, (data, last)
        opened = await request(nc, SESSION_EXEC, {"session_id": sid, "command": ["true"]})
        assert (await read_stream(nc, opened))[1].get("exit_code") == 0
        # A time limit: the command is killed (124, as coreutils' timeout).
        opened = await request(
            nc, SESSION_EXEC, {"session_id": sid, "command": ["sleep", "30"], "timeout": 1}
        )
        began = time.monotonic()
        _, last = await read_stream(nc, opened)
        assert last.get("exit_code") == 124 and time.monotonic() - began < 15, last
        assert last.get("reason") and "error" not in last, last  # why it ended early


async def test_a_named_volume_keeps_a_file_across_two_sessions(
    nc: Client,
    store: EventStore,
    docker_engine: str,
    small_image: str,
    agent_id: str,
    client: docker.DockerClient,
) -> None:
    vol = f"data-{uuid.uuid4().hex[:6]}"
    async with docker_agent(nc, store, docker_engine, agent_id), manager(nc):
        for script in ("echo kept > /data/f", "cat /data/f"):
            made = await create(
                nc,
                image=small_image,
                resources=SMALL,
                session_type="batch",
                command=["sh", "-c", script],
                mounts=[{"volume": vol, "path": "/data"}],
            )
            done = await until(nc, made["session_id"], ended, 90, "ended")
            assert done["status_info"] == "succeeded", done
        assert await logs(nc, made["session_id"]) == b"kept\n"
        listed = await request(nc, VOLUME_LIST, {"owner": "alice"})
        assert [(v["name"], v["agent_id"]) for v in listed["volumes"]] == [(vol, agent_id)], listed
        assert client.volumes.get(f"hoist-{vol}").attrs["Labels"]["hoist.owner"] == "alice"
        # In use by the kept containers: refused, naming the agent.
        removal = await request(nc, VOLUME_REMOVE, {"name": vol, "owner": "alice"})
        assert removal.get("removed") == [] and agent_id in removal.get("refused", {}), removal


async def test_a_single_node_clusters_sub1_reaches_main1_by_name(
    nc: Client,
    store: EventStore,
    docker_engine: str,
    small_image: str,
    agent_id: str,
    client: docker.DockerClient,
) -> None:
    fetch = (
        "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25; do"
        " wget -qO- http://main1:8080/ 2>/dev/null && exit 0; sleep 0.4; done; exit 1"
    )
    script = f'case "$HOIST_CLUSTER_ROLE" in main) {SERVE_HI};; *) {fetch};; esac'
    async with docker_agent(nc, store, docker_engine, agent_id), manager(nc):
        created = await create(
            nc,
            image=small_image,
            resources=SMALL,
            cluster_size=2,
            cluster_mode="single-node",
            command=["sh", "-c", script],
        )
        sid = created["session_id"]
        view = await until(
            nc,
            sid,
            lambda s: (
                any(k["hostname"] == "sub1" and k["status"] in ENDED for k in s["kernels"])
                or s["status"] == "ERROR"
            ),
            90,
            "sub1 ended",
        )
        by_name = {k["hostname"]: k for k in view["kernels"]}
        assert by_name["sub1"]["exit_code"] == 0, (view, await logs(nc, sid, kernel_id="sub1"))
        assert by_name["main1"]["status"] == "RUNNING", view
        assert await logs(nc, sid, kernel_id="sub1") == b"hi\n"
        await request(nc, SESSION_DESTROY, {"session_id": sid})
        await until(nc, sid, ended, 60, "ended")


async def test_a_kernel_killed_from_outside_is_recorded_with_its_signal(
    nc: Client,
    store: EventStore,
    docker_engine: str,
    small_image: str,
    agent_id: str,
    client: docker.DockerClient,
) -> None:
    async with docker_agent(nc, store, docker_engine, agent_id), manager(nc):
        created = await create(
            nc, image=small_image, resources=SMALL, command=["sleep", "infinity"]
        )
        sid = created["session_id"]
        view = await until(nc, sid, running_, 90, "running")
        assert view["status"] == "RUNNING", view
        [kernel] = view["kernels"]
        client.api.kill(kernel["container_id"])  # SIGKILL
        done = await until(nc, sid, ended, 30, "ended")
        [kernel] = done["kernels"]
        assert kernel["status"] == "TERMINATED", kernel
        assert kernel["status_info"] == "killed: signal 9", kernel
        assert kernel["exit_code"] == 137, kernel


async def test_an_oom_killed_kernel_is_recorded_oom_killed(
    nc: Client,
    store: EventStore,
    docker_engine: str,
    small_image: str,
    agent_id: str,
    client: docker.DockerClient,
) -> None:
    # A 64 MiB buffer in 8 MiB. Docker 20.10 (cgroup v1) misses the OOM notice now and then on a
    # loaded host (tests/agent/test_runtime_docker.py): a few tries.
    seen = []
    async with docker_agent(nc, store, docker_engine, agent_id), manager(nc):
        for _ in range(4):
            created = await create(
                nc,
                image=small_image,
                resources={"cpu": 0.5, "mem": 8 * MB},
                session_type="batch",
                command=["sh", "-c", "dd if=/dev/zero of=/dev/null bs=64M count=1"],
            )
            done = await until(nc, created["session_id"], ended, 90, "ended")
            [kernel] = done["kernels"]
            assert kernel["exit_code"] == 137, kernel
            seen.append(kernel["status_info"])
            if kernel["status_info"] == "oom-killed":
                break
    assert seen[-1] == "oom-killed", seen


async def test_a_gpu_slot_on_an_engine_without_a_gpu_driver_fails_to_start_with_dockers_reason(
    nc: Client,
    store: EventStore,
    docker_engine: str,
    small_image: str,
    agent_id: str,
    client: docker.DockerClient,
) -> None:
    async with docker_agent(nc, store, docker_engine, agent_id, slots={"gpu": 1}), manager(nc):
        created = await create(
            nc,
            image=small_image,
            resources={**SMALL, "gpu": 1},
            command=["sleep", "infinity"],
        )
        done = await until(nc, created["session_id"], ended, 90, "ended")
        assert done["status"] == "ERROR", done
        [kernel] = done["kernels"]
        assert kernel["status_info"].startswith("failed-to-start"), kernel
        assert (
            'could not select device driver "" with capabilities: [[gpu]]'
            in (kernel["status_info"])
        ), kernel
        assert (
            client.containers.list(all=True, filters={"label": f"{LABEL_AGENT}={agent_id}"}) == []
        )
