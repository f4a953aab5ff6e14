"""DockerRuntime against a real Docker Engine and a real registry (see tests/infra)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

import docker
import pytest
import requests

from agent.runtime import docker as docker_runtime
from agent.runtime.base import (
    LABEL_AGENT,
    LABEL_GPUS,
    LABEL_KERNEL,
    LABEL_SESSION,
    LABEL_SLOTS,
    SLEEP_FOREVER,
    ContainerSpec,
    HomeFile,
    ImageInUse,
    ImageMissing,
    ImageNotFound,
    ImageProgress,
    KernelContainer,
    KernelCreateError,
    KernelExists,
    KernelNotFound,
    Published,
    PullProgress,
    TransientPullError,
    VolumeInUse,
    VolumeMount,
)
from agent.runtime.docker import HANDOFF_BYTES, DockerRuntime, classify
from agent.runtime.docker_containers import _kernel
from agent.runtime.docker_streams import _container_pid
from services.stack.natsserver import free_port
from tests.infra.dockerd import free_address_pools
from tests.infra.http import SERVE_HI, http_get
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
    for v in await rt.list_volumes():
        await rt.remove_volume(v.name)
    # Every test has an agent of its own: a network left behind would eat an address pool.
    api = docker.APIClient(base_url=docker_engine, version="1.41")
    try:
        left = api.networks(filters={"label": f"{LABEL_AGENT}={rt.agent_id}"})
        for n in left:
            api.remove_network(n["Id"])
    finally:
        api.close()
    await rt.close()
    assert [n["Name"] for n in left] == []  # the runtime removes a network with its last kernel


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


@pytest.mark.parametrize(
    ("labels", "asked"),
    [
        ({"hoist.asked-seq": "12", "hoist.asked-at": "1796370000.5"}, (12, 1796370000.5)),
        ({}, (0, 0.0)),  # created without a sequence, or by an older agent
        ({"hoist.asked-seq": "twelve", "hoist.asked-at": "1"}, (0, 0.0)),  # edited by hand
        ({"hoist.asked-seq": "12", "hoist.asked-at": "nan"}, (0, 0.0)),
        ({"hoist.asked-seq": "-3", "hoist.asked-at": "1"}, (0, 0.0)),
        ({"hoist.asked-seq": "12", "hoist.asked-at": "inf"}, (0, 0.0)),
        ({"hoist.asked-seq": "12"}, (0, 0.0)),  # no time: nothing to count SPARE_S from
        ({"hoist.asked-seq": "9" * 5000, "hoist.asked-at": "1"}, (0, 0.0)),  # int() refuses
    ],
)
def test_a_containers_create_sequence_is_read_back_from_its_labels(
    labels: dict[str, str], asked: tuple[int, float]
) -> None:
    """What a restarted agent spares by (agent.spares recall_from_labels); a label that does not
    read spares nothing and lists the container all the same."""
    k = _kernel({"hoist.kernel": "k1", **labels}, "c1", "base:1", True, (), None)
    assert (k.kernel_id, k.asked_seq, k.asked_at) == ("k1", *asked)


@pytest.mark.parametrize(
    ("cpu", "mem", "given"),
    [
        ("0.5", "268435456", (0.5, 268435456)),
        ("abc", "1e9", (0.0, 0)),  # anyone with the engine's socket can label a container
        ("nan", "-5", (0.0, 0)),
        ("inf", "9" * 5000, (0.0, 0)),
        ("-1", "", (0.0, 0)),
    ],
)
def test_a_bad_resource_label_lists_the_container_holding_nothing(
    cpu: str, mem: str, given: tuple[float, int]
) -> None:
    """A label that does not read stopped every listing (each heartbeat and sync) before."""
    k = _kernel(
        {"hoist.kernel": "k1", "hoist.cpu": cpu, "hoist.mem": mem}, "c1", "b:1", True, (), None
    )
    assert (k.kernel_id, k.cpu, k.mem_bytes) == ("k1", *given)


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
    # A single kernel joins the agent's shared network (no alias given; the engine adds its
    # hostname and short id), where its containers cannot talk to each other.
    shared = runtime.agent_network_name
    assert host["NetworkMode"] == shared
    assert list(ctr.attrs["NetworkSettings"]["Networks"]) == [shared]
    assert ctr.attrs["Config"]["Hostname"] == "main1"
    [net] = nets(client, shared)
    assert net["Labels"] == {LABEL_AGENT: runtime.agent_id}
    assert net["Options"] == {"com.docker.network.bridge.enable_icc": "false"}
    assert nets(client, runtime.network_name("s1")) == []
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
    assert nets(client, shared) == []  # gone with its last kernel
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
    with pytest.raises(ImageMissing, match="not on this host"):
        await runtime.create("k3", "s3", f"{registry.host}/hoist/absent:1", 1, 64 * MiB)
    with pytest.raises(ValueError, match="cpu"):
        await runtime.create("k3", "s3", "x:1", 0, 64 * MiB)
    with pytest.raises(ValueError, match="mem: must be at least 6 MiB"):
        await runtime.create("k3", "s3", "x:1", 1, 1024)


async def test_remove_image(runtime: DockerRuntime, small_image: str) -> None:
    await runtime.pull(small_image, lambda p: None)
    assert await runtime.remove_image(small_image) is True
    assert await runtime.has_image(small_image) is None
    assert await runtime.remove_image(small_image) is False


async def test_short_engine_names_are_listed_canonical(
    runtime: DockerRuntime, small_image: str, docker_engine: str
) -> None:
    """The engine lists a Docker Hub image as ``team/app:1`` (RepoTags, a container's image):
    the runtime names it ``docker.io/team/app:1``, as every event and the manager do."""
    await runtime.pull(small_image, lambda p: None)
    repo = f"hoist-test/short-{uuid.uuid4().hex[:8]}"
    api = docker.APIClient(base_url=docker_engine, version="1.41")
    try:
        api.tag(small_image, repo, "1")
        assert f"{repo}:1" in {t for i in api.images() for t in i.get("RepoTags") or []}
        canonical = f"docker.io/{repo}:1"
        listed = {i.image for i in await runtime.list_images()}
        assert canonical in listed and f"{repo}:1" not in listed
        held = await runtime.has_image(canonical)
        assert held is not None and held.image == canonical
        await runtime.create("k-short", "s-short", canonical, cpu=0.25, mem_bytes=32 * MiB)
        [k] = [k for k in await runtime.list_kernels() if k.kernel_id == "k-short"]
        assert k.image == canonical
    finally:
        await runtime.destroy("k-short")
        with contextlib.suppress(docker.errors.APIError):
            api.remove_image(f"{repo}:1")
        api.close()


# --- The kernel spec, exits, logs, exec, volumes, session networks (a real engine) ---


async def wait_exit(rt: DockerRuntime, kernel_id: str, within: float = 30) -> KernelContainer:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for k in await rt.list_kernels():
            if k.kernel_id == kernel_id and k.exit is not None:
                return k
        await asyncio.sleep(0.1)
    raise AssertionError(f"kernel {kernel_id} did not exit: {await rt.list_kernels()}")


async def read_logs(rt: DockerRuntime, kernel_id: str, tail: int | None = None) -> bytes:
    return b"".join([c async for c in rt.logs(kernel_id, tail, follow=False)])


class Exits:
    """A watch_exits callback that lets a test await one kernel's exit."""

    def __init__(self) -> None:
        self.seen: list[KernelContainer] = []
        self.changed = asyncio.Event()

    def __call__(self, k: KernelContainer) -> None:
        assert asyncio.get_running_loop()  # called on the loop
        self.seen.append(k)
        self.changed.set()

    async def of(self, kernel_id: str, within: float = 30) -> KernelContainer:
        async with asyncio.timeout(within):
            while True:
                for k in self.seen:
                    if k.kernel_id == kernel_id:
                        return k
                self.changed.clear()
                await self.changed.wait()


def nets(client: docker.DockerClient, name: str) -> list[dict[str, object]]:
    return [n for n in client.api.networks(names=[name]) if n["Name"] == name]  # not substrings


def sh(script: str) -> ContainerSpec:
    return ContainerSpec(command=["sh", "-c", script])


async def test_a_command_exit_code_reaches_list_kernels_logs_and_watch_exits(
    runtime: DockerRuntime, small_image: str
) -> None:
    await runtime.pull(small_image, lambda p: None)
    exits = Exits()
    runtime.watch_exits(exits)
    began = time.time()
    cid = await runtime.create("k", "s", small_image, 0.5, 32 * MiB, sh("echo hello; exit 3"))

    k = await wait_exit(runtime, "k")
    assert (k.container_id, k.running) == (cid, False)
    assert k.exit is not None and k.exit.exit_code == 3 and not k.exit.oom_killed
    assert began - 1 < k.exit.finished_at < time.time() + 1 and 0 <= k.exit.ran_s < 10
    assert await read_logs(runtime, "k") == b"hello\n"
    watched = await exits.of("k")
    assert watched.container_id == cid and watched.exit == k.exit
    # An exit never changes: listed again, from the cache, the same.
    assert [k] == [x for x in await runtime.list_kernels() if x.kernel_id == "k"]


async def test_no_command_runs_the_images_own_cmd(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient
) -> None:
    await runtime.pull(small_image, lambda p: None)
    cid = await runtime.create("k", "s", small_image, 0.5, 32 * MiB)
    attrs = client.api.inspect_container(cid)
    assert attrs["Config"]["Cmd"] == list(SLEEP_FOREVER)  # the test images' CMD
    assert attrs["Config"]["Hostname"] == "main1"
    [k] = await runtime.list_kernels()
    assert k.running and k.exit is None


async def test_env_and_workdir_are_applied(runtime: DockerRuntime, small_image: str) -> None:
    await runtime.pull(small_image, lambda p: None)
    spec = ContainerSpec(
        command=["sh", "-c", "echo $FOO; pwd"], env={"FOO": "bar baz"}, workdir="/work/dir"
    )
    await runtime.create("k", "s", small_image, 0.5, 32 * MiB, spec)
    k = await wait_exit(runtime, "k")
    assert k.exit is not None and k.exit.exit_code == 0
    assert await read_logs(runtime, "k") == b"bar baz\n/work/dir\n"


async def test_dotfiles_are_in_the_home_when_the_command_starts(
    runtime: DockerRuntime, small_image: str
) -> None:
    await runtime.pull(small_image, lambda p: None)
    files = (
        HomeFile(".bashrc", b"alias ll='ls -l'\n"),
        HomeFile(".config/git/config", b"[user]\n\tname = Dana\n", 0o600),
    )
    show = "cat $HOME/.bashrc $HOME/.config/git/config; stat -c '%a %n' $HOME/.config/git/config"
    spec = ContainerSpec(command=["sh", "-c", show], home_files=files)
    await runtime.create("k", "s", small_image, 0.5, 32 * MiB, spec)
    k = await wait_exit(runtime, "k")
    assert k.exit is not None and k.exit.exit_code == 0, await read_logs(runtime, "k")
    assert await read_logs(runtime, "k") == (
        b"alias ll='ls -l'\n[user]\n\tname = Dana\n600 //.config/git/config\n"
    )
    # (The test images have no /etc/passwd: Docker's HOME is "/".)  A HOME the image lacks is
    # made, owned by the kernel's user.
    spec = ContainerSpec(
        command=["sh", "-c", "cat ~/.bashrc; stat -c '%a %u' ~"],
        env={"HOME": "/home/dana"},
        home_files=files[:1],
    )
    await runtime.create("k2", "s", small_image, 0.5, 32 * MiB, spec)
    k = await wait_exit(runtime, "k2")
    assert k.exit is not None and k.exit.exit_code == 0, await read_logs(runtime, "k2")
    assert await read_logs(runtime, "k2") == b"alias ll='ls -l'\n755 0\n"


async def test_logs_tail_follow_and_close(runtime: DockerRuntime, small_image: str) -> None:
    await runtime.pull(small_image, lambda p: None)
    with pytest.raises(KernelNotFound):
        await read_logs(runtime, "nope")
    spec = sh("echo one; echo two >&2; echo three; while true; do echo tick; sleep 0.2; done")
    await runtime.create("k", "s", small_image, 0.5, 32 * MiB, spec)
    follow = runtime.logs("k", None, follow=True)
    got = b""
    async with asyncio.timeout(20):
        async for chunk in follow:
            got += chunk
            if got.count(b"tick") >= 3:
                break
    # Both streams, each in order; the engine copies stdout and stderr to its log separately,
    # so a line of one may come before a line of the other written just before it.
    lines = got.splitlines()
    assert b"two" in lines and [x for x in lines if x != b"two"][:3] == [b"one", b"three", b"tick"]
    threads = _stream_threads()
    await follow.aclose()  # stops the stream's thread promptly
    await _until(lambda: _stream_threads() < threads, 5)
    tail = await read_logs(runtime, "k", tail=1)
    assert tail == b"tick\n"


def _stream_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("logs "))


