"""The agent's kernel bookkeeping on the dummy runtime: GPUs handed out one kernel each,
containers that are not running without an exit, KernelExited once per container (heartbeat
races, a kill's late exit, a restart), streams with a waiting reader, logs of no container,
exits reported while the agent stops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agent.runtime.base import ExitInfo, KernelContainer, KernelNotFound
from agent.runtime.dummy import DummyConfig, DummyHost, DummyRuntime
from agent.streams import Streams
from domain import events as ev
from domain import rpc
from eventstore.store import EventStore
from tests.agent.agent_harness import (
    agent_events,
    call,
    config,
    event_of,
    running,
    store_fixture,  # noqa: F401 - the `store` fixture
    wait_for,
)
from transport.client import Client

MB = 1024 * 1024
GB = 1024 * MB
GPU = {"cpu": 1, "mem": 256 * MB, "slots": {"gpu": 1}}


def dummy(host: DummyHost | None = None, **cfg: Any) -> DummyRuntime:
    values: dict[str, Any] = {"bandwidth_bps": None, "preloaded": {"base:1"}}
    return DummyRuntime("a1", DummyConfig(**{**values, **cfg}), host=host)


def kernel(kid: str, command: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "kernel_id": kid,
        "session_id": "s1",
        "image": "base:1",
        "resources": {"cpu": 1, "mem": 256 * MB},
        "spec": {"command": command} if command is not None else {},
        **extra,
    }


async def exits(store: EventStore, kernel_id: str | None = None) -> list[ev.KernelExited]:
    return [
        e
        for e in await agent_events(store, "a1")
        if isinstance(e, ev.KernelExited) and kernel_id in (None, e.kernel_id)
    ]


# -- GPUs ---------------------------------------------------------------------------------------


async def test_each_gpu_goes_to_one_kernel_and_comes_back_when_it_ends(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy(slots={"gpu": 2})
    cfg = config("a1", slots={"gpu": 2.0}, heartbeat_interval_s=60)
    assert cfg.gpu_ids == ("0", "1")
    async with running(nc, store, runtime, cfg) as agent:
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k1", resources=GPU))
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k2", ["sleep", "0.3"], resources=GPU))
        given = {kid: runtime.kernels[kid].spec.gpu_ids for kid in ("k1", "k2")}
        assert sorted(given.values()) == [("0",), ("1",)]  # different GPUs, not GPU 0 twice
        assert {k.kernel_id: k.gpu_ids for k in await runtime.list_kernels()} == given
        third = await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k3", resources=GPU))
        assert third["error"]["code"] == "insufficient-resources", third

        half = {**GPU, "slots": {"gpu": 0.5}}
        refused = await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k4", resources=half))
        assert refused["error"]["code"] == "invalid-request"
        assert "resources.gpu must be a whole number" in refused["error"]["message"]

        await event_of(store, "a1", ev.KernelExited, kernel_id="k2")  # its GPU is free again
        third = await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k3", resources=GPU))
        assert "container_id" in third, third
        assert runtime.kernels["k3"].spec.gpu_ids == given["k2"]
        assert agent.room.gpus == {"k1": given["k1"], "k3": given["k2"]}

    # A restarted agent knows which GPUs its running kernels hold (k2's ended container none).
    restarted = dummy(runtime.host, slots={"gpu": 2})
    async with running(nc, store, restarted, cfg) as agent:
        assert agent.room.gpus == {"k1": given["k1"], "k3": given["k2"]}
        full = await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k5", resources=GPU))
        assert full["error"]["code"] == "insufficient-resources", full
        await call(nc, "a1", rpc.DESTROY_KERNEL, {"kernel_id": "k1"})
        assert agent.room.gpus == {"k3": given["k2"]}
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k5", resources=GPU))
        assert restarted.kernels["k5"].spec.gpu_ids == given["k1"]


async def test_gpu_ids_named_in_the_config_are_handed_out(nc: Client, store: EventStore) -> None:
    runtime = dummy(slots={"gpu": 2})
    cfg = config("a1", slots={"gpu": 2.0}, gpu_ids=("GPU-aaa", "GPU-bbb"))
    two = {**GPU, "slots": {"gpu": 2}}
    async with running(nc, store, runtime, cfg) as agent:
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k1", resources=two))
        assert runtime.kernels["k1"].spec.gpu_ids == ("GPU-aaa", "GPU-bbb")
        failed = await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k2", resources=GPU))
        assert failed["error"]["code"] == "insufficient-resources"
        assert agent.room.gpus == {"k1": ("GPU-aaa", "GPU-bbb")}  # a failed create holds none


# -- containers not running, without an exit ----------------------------------------------------


async def test_a_container_not_running_without_an_exit_is_not_kept(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy()
    async with running(nc, store, runtime, config("a1", heartbeat_interval_s=60)) as agent:
        for kid in ("k1", "k2", "k3"):
            await call(nc, "a1", rpc.CREATE_KERNEL, kernel(kid))
            runtime.kernels[kid].stopped = True  # created, never started (or paused)
        old = runtime.kernels["k3"].container_id
        beat = await agent.send_heartbeat()
        assert {k.status for k in beat.kernels} == {"running"}  # not "exited": no end

        # A create-kernel asked again does not take it for the kernel's container.
        again = await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k3"))
        assert not again.get("existed") and again["container_id"] != old
        assert runtime.kernels["k3"].running

        # sync-kernels destroys them, known or not (k1 the manager thinks running).
        synced = await call(nc, "a1", rpc.SYNC_KERNELS, {"running": ["k1", "k3"]})
        assert synced == {
            "running": ["k3"],
            "terminating": [],
            "terminated": ["k1"],
            "destroyed": ["k2"],
        }
        assert set(runtime.kernels) == {"k3"}
    assert await exits(store) == []


# -- KernelExited once per container ------------------------------------------------------------


async def test_an_exit_noted_while_a_heartbeat_lists_is_not_recorded_again(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy()
    async with running(nc, store, runtime, config("a1", heartbeat_interval_s=60)) as agent:
        list_images = runtime.list_images

        async def slow_list_images() -> Any:
            # After the beat's listing: a kernel starts, ends and its exit is noted.
            await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k1", ["true"]))
            await wait_for(lambda: agent.exits.noted, 5, "k1's exit noted")
            return await list_images()

        runtime.list_images = slow_list_images  # type: ignore[method-assign]
        await agent.send_heartbeat()  # its listing has no k1
        runtime.list_images = list_images  # type: ignore[method-assign]
        await event_of(store, "a1", ev.KernelExited, kernel_id="k1")
        for _ in range(3):
            await agent.send_heartbeat()
        await asyncio.sleep(0.2)
    assert len(await exits(store, "k1")) == 1


async def test_the_exit_of_a_container_the_agent_destroyed_is_never_recorded(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy()
    async with running(nc, store, runtime, config("a1", heartbeat_interval_s=60)) as agent:
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k1"))
        [k] = await runtime.list_kernels()
        await call(nc, "a1", rpc.DESTROY_KERNEL, {"kernel_id": "k1"})
        # The kill's die event, after the destroy returned (docker's watcher may be late).
        agent.exits.on_exit(
            KernelContainer("k1", "s1", k.container_id, "base:1", False, exit=ExitInfo(137))
        )
        # The kernel made again: its own exit is recorded.
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k1", ["sh", "-c", "exit 4"]))
        exited = await event_of(store, "a1", ev.KernelExited, kernel_id="k1")
        await asyncio.sleep(0.2)
        assert "k1" in runtime.kernels  # the late event removed nothing
    assert exited.exit_code == 4 and len(await exits(store)) == 1


async def test_a_restarted_agent_does_not_record_kept_exits_again(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy()
    cfg = config("a1")
    async with running(nc, store, runtime, cfg):
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k1", ["sh", "-c", "exit 3"]))
        await call(nc, "a1", rpc.CREATE_KERNEL, kernel("k2"))
        await event_of(store, "a1", ev.KernelExited, kernel_id="k1")
    # k2 ends while no agent runs: that exit is new.
    runtime.kernels["k2"].exit = ExitInfo(9, ran_s=1.5, finished_at=1e10)
    restarted = dummy(runtime.host)
    async with running(nc, store, restarted, cfg) as agent:
        await event_of(store, "a1", ev.KernelExited, kernel_id="k2")
        for _ in range(3):
            await agent.send_heartbeat()
        await asyncio.sleep(0.3)
    assert [(e.kernel_id, e.exit_code) for e in await exits(store)] == [("k1", 3), ("k2", 9)]


async def test_an_exit_reported_while_the_agent_stops_spawns_nothing(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy()
    agent_ref: list[Any] = []
    close = runtime.close

    async def close_with_a_late_exit() -> None:
        # The runtime's exit watch still runs after the agent's tasks stopped.
        agent = agent_ref[0]
        ended = KernelContainer("k9", "s1", "c" * 64, "base:1", False, exit=ExitInfo(1))
        runtime.host.exit_listeners[0](ended)
        assert len(agent._tasks) == 0
        await close()

    runtime.close = close_with_a_late_exit  # type: ignore[method-assign]
    async with running(nc, store, runtime, config("a1")) as agent:
        agent_ref.append(agent)
    await asyncio.sleep(0.1)
    assert await exits(store) == []


# -- streams and logs ---------------------------------------------------------------------------


async def test_a_stream_with_a_reader_waiting_is_not_idle() -> None:
    streams = Streams("a1", idle_s=0.2)

    async def quiet() -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""

    stream = streams.logs(quiet(), "s1")
    try:
        reading = asyncio.create_task(stream.read(0, 1.0, 100))
        await asyncio.sleep(0.5)  # longer than idle_s: the reader waits all the while
        streams.expire()
        assert stream.id in streams.open
        chunk = await reading
        assert (chunk.data, chunk.done, chunk.reason) == (b"", False, None)
        streams.expire()
        assert stream.id in streams.open  # just read
        await asyncio.sleep(0.3)
        streams.expire()
        assert stream.id not in streams.open  # nobody reads it now
    finally:
        await streams.stop()


class LazyLogsRuntime(DummyRuntime):
    """Like the docker runtime: logs is an async generator (KernelNotFound at its first read)."""

    async def logs(  # type: ignore[override]
        self, kernel_id: str, tail: int | None, follow: bool
    ) -> AsyncIterator[bytes]:
        kernel = self.kernels.get(kernel_id)
        if kernel is None:
            raise KernelNotFound(kernel_id)
        async for chunk in kernel.out.read(kernel.out.tail_offset(tail), follow):
            yield chunk


async def test_logs_of_a_kernel_without_a_container_is_not_found(
    nc: Client, store: EventStore
) -> None:
    for runtime in (dummy(), LazyLogsRuntime("a1", DummyConfig(preloaded={"base:1"}))):
        async with running(nc, store, runtime, config("a1")) as agent:
            refused = await call(nc, "a1", rpc.LOGS, {"kernel_id": "nope"})
            assert refused["error"]["code"] == "not-found", refused
            assert "no container for kernel nope" in refused["error"]["message"]
            assert agent.streams.open == {}


async def test_the_heartbeat_lists_volume_names_only(nc: Client, store: EventStore) -> None:
    runtime = dummy()
    listed: list[int] = []
    list_volumes = runtime.list_volumes

    async def counted() -> Any:
        listed.append(1)
        return await list_volumes()

    runtime.list_volumes = counted  # type: ignore[method-assign]
    async with running(nc, store, runtime, config("a1", heartbeat_interval_s=60)) as agent:
        spec = {"mounts": [{"volume": "data", "path": "/data"}]}
        await call(nc, "a1", rpc.CREATE_KERNEL, {**kernel("k1"), "spec": spec})
        assert (await agent.send_heartbeat()).volumes == ["data"]
    assert runtime.volume_listings >= 1 and listed == []


async def test_a_listing_that_fails_still_sends_a_heartbeat(nc: Client, store: EventStore) -> None:
    """A runtime that cannot list (an engine under load, a container it cannot read) must not
    make a live agent look dead: the beat goes out with the last listing."""
    runtime = DummyRuntime("a1", DummyConfig())
    async with running(nc, store, runtime, config("a1")) as agent:
        first = await agent.send_heartbeat()

        async def broken() -> list[Any]:
            raise TypeError("cannot read a container")

        runtime.list_kernels = broken  # type: ignore[method-assign]
        again = await agent.send_heartbeat()
        assert again.kernels == first.kernels
        assert again.sent_at > first.sent_at