async def _until(cond: Callable[[], bool], within: float) -> None:
    deadline = time.monotonic() + within
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_port_is_published_on_the_runtimes_address(
    runtime: DockerRuntime, small_image: str
) -> None:
    await runtime.pull(small_image, lambda p: None)
    spec = ContainerSpec(command=["sh", "-c", SERVE_HI], ports=[8080])
    await runtime.create("k", "s", small_image, 0.5, 32 * MiB, spec)
    [k] = await runtime.list_kernels()
    [pub] = k.ports
    assert isinstance(pub, Published) and (pub.port, pub.host) == (8080, "127.0.0.1")
    assert pub.host_port > 0
    body = await asyncio.to_thread(http_get, f"http://{pub.host}:{pub.host_port}/")
    assert body == b"hi\n"


async def test_several_ports_are_published_and_listed_in_order(
    runtime: DockerRuntime, small_image: str
) -> None:
    await runtime.pull(small_image, lambda p: None)
    spec = ContainerSpec(command=SLEEP_FOREVER, ports=[9090, 8080, 8081])
    await runtime.create("k", "s", small_image, 0.5, 32 * MiB, spec)
    [k] = await runtime.list_kernels()  # a trial's agent failed here on every call
    assert [p.port for p in k.ports] == [8080, 8081, 9090]
    assert len({p.host_port for p in k.ports}) == 3


async def test_exec_output_exit_code_kill_and_a_stopped_container(
    runtime: DockerRuntime, small_image: str
) -> None:
    await runtime.pull(small_image, lambda p: None)
    with pytest.raises(KernelNotFound):
        await runtime.exec("nope", ["true"])
    await runtime.create("k", "s", small_image, 0.5, 32 * MiB, ContainerSpec(SLEEP_FOREVER))
    run = await runtime.exec(
        "k", ["sh", "-c", "echo out; echo $X; pwd; exit 5"], {"X": "y"}, "/bin"
    )
    assert b"".join([c async for c in run.output()]) == b"out\ny\n/bin\n"
    assert await run.wait() == 5

    long = await runtime.exec("k", ["sleep", "100"])
    began = time.monotonic()
    await long.kill()
    assert await asyncio.wait_for(long.wait(), 10) == 137  # SIGKILL
    assert [c async for c in long.output()] == []
    assert time.monotonic() - began < 5

    await runtime.create("k2", "s", small_image, 0.5, 32 * MiB, sh("exit 0"))
    await wait_exit(runtime, "k2")
    with pytest.raises(KernelCreateError, match="is not running"):
        await runtime.exec("k2", ["true"])


async def test_a_named_volume_outlives_its_kernels_and_has_an_owner(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient
) -> None:
    await runtime.pull(small_image, lambda p: None)
    vol = f"data-{uuid.uuid4().hex[:6]}"
    mount = [VolumeMount(vol, "/data")]
    write = ContainerSpec(["sh", "-c", "echo kept > /data/f"], mounts=mount, owner="alice")
    await runtime.create("w", "s", small_image, 0.5, 32 * MiB, write)
    assert (await wait_exit(runtime, "w")).exit.exit_code == 0  # type: ignore[union-attr]
    [v] = await runtime.list_volumes()
    assert (v.name, v.owner, v.used_by) == (vol, "alice", ("w",))
    labels = client.api.inspect_volume(f"hoist-{vol}")["Labels"]
    assert labels == {
        "hoist.agent": runtime.agent_id,
        "hoist.owner": "alice",
        "hoist.volume": vol,
    }
    with pytest.raises(VolumeInUse):  # an ended container still mounts it
        await runtime.remove_volume(vol)
    await runtime.destroy("w")

    read = ContainerSpec(["cat", "/data/f"], mounts=mount, owner="alice")
    await runtime.create("r", "s", small_image, 0.5, 32 * MiB, read)
    assert (await wait_exit(runtime, "r")).exit.exit_code == 0  # type: ignore[union-attr]
    assert await read_logs(runtime, "r") == b"kept\n"

    theirs = ContainerSpec(SLEEP_FOREVER, mounts=mount, owner="mallory")
    with pytest.raises(KernelCreateError, match=f"volume {vol} belongs to another owner"):
        await runtime.create("m", "s", small_image, 0.5, 32 * MiB, theirs)
    assert {k.kernel_id for k in await runtime.list_kernels()} == {"r"}

    await runtime.destroy("r")
    assert [v.used_by for v in await runtime.list_volumes()] == [()]
    assert await runtime.remove_volume(vol) is True
    assert await runtime.list_volumes() == []
    assert await runtime.remove_volume(vol) is False


async def test_kernels_of_a_session_reach_each_other_by_hostname(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient
) -> None:
    await runtime.pull(small_image, lambda p: None)
    serve = ContainerSpec(["sh", "-c", SERVE_HI], hostname="main1", private_network=True)
    await runtime.create("m", "s", small_image, 0.5, 32 * MiB, serve)
    # Retries until main1 listens; their errors stay out of the logs the test compares.
    fetch = (
        "for i in $(seq 50); do wget -qO- http://main1:8080/ 2>/dev/null && exit 0;"
        " sleep 0.2; done; exit 1"
    )
    spec = ContainerSpec(["sh", "-c", fetch], hostname="sub1", private_network=True)
    await runtime.create("w", "s", small_image, 0.5, 32 * MiB, spec)
    k = await wait_exit(runtime, "w")
    assert k.exit is not None and k.exit.exit_code == 0, await read_logs(runtime, "w")
    assert await read_logs(runtime, "w") == b"hi\n"

    # Kernels on other agents are reached through extra_hosts.
    hosts = ContainerSpec(
        ["cat", "/etc/hosts"],
        hostname="sub2",
        extra_hosts={"far1": "10.9.8.7"},
        private_network=True,
    )
    await runtime.create("h", "s", small_image, 0.5, 32 * MiB, hosts)
    await wait_exit(runtime, "h")
    assert b"10.9.8.7\tfar1\n" in await read_logs(runtime, "h")

    # Another session's kernel is on another network: main1 is not known there.
    get_main1 = ["sh", "-c", "wget -qO- -T 2 http://main1:8080/"]
    other = ContainerSpec(get_main1, hostname="sub1", private_network=True)
    await runtime.create("o", "s-other", small_image, 0.5, 32 * MiB, other)
    o = await wait_exit(runtime, "o")
    assert o.exit is not None and o.exit.exit_code != 0
    # Nor on the agent's shared network (of single-kernel sessions).
    single = ContainerSpec(get_main1, hostname="sub1")
    await runtime.create("x", "s-single", small_image, 0.5, 32 * MiB, single)
    x = await wait_exit(runtime, "x")
    assert x.exit is not None and x.exit.exit_code != 0
    assert nets(client, runtime.agent_network_name)

    [net] = nets(client, runtime.network_name("s"))
    assert net["Labels"] == {LABEL_AGENT: runtime.agent_id, LABEL_SESSION: "s"}
    # "w" and "h" ended: off the network already (their logs stay); "m" still serves on it.
    for kernel in ("w", "h"):
        assert _attached(client, runtime, kernel) == []
    assert _attached(client, runtime, "m") == [runtime.network_name("s")]
    assert await read_logs(runtime, "w") == b"hi\n"
    await runtime.destroy("w")
    assert nets(client, runtime.network_name("s"))  # "m" is still running on it
    await runtime.destroy("m")
    assert nets(client, runtime.network_name("s")) == []  # with the last running one
    assert b"far1" in await read_logs(runtime, "h")  # kept, readable
    # "o" ended, alone in its session: its network went with it.
    assert nets(client, runtime.network_name("s-other")) == []
    await runtime.destroy("x")
    assert nets(client, runtime.agent_network_name) == []


async def test_a_kill_from_outside_is_exit_137_in_list_kernels_and_watch_exits(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient
) -> None:
    await runtime.pull(small_image, lambda p: None)
    exits = Exits()
    runtime.watch_exits(exits)
    cid = await runtime.create("k", "s", small_image, 0.5, 32 * MiB, ContainerSpec(SLEEP_FOREVER))
    client.api.kill(cid)
    watched = await exits.of("k")
    assert watched.exit is not None and watched.exit.exit_code == 137
    listed = await wait_exit(runtime, "k")
    assert listed.exit == watched.exit


async def test_out_of_memory_is_reported(runtime: DockerRuntime, small_image: str) -> None:
    await runtime.pull(small_image, lambda p: None)
    spec = sh("dd if=/dev/zero of=/dev/null bs=64M count=1")  # a 64 MiB buffer in 8 MiB
    # Docker 20.10 (cgroup v1) misses the kernel's OOM notice now and then on a loaded host
    # (seen: 1-5 in 30 under 6 parallel runs; then only exit code 137): a few tries.
    seen = []
    for i in range(4):
        await runtime.create(f"k{i}", "s", small_image, 0.5, 8 * MiB, spec)
        k = await wait_exit(runtime, f"k{i}")
        assert k.exit is not None and k.exit.exit_code == 137, k.exit  # SIGKILL
        seen.append(k.exit.oom_killed)
        if k.exit.oom_killed:
            break
    assert seen[-1], seen


async def test_the_exit_watch_reconnects_and_stops_at_close(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient
) -> None:
    await runtime.pull(small_image, lambda p: None)
    exits = Exits()
    runtime.watch_exits(exits)
    [watcher] = runtime._watchers
    await _until(lambda: watcher.conn is not None and bool(watcher.conn.responses), 10)
    broken = watcher.conn
    assert broken is not None
    broken.abort()  # the stream breaks (as when the engine restarts): it reconnects
    await _until(lambda: watcher.conn is not broken, 10)
    cid = await runtime.create("k", "s", small_image, 0.5, 32 * MiB, ContainerSpec(SLEEP_FOREVER))
    client.api.kill(cid, signal="SIGTERM")  # init passes it on; sleep dies of it
    watched = await exits.of("k")
    assert watched.exit is not None and watched.exit.exit_code == 143  # 128 + SIGTERM

    await runtime.close()
    await asyncio.to_thread(watcher.thread.join, 5)
    assert not watcher.thread.is_alive()


def _attached(client: docker.DockerClient, rt: DockerRuntime, kernel_id: str) -> list[str]:
    """The networks the kernel's container is connected to now."""
    [c] = client.api.containers(
        all=True, filters={"label": [f"{LABEL_AGENT}={rt.agent_id}", f"{LABEL_KERNEL}={kernel_id}"]}
    )
    return sorted(c["NetworkSettings"]["Networks"] or {})


async def test_a_gpu_slot_without_a_gpu_driver_fails_with_dockers_reason(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient
) -> None:
    await runtime.pull(small_image, lambda p: None)
    spec = ContainerSpec(SLEEP_FOREVER, slots={"gpu": 1})
    with pytest.raises(KernelCreateError) as err:
        await runtime.create("k", "s", small_image, 0.5, 32 * MiB, spec)
    assert 'could not select device driver "" with capabilities: [[gpu]]' in err.value.reason
    assert await runtime.list_kernels() == []
    assert (
        client.api.containers(all=True, filters={"label": f"{LABEL_AGENT}={runtime.agent_id}"})
        == []
    )
    assert nets(client, runtime.network_name("s")) == []
    assert nets(client, runtime.agent_network_name) == []  # made for it, gone with it


async def test_slots_are_labelled_and_listed(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient
) -> None:
    await runtime.pull(small_image, lambda p: None)
    spec = ContainerSpec(SLEEP_FOREVER, slots={"tpu": 2, "cpu.fast": 0.5})
    cid = await runtime.create("k", "s", small_image, 0.5, 32 * MiB, spec)
    assert client.api.inspect_container(cid)["Config"]["Labels"][LABEL_SLOTS] == (
        '{"cpu.fast": 0.5, "tpu": 2}'
    )
    [k] = await runtime.list_kernels()
    assert k.slots == {"tpu": 2.0, "cpu.fast": 0.5}


async def test_many_single_kernel_sessions_share_one_network(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient, docker_engine: str
) -> None:
    # More sessions than the engine has address pools left (the test daemon has 8, a default
    # engine about 31): a network per session would fail. Each kernel here is a session of its
    # own, with a port, and the same hostname.
    await runtime.pull(small_image, lambda p: None)
    n = await asyncio.to_thread(free_address_pools, docker_engine) + 2
    spec = ContainerSpec(SLEEP_FOREVER, ports=[8080])
    # 0.5 cpu, not less: a container's start (runc's init) runs in its cgroup, and at 0.01 cpu
    # it took a second of throttling per container.
    ids = [f"k{i}" for i in range(n)]
    try:
        for batch in range(0, n, 8):
            await asyncio.gather(
                *(
                    runtime.create(k, f"s-{k}", small_image, 0.5, 8 * MiB, spec)
                    for k in ids[batch : batch + 8]
                )
            )
        kernels = await runtime.list_kernels()
        assert sorted(k.kernel_id for k in kernels) == sorted(ids)
        assert all(k.running for k in kernels)
        host_ports = {p.host_port for k in kernels for p in k.ports if p.port == 8080}
        assert len(host_ports) == n  # each published on a port of its own
        mine = client.api.networks(filters={"label": f"{LABEL_AGENT}={runtime.agent_id}"})
        assert [net["Name"] for net in mine] == [runtime.agent_network_name]
    finally:
        for batch in range(0, n, 8):
            await asyncio.gather(*(runtime.destroy(k) for k in ids[batch : batch + 8]))
    assert await runtime.list_kernels() == []
    assert nets(client, runtime.agent_network_name) == []


async def test_no_address_pool_for_a_sessions_network_says_what_to_do(
    runtime: DockerRuntime, small_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine's own words once its default pools are used up (its 32nd network).
    full = (
        "could not find an available, non-overlapping IPv4 address pool among the defaults to"
        " assign to the network"
    )

    def create_network(*args: object, **kwargs: object) -> None:
        response = requests.Response()
        response.status_code = 403
        raise docker.errors.APIError("403 Forbidden", response, explanation=full)

    monkeypatch.setattr(runtime.api, "create_network", create_network)
    spec = ContainerSpec(SLEEP_FOREVER, private_network=True)
    with pytest.raises(KernelCreateError) as err:
        await runtime.create("k", "s", small_image, 0.01, 8 * MiB, spec)
    reason = err.value.reason
    assert "no address pool left for the session's network" in reason, reason
    assert "default-address-pools in /etc/docker/daemon.json" in reason, reason
    assert "fewer multi-kernel sessions per agent" in reason and full in reason, reason
    assert await runtime.list_kernels() == []


# --- GPUs the agent picked ---


async def test_the_gpus_the_agent_picked_are_requested_by_id_and_labelled(
    runtime: DockerRuntime,
    small_image: str,
    client: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await runtime.pull(small_image, lambda p: None)
    sent: list[dict[str, Any]] = []
    create = runtime.api.create_container

    def recording(*args: Any, **kwargs: Any) -> Any:
        sent.append(kwargs)
        return create(*args, **kwargs)

    monkeypatch.setattr(runtime.api, "create_container", recording)
    spec = ContainerSpec(SLEEP_FOREVER, slots={"gpu": 2}, gpu_ids=("1", "GPU-3f0a"))
    with pytest.raises(KernelCreateError) as err:  # this engine has no GPU driver
        await runtime.create("k", "s", small_image, 0.5, 32 * MiB, spec)
    assert 'could not select device driver "" with capabilities: [[gpu]]' in err.value.reason
    [kwargs] = sent
    [request] = kwargs["host_config"]["DeviceRequests"]
    assert request["DeviceIDs"] == ["1", "GPU-3f0a"] and request["Capabilities"] == [["gpu"]]
    assert not request.get("Count")  # not "any two": exactly these
    assert kwargs["labels"][LABEL_GPUS] == "1,GPU-3f0a"
    assert await runtime.list_kernels() == []

    # An old caller (a gpu slot, no ids): any N, as before.
    sent.clear()
    with pytest.raises(KernelCreateError):
        await runtime.create("k", "s", small_image, 0.5, 32 * MiB, ContainerSpec(slots={"gpu": 2}))
    [request] = sent[0]["host_config"]["DeviceRequests"]
    assert request["Count"] == 2 and not request.get("DeviceIDs")
    assert LABEL_GPUS not in sent[0]["labels"]


async def test_list_kernels_tells_a_kernels_gpus_from_its_label(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient
) -> None:
    # As a previous agent process left it (a GPU host is not at hand: the container is only
    # created, with the labels create gives it).
    await runtime.pull(small_image, lambda p: None)
    labels = {
        LABEL_AGENT: runtime.agent_id,
        LABEL_KERNEL: "k",
        LABEL_SESSION: "s",
        LABEL_GPUS: "0,2",
    }
    client.api.create_container(
        small_image, labels=labels, host_config=client.api.create_host_config(network_mode="none")
    )
    [k] = await runtime.list_kernels()
    assert (k.kernel_id, k.gpu_ids, k.running) == ("k", ("0", "2"), False)


# --- Exec kill ---


def _exec_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("exec ")}


async def _kill_a_sleep(runtime: DockerRuntime) -> tuple[Any, float]:
    before = _exec_threads()
    run = await runtime.exec("k", ["sleep", "100"])
    await _until(lambda: bool(run.conn.responses), 10)  # its stream is open
    began = time.monotonic()
    await asyncio.wait_for(run.kill(), 10)
    await _until(lambda: _exec_threads() <= before, 5)  # its thread ended
    assert not run.thread.is_alive()
    return run, time.monotonic() - began


async def test_exec_kill_by_pid_when_the_daemon_is_local(
    runtime: DockerRuntime, small_image: str
) -> None:
    await runtime.pull(small_image, lambda p: None)
    await runtime.create("k", "s", small_image, 0.5, 32 * MiB, ContainerSpec(SLEEP_FOREVER))
    assert runtime.local
    run, took = await _kill_a_sleep(runtime)
    assert await asyncio.wait_for(run.wait(), 10) == 137 and took < 5


async def test_exec_kill_from_inside_when_the_pid_is_not_ours_to_signal(
    runtime: DockerRuntime, small_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An agent that is not root may not signal the container's processes: it kills the
    # command from inside the container (by its pid there), with a second exec.
    await runtime.pull(small_image, lambda p: None)
    await runtime.create("k", "s", small_image, 0.5, 32 * MiB, ContainerSpec(SLEEP_FOREVER))
    tried: list[int] = []

    def kill(pid: int, sig: int) -> None:
        tried.append(pid)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(docker_runtime.os, "kill", kill)
    run, took = await _kill_a_sleep(runtime)
    assert len(tried) == 1
    assert await asyncio.wait_for(run.wait(), 10) == 137 and took < 5


async def test_exec_kill_on_a_remote_daemon_closes_the_stream_and_signals_nothing_here(
    runtime: DockerRuntime, small_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await runtime.pull(small_image, lambda p: None)
    await runtime.create("k", "s", small_image, 0.5, 32 * MiB, ContainerSpec(SLEEP_FOREVER))

    def kill(pid: int, sig: int) -> None:
        raise AssertionError("a remote daemon's pid is not ours")

    monkeypatch.setattr(docker_runtime.os, "kill", kill)
    monkeypatch.setattr(runtime, "local", False)
    run, took = await _kill_a_sleep(runtime)
    assert took < 5 and [c async for c in run.output()] == []
    # The command runs on (until it ends); nobody waits for its stream.
    assert runtime.api.exec_inspect(run.exec_id)["Running"] is True


async def test_a_pid_of_another_container_is_not_signalled(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient
) -> None:
    await runtime.pull(small_image, lambda p: None)
    cid = await runtime.create("k", "s", small_image, 0.5, 32 * MiB, ContainerSpec(SLEEP_FOREVER))
    other = await runtime.create("o", "s", small_image, 0.5, 32 * MiB, ContainerSpec(SLEEP_FOREVER))
    pid = client.api.inspect_container(cid)["State"]["Pid"]
    assert _container_pid(pid, cid) == 1  # its init, pid 1 inside
    assert _container_pid(pid, other) is None
    assert _container_pid(os.getpid(), cid) is None


# --- Bounded streams ---


TWENTY_MB = 20_000_000


async def test_a_chatty_exec_read_slowly_holds_a_bounded_buffer(
    runtime: DockerRuntime, small_image: str
) -> None:
    await runtime.pull(small_image, lambda p: None)
    await runtime.create("k", "s", small_image, 0.5, 32 * MiB, ContainerSpec(SLEEP_FOREVER))
    run = await runtime.exec("k", ["sh", "-c", f"yes | head -c {TWENTY_MB}"])
    got = 0
    chunks = 0
    async for chunk in run.output():
        assert set(chunk) <= set(b"y\n")
        got += len(chunk)
        chunks += 1
        await asyncio.sleep(0.02)  # a slow reader: the thread waits for it
        assert run.handoff.peak <= HANDOFF_BYTES + 256 * 1024
    assert got == TWENTY_MB  # nothing lost
    assert await run.wait() == 0
    assert chunks < 200  # coalesced (about 1 MiB each while the reader lags), not 10^4 frames
    assert run.handoff.peak >= HANDOFF_BYTES // 2  # the reader lagged: it filled up


async def test_a_big_log_comes_in_few_chunks_and_an_unread_one_is_bounded(
    runtime: DockerRuntime, small_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await runtime.pull(small_image, lambda p: None)
    # Lines of 1000 bytes: the engine logs a message per line, so not "y\n" lines here.
    script = f"yes $(printf 'y%.0s' $(seq 999)) | head -c {TWENTY_MB}"
    await runtime.create("k", "s", small_image, 0.5, 64 * MiB, sh(script))
    await wait_exit(runtime, "k", 60)

    handoffs: list[Any] = []
    real = docker_runtime._Handoff

    def recording(*args: Any, **kwargs: Any) -> Any:
        handoffs.append(h := real(*args, **kwargs))
        return h

    monkeypatch.setattr(docker_runtime, "_Handoff", recording)
    got, chunks = 0, 0
    async for chunk in runtime.logs("k", None, follow=False):
        got += len(chunk)
        chunks += 1
    assert got == TWENTY_MB
    [h] = handoffs
    assert h.wakeups <= chunks + 2  # one loop callback per batch
    assert chunks < 1000, chunks  # 20 000 lines, coalesced
    assert h.peak <= HANDOFF_BYTES + 64 * 1024

    # Nobody reads: the thread stops at the bound; closing the stream ends the thread.
    threads = _stream_threads()
    stream = runtime.logs("k", None, follow=False)
    first = await anext(stream)
    [_, h] = handoffs
    await asyncio.sleep(1)
    assert len(first) + h.peak <= 2 * HANDOFF_BYTES + 64 * 1024
    assert h.peak <= HANDOFF_BYTES + 64 * 1024
    await stream.aclose()
    await _until(lambda: _stream_threads() <= threads, 5)


# --- Session networks go when their containers end ---


async def test_a_sessions_network_goes_when_its_kernels_end_and_they_stay_readable(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient
) -> None:
    await runtime.pull(small_image, lambda p: None)
    exits = Exits()
    runtime.watch_exits(exits)
    net = runtime.network_name("s")
    up = ContainerSpec(SLEEP_FOREVER, hostname="main1", private_network=True)
    a = await runtime.create("a", "s", small_image, 0.5, 32 * MiB, up)
    done = ContainerSpec(["sh", "-c", "echo a line"], hostname="sub1", private_network=True)
    await runtime.create("b", "s", small_image, 0.5, 32 * MiB, done)
    await exits.of("b")  # the die event alone (no list_kernels) disconnects it
    await _until(lambda: _attached(client, runtime, "b") == [], 10)
    assert _attached(client, runtime, "a") == [net] and nets(client, net)

    client.api.kill(a)
    await exits.of("a")
    await _until(lambda: nets(client, net) == [], 10)  # no running container is on it
    assert _attached(client, runtime, "a") == []
    assert await read_logs(runtime, "b") == b"a line\n"
    kept = {k.kernel_id: k for k in await runtime.list_kernels()}
    assert set(kept) == {"a", "b"} and kept["a"].exit is not None
    assert kept["a"].exit.exit_code == 137  # type: ignore[union-attr]


async def test_list_kernels_releases_a_network_no_die_event_released(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient
) -> None:
    # No watch_exits: the agent's polling list_kernels finds the ended kernel.
    await runtime.pull(small_image, lambda p: None)
    spec = ContainerSpec(["true"], private_network=True)
    await runtime.create("k", "s", small_image, 0.5, 32 * MiB, spec)
    await wait_exit(runtime, "k")
    assert nets(client, runtime.network_name("s")) == []
    assert _attached(client, runtime, "k") == []


async def test_more_multi_kernel_sessions_than_address_pools_over_time(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient, docker_engine: str
) -> None:
    # More sessions than the engine has address pools (the test daemon's 8, a default engine's
    # about 31), half as many at a time: kept ended kernels must not hold their networks.
    await runtime.pull(small_image, lambda p: None)
    pools = await asyncio.to_thread(free_address_pools, docker_engine)
    at_once = max(1, pools // 2)
    total = pools + at_once
    # 0.5 cpu: see test_many_single_kernel_sessions_share_one_network.
    spec = ContainerSpec(["true"], private_network=True)
    for batch in range(0, total, at_once):
        ids = range(batch, min(batch + at_once, total))
        await asyncio.gather(
            *(runtime.create(f"k{i}", f"s{i}", small_image, 0.5, 8 * MiB, spec) for i in ids)
        )
        for i in ids:
            await wait_exit(runtime, f"k{i}")
    assert len(await runtime.list_kernels()) == total > pools
    assert client.api.networks(filters={"label": f"{LABEL_AGENT}={runtime.agent_id}"}) == []


async def test_prune_removes_networks_a_crash_left(
    runtime: DockerRuntime, small_image: str, client: docker.DockerClient, docker_engine: str
) -> None:
    await runtime.pull(small_image, lambda p: None)
    mine = runtime.agent_id
    # A crash after the network's create, before its container's: nothing is on them.
    client.api.create_network(
        runtime.network_name("lost"), labels={LABEL_AGENT: mine, LABEL_SESSION: "lost"}
    )
    client.api.create_network(runtime.agent_network_name, labels={LABEL_AGENT: mine})
    # A session with a running kernel keeps its network; another agent's are not ours.
    up = ContainerSpec(SLEEP_FOREVER, private_network=True)
    await runtime.create("k", "live", small_image, 0.5, 32 * MiB, up)
    theirs = f"hoist-{uuid.uuid4().hex[:6]}.x"
    client.api.create_network(theirs, labels={LABEL_AGENT: "someone-else"})
    try:
        restarted = DockerRuntime(mine, base_url=docker_engine)
        try:
            await restarted.list_kernels()  # its first: prunes
            assert nets(client, runtime.network_name("lost")) == []
            assert nets(client, runtime.agent_network_name) == []
            assert nets(client, runtime.network_name("live"))
            assert nets(client, theirs)
            assert await restarted.prune_networks() == []
        finally:
            await restarted.close()
    finally:
        client.api.remove_network(theirs)


async def test_network_names_of_odd_ids_do_not_clash(
    small_image: str, client: docker.DockerClient, docker_engine: str
) -> None:
    # Agent "p-b" (its shared network) vs agent "p" session "b" (a private one): once both
    # "hoist-p-b". And container names: agent "p-b" kernel "k" vs agent "p" kernel "b-k".
    p = f"test-{uuid.uuid4().hex[:6]}"
    one = DockerRuntime(f"{p}-b", base_url=docker_engine)
    two = DockerRuntime(p, base_url=docker_engine)
    try:
        await one.pull(small_image, lambda x: None)
        assert one.agent_network_name != two.network_name("b")
        await one.create("k", "s", small_image, 0.5, 32 * MiB, ContainerSpec(SLEEP_FOREVER))
        spec = ContainerSpec(SLEEP_FOREVER, private_network=True)
        await two.create("b-k", "b", small_image, 0.5, 32 * MiB, spec)
        assert [k.kernel_id for k in await one.list_kernels()] == ["k"]
        assert [k.kernel_id for k in await two.list_kernels()] == ["b-k"]
        assert nets(client, one.agent_network_name)[0]["Labels"] == {LABEL_AGENT: f"{p}-b"}
        assert nets(client, two.network_name("b"))[0]["Labels"][LABEL_AGENT] == p
        await one.destroy("k")
        assert nets(client, two.network_name("b"))  # not the other agent's to remove
        await two.destroy("b-k")
        assert nets(client, two.network_name("b")) == []
    finally:
        for rt in (one, two):
            for k in await rt.list_kernels():
                await rt.destroy(k.kernel_id)
            await rt.close()


# --- Volumes: cheaply ---


async def test_volume_names_and_list_volumes_make_one_call_each(
    runtime: DockerRuntime, small_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await runtime.pull(small_image, lambda p: None)
    vols = [f"v{i}-{uuid.uuid4().hex[:4]}" for i in range(3)]
    for i, v in enumerate(vols):
        spec = ContainerSpec(["true"], mounts=[VolumeMount(v, "/d")], owner="alice")
        await runtime.create(f"k{i}", "s", small_image, 0.5, 32 * MiB, spec)
    calls: defaultdict[str, int] = defaultdict(int)
    for name in ("containers", "volumes", "inspect_volume", "inspect_container"):
        real = getattr(runtime.api, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(runtime.api, name, counted)
    assert await runtime.volume_names() == sorted(vols)
    assert dict(calls) == {"volumes": 1}
    calls.clear()
    listed = await runtime.list_volumes()
    assert dict(calls) == {"volumes": 1, "containers": 1}
    assert [(v.name, v.owner, v.used_by) for v in listed] == [
        (v, "alice", (f"k{vols.index(v)}",)) for v in sorted(vols)
    ]
