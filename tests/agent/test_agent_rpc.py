"""The agent process in-process on the dummy runtime: registration, heartbeats, every verb."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from agent import room, spares
from agent.image_verbs import first_few
from agent.runtime.base import KernelContainer
from agent.runtime.dummy import DummyConfig, DummyHost, DummyRuntime
from agent.server import AgentServer
from domain import events as ev
from domain import rpc, subjects
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
from transport import progress
from transport.client import Client

MB = 1024 * 1024
GB = 1024 * MB
KERNEL = {"session_id": "s1", "image": "base:1", "resources": {"cpu": 1, "mem": 256 * MB}}


def dummy(agent_id: str = "a1", host: DummyHost | None = None, **cfg: object) -> DummyRuntime:
    values: dict[str, object] = {
        "default_size": 8 * MB,
        "bandwidth_bps": 40 * MB,
        "tick_s": 0.02,
        "preloaded": {"base:1"},
    }
    return DummyRuntime(agent_id, DummyConfig(**{**values, **cfg}), host)  # type: ignore[arg-type]


async def test_every_verb_has_its_handler(nc: Client, store: EventStore) -> None:
    """The verbs are listed once (rpc.REQUESTS): the agent answers each, and nothing else."""
    agent = AgentServer(nc, config("a1"), dummy(), store)
    assert set(agent.handlers) == set(rpc.REQUESTS)
    assert all(callable(handler) for handler in agent.handlers.values())


async def test_registers_with_capacity_and_images_then_heartbeats(
    nc: Client, store: EventStore
) -> None:
    beats: list[rpc.Heartbeat] = []

    async def on_beat(msg: object) -> None:
        beats.append(msgspec.json.decode(msg.data, type=rpc.Heartbeat))  # type: ignore[attr-defined]

    await nc.subscribe(subjects.heartbeat("a1"), cb=on_beat)
    cfg = config("a1", cpu=4, mem=8 * GB, disk=100 * GB)
    async with running(nc, store, dummy(), cfg) as agent:
        assert agent.first_registration is True
        [registered] = await agent_events(store, "a1")
        assert isinstance(registered, ev.AgentRegistered)
        assert registered.capacity == ev.Capacity(cpu=4, mem=8 * GB, disk=100 * GB)
        assert (registered.resource_group, registered.runtime) == ("rg", "dummy")
        assert set(registered.images) == {"docker.io/library/base:1"}  # canonical
        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k1", **KERNEL})
        await wait_for(lambda: len(beats) >= 3 and beats[-1].kernels, 5, "heartbeats")
    beat = beats[-1]
    assert (
        beat.agent_id == "a1" and beat.images == ["docker.io/library/base:1"] and beat.pulls == {}
    )
    assert [(k.kernel_id, k.status) for k in beat.kernels] == [("k1", "running")]
    assert beat.free == rpc.FreeCapacity(cpu=3, mem=8 * GB - 256 * MB, disk=100 * GB - 8 * MB)


async def test_check_and_pull_gives_one_task_progress_and_events(
    nc: Client, store: EventStore
) -> None:
    async with (
        running(nc, store, dummy(), config("a1")),
        progress_log(nc, "a1") as seen,
    ):
        replies = await asyncio.gather(
            *(call(nc, "a1", rpc.CHECK_AND_PULL, {"images": ["base:1", "new:1"]}) for _ in range(5))
        )
        present = replies[0]["base:1"]
        assert present["present"] is True and present["digest"].startswith("sha256:")
        task_ids = {r["new:1"]["task_id"] for r in replies}
        assert len(task_ids) == 1
        [task_id] = task_ids
        started = await event_of(store, "a1", ev.ImagePullStarted, image="new:1")
        assert started.task_id == task_id
        pulled = await event_of(store, "a1", ev.ImagePulled, image="new:1")
        assert (pulled.task_id, pulled.size_bytes) == (task_id, 8 * MB)
        status = await call(nc, "a1", rpc.PULL_STATUS, {"task_id": task_id})
        assert status == {
            "task_id": task_id,
            "known": True,
            "image": "docker.io/library/new:1",
            "state": "done",
            "current": 8 * MB,
            "total": 8 * MB,
        }
        again = await call(nc, "a1", rpc.CHECK_AND_PULL, {"images": ["new:1"]})
        assert again["new:1"]["present"] is True
        unknown = await call(nc, "a1", rpc.PULL_STATUS, {"task_id": "nope"})
        assert unknown == {"task_id": "nope", "known": False}
    ours = seen.of(task_id)
    currents = [p.current for p in ours]
    assert currents == sorted(currents) and ours[-1].done and ours[-1].current == 8 * MB
    # A late watcher reads the final state from the stream.
    late = await progress.latest(nc.jetstream(), "a1", task_id)
    assert late is not None and late.done and late.current == late.total == 8 * MB
    events = [type(e).__name__ for e in await agent_events(store, "a1")]
    assert events == ["AgentRegistered", "ImagePullStarted", "ImagePulled"]


async def test_a_failed_pull_is_recorded_with_its_reason(nc: Client, store: EventStore) -> None:
    async with running(nc, store, dummy(default_size=None), config("a1")):
        reply = await call(nc, "a1", rpc.CHECK_AND_PULL, {"images": ["ghost:1"]})
        failed = await event_of(store, "a1", ev.ImagePullFailed, image="ghost:1")
        assert failed.task_id == reply["ghost:1"]["task_id"]
        assert "not found" in failed.reason


async def test_create_kernel_is_idempotent_and_destroy_removes_it(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy()
    async with running(nc, store, runtime, config("a1", cpu=2, mem=GB)) as server:
        replies = await asyncio.gather(
            *(call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k1", **KERNEL}) for _ in range(5))
        )
        assert len({r["container_id"] for r in replies}) == 1
        assert sum(not r.get("existed", False) for r in replies) == 1
        assert list(runtime.kernels) == ["k1"]

        too_big = {**KERNEL, "resources": {"cpu": 1.5, "mem": 256 * MB}}
        refused = await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k2", **too_big})
        assert refused["error"]["code"] == "insufficient-resources"
        no_image = {**KERNEL, "image": "absent:1"}
        failed = await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k3", **no_image})
        assert failed["error"]["code"] == "image-missing"  # the manager pulls it and asks again
        assert "pull it" in failed["error"]["message"]
        assert "k3" not in runtime.kernels and "k3" not in server.room.reserved

        assert await call(nc, "a1", rpc.DESTROY_KERNEL, {"kernel_id": "k1"}) == {"destroyed": True}
        assert runtime.kernels == {}
        assert await call(nc, "a1", rpc.DESTROY_KERNEL, {"kernel_id": "k1"}) == {"destroyed": False}


async def test_a_create_in_flight_is_kept_by_a_sync_that_does_not_list_it_yet(
    nc: Client, store: EventStore
) -> None:
    """A sync built before the manager placed k1 (its view lags) arrives while k1's create
    runs: k1 is the manager's, and stays."""
    runtime = dummy(create_delay_s=0.3)
    async with running(nc, store, runtime, config("a1")):
        creating = asyncio.create_task(
            call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k1", **KERNEL})
        )
        await asyncio.sleep(0.1)
        synced = await call(nc, "a1", rpc.SYNC_KERNELS, {})
        assert "container_id" in await creating
        assert "error" not in synced and not synced.get("destroyed"), synced
        assert list(runtime.kernels) == ["k1"]


async def test_a_create_waits_for_the_room_a_create_in_flight_will_free(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k1 (all 2 cpu) is cancelled while its 0.3 s create runs, so the manager places k2 in
    its room and destroys k1 once it has recorded k1's create reply (a few ms after the create
    ended here): k2's create waits for that destroy (ROOM_GRACE_S), and fits."""
    # 0.2 s by default: a margin for a loaded host between the create's end and the destroy
    monkeypatch.setattr(room, "ROOM_GRACE_S", 1.0)
    runtime = dummy(create_delay_s=0.3)
    big = {**KERNEL, "resources": {"cpu": 2, "mem": 256 * MB}}
    async with running(nc, store, runtime, config("a1", cpu=2, mem=GB)):
        first = asyncio.create_task(call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k1", **big}))
        await asyncio.sleep(0.1)
        second = asyncio.create_task(
            call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k2", **big}, within=10)
        )
        assert "container_id" in await first
        await asyncio.sleep(0.05)  # the manager records the reply, then asks for the destroy
        assert not second.done()
        destroyed = await call(nc, "a1", rpc.DESTROY_KERNEL, {"kernel_id": "k1"})
        assert destroyed == {"destroyed": True}
        made = await second
        assert "container_id" in made, made
        assert list(runtime.kernels) == ["k2"]


async def test_a_create_that_comes_after_the_create_ended_waits_for_the_destroy_too(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k1's create ended before k2's came (the manager placed k2 in k1's room, k1 being
    cancelled meanwhile); the destroy of k1 is still on its way: k2 waits for it."""
    # 0.2 s by default: a margin for a loaded host between the create's end and the destroy
    monkeypatch.setattr(room, "ROOM_GRACE_S", 1.0)
    runtime = dummy()
    big = {**KERNEL, "resources": {"cpu": 2, "mem": 256 * MB}}
    async with running(nc, store, runtime, config("a1", cpu=2, mem=GB)):
        assert "container_id" in await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k1", **big})
        second = asyncio.create_task(
            call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k2", **big}, within=10)
        )
        await asyncio.sleep(0.05)
        assert await call(nc, "a1", rpc.DESTROY_KERNEL, {"kernel_id": "k1"}) == {"destroyed": True}
        made = await second
        assert "container_id" in made, made


async def test_creates_that_do_not_fit_are_refused_without_waiting_for_each_other(
    nc: Client, store: EventStore
) -> None:
    """k2 and k3 (2 cpu each) do not fit beside k1 (2 of 3 cpu) and wait while k0's create
    (1 cpu, 0.5 s) runs; once it is done (and ROOM_GRACE_S passed without a destroy), neither
    waits for the other, which frees nothing (ROOM_WAIT_S is 5 s; the calls allow 3)."""
    runtime = dummy(create_delay_s=0.5)
    big = {**KERNEL, "resources": {"cpu": 2, "mem": 256 * MB}}
    async with running(nc, store, runtime, config("a1", cpu=3, mem=GB)):
        assert "container_id" in await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k1", **big})
        small = asyncio.create_task(
            call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k0", **KERNEL})
        )
        await asyncio.sleep(0.1)
        refused = await asyncio.gather(
            *(
                call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": k, **big}, within=3)
                for k in ("k2", "k3")
            )
        )
        assert [r["error"]["code"] for r in refused] == ["insufficient-resources"] * 2
        assert "asks cpu 2, mem 256 MiB (free cpu 0, mem 512 MiB)" in refused[0]["error"]["message"]
        assert "container_id" in await small


async def test_sync_kernels_reconciles_with_the_managers_truth(
    nc: Client, store: EventStore
) -> None:
    runtime = dummy()
    async with running(nc, store, runtime, config("a1")):
        for kid in ("k-run", "k-stray", "k-stop"):
            await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": kid, **KERNEL})
        truth = {
            "preparing": ["k-prep"],
            "running": ["k-run", "k-gone"],
            "terminating": ["k-stop"],
        }
        reply = await call(nc, "a1", rpc.SYNC_KERNELS, truth)
        assert reply == {
            "running": ["k-run"],
            "terminating": [],
            "terminated": ["k-gone", "k-stop"],
            "destroyed": ["k-stray"],
        }
        assert list(runtime.kernels) == ["k-run"]


async def test_a_sync_from_a_view_behind_a_create_spares_its_container(
    nc: Client, store: EventStore
) -> None:
    """A manager whose view has folded up to seq 10 does not know k-new, asked for from seq 12
    (another manager's create, seen by a lagging one): kept until a view past 12 still
    does not know it.  A container asked for without a sequence, or from one the view passed,
    is destroyed as a stray."""
    runtime = dummy()
    async with running(nc, store, runtime, config("a1")):
        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k-new", **KERNEL, "seq": 12})
        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k-old", **KERNEL, "seq": 9})
        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k-any", **KERNEL})
        reply = await call(nc, "a1", rpc.SYNC_KERNELS, {"view_seq": 10})
        assert (reply["destroyed"], reply["spared"]) == (["k-any", "k-old"], ["k-new"])
        assert list(runtime.kernels) == ["k-new"]
        older = await call(nc, "a1", rpc.SYNC_KERNELS, {})  # a manager that sends no view_seq
        assert (older["destroyed"], older.get("spared", [])) == (["k-new"], [])
        assert runtime.kernels == {}

        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k-new", **KERNEL, "seq": 12})
        assert (await call(nc, "a1", rpc.SYNC_KERNELS, {"view_seq": 11}))["spared"] == ["k-new"]
        passed = await call(nc, "a1", rpc.SYNC_KERNELS, {"view_seq": 12})
        assert (passed["destroyed"], passed.get("spared", [])) == (["k-new"], [])
        # A destroy forgets the sequence: made again without one, it spares nothing
        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k-new", **KERNEL, "seq": 12})
        assert await call(nc, "a1", rpc.DESTROY_KERNEL, {"kernel_id": "k-new"}) == {
            "destroyed": True
        }
        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k-new", **KERNEL})
        again = await call(nc, "a1", rpc.SYNC_KERNELS, {"view_seq": 10})
        assert (again["destroyed"], again.get("spared", [])) == (["k-new"], [])
        for bad_seq in (-1, 2**64, "7", 1.5):
            bad = await call(nc, "a1", rpc.SYNC_KERNELS, {"view_seq": bad_seq})
            assert "view_seq" in bad["error"]["message"], bad
            refused = await call(
                nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k-bad", **KERNEL, "seq": bad_seq}
            )
            assert "$.seq" in refused["error"]["message"], refused
        assert "k-bad" not in runtime.kernels


async def test_a_create_asked_again_while_a_sync_waits_to_destroy_keeps_its_container(
    nc: Client, store: EventStore
) -> None:
    """The sync found k1 unknown; before it took k1's lock, a manager past its view asked for
    k1 again (it exists: ``existed``): checked again under the lock, k1 stays."""
    runtime = dummy()
    async with running(nc, store, runtime, config("a1")) as agent:
        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k1", **KERNEL})
        stray = agent.strays.destroy_stray

        async def late(kernel_id: str, view_seq: int | None) -> bool:
            await asyncio.sleep(0.3)  # the create below comes first
            return await stray(kernel_id, view_seq)

        agent.strays.destroy_stray = late  # type: ignore[method-assign]
        syncing = asyncio.create_task(call(nc, "a1", rpc.SYNC_KERNELS, {"view_seq": 10}))
        await asyncio.sleep(0.1)
        again = await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k1", **KERNEL, "seq": 12})
        assert again["existed"] is True
        synced = await syncing
        assert (synced.get("destroyed", []), synced["spared"]) == ([], ["k1"])
        assert list(runtime.kernels) == ["k1"]


async def test_a_container_is_spared_only_for_a_while_after_its_create(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sequence no view ever reaches (a buggy sender, a stream recreated with lower
    sequences) spares its container for SPARE_S, not for ever."""
    monkeypatch.setattr(spares, "SPARE_S", 1.5)
    runtime = dummy()
    async with running(nc, store, runtime, config("a1")) as agent:
        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k1", **KERNEL, "seq": 2**62})
        assert (await call(nc, "a1", rpc.SYNC_KERNELS, {"view_seq": 10}))["spared"] == ["k1"]
        seq, at = agent.spares.asked_at["k1"]
        agent.spares.asked_at["k1"] = (seq, at - 1.6)  # its create 1.6 s ago, not waited out
        late = await call(nc, "a1", rpc.SYNC_KERNELS, {"view_seq": 10})
        assert (late["destroyed"], late.get("spared", [])) == (["k1"], [])
        assert runtime.kernels == {}


async def test_a_restarted_agent_spares_what_it_spared_before(
    nc: Client, store: EventStore
) -> None:
    """A create's sequence and time are kept with its container (the docker runtime's labels):
    an agent restarted since, which heard no create, still spares it from a lagging view."""
    runtime = dummy()
    async with running(nc, store, runtime, config("a1")):
        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k-new", **KERNEL, "seq": 12})
        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k-any", **KERNEL})
    assert runtime.kernels["k-new"].container().asked_seq == 12
    async with running(nc, store, runtime, config("a1")):
        reply = await call(nc, "a1", rpc.SYNC_KERNELS, {"view_seq": 10})
        assert (reply["destroyed"], reply["spared"]) == (["k-any"], ["k-new"])
        passed = await call(nc, "a1", rpc.SYNC_KERNELS, {"view_seq": 12})
        assert (passed["destroyed"], passed.get("spared", [])) == (["k-new"], [])


async def test_a_label_spares_for_what_is_left_of_spare_s_once(
    nc: Client, store: EventStore
) -> None:
    """Read back, a create's time counts by the wall clock: one SPARE_S old spares nothing;
    one dated ahead (a clock set back) counts from now, one more than SPARE_S ahead not at
    all; and a container's labels are read once per process, so an entry pruned after SPARE_S
    is not seeded again (a container is spared SPARE_S at most)."""
    spare = spares.SPARE_S
    now = time.time()

    def made(kid: str, at: float) -> KernelContainer:
        return KernelContainer(kid, "s1", f"c-{kid}", "base:1", True, asked_seq=30, asked_at=at)

    async with running(nc, store, dummy(), config("a1")) as agent:
        old, ahead, far = (
            made("k-old", now - spare - 1),
            made("k-ahead", now + 30),
            made("k-far", now + spare + 1),
        )
        agent.spares.recall_from_labels([old, ahead, far])
        assert set(agent.spares.asked_at) == {"k-ahead"}
        assert time.monotonic() - agent.spares.asked_at["k-ahead"][1] < 5  # from now, not later
        agent.spares.asked_at.clear()  # as Exits.housekeep prunes it SPARE_S later
        agent.spares.recall_from_labels([old, ahead, far])
        assert agent.spares.asked_at == {}
        # A container gone from the listing is forgotten: its id could come back only anew
        agent.spares.recall_from_labels([old])
        assert agent.spares.recalled == {"c-k-old"}


async def test_preload_and_unload(nc: Client, store: EventStore) -> None:
    runtime = dummy()
    async with running(nc, store, runtime, config("a1")) as agent:
        reply = await call(nc, "a1", rpc.PRELOAD, {"images": ["extra:1"]})
        assert "task_id" in reply["extra:1"] and agent.image_gc.preloaded == {
            "docker.io/library/extra:1"
        }
        await event_of(store, "a1", ev.ImagePulled, image="extra:1")
        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k1", **KERNEL})
        reply = await call(nc, "a1", rpc.UNLOAD, {"images": ["base:1", "extra:1", "none:1"]})
        assert reply == {
            "base:1": {"removed": False, "reason": "in-use: kernels k1"},
            "extra:1": {"removed": True},
            "none:1": {"removed": False, "reason": "not-present"},
        }
        assert set(runtime.images) == {"base:1"}
        removed = await event_of(store, "a1", ev.ImageRemoved, image="extra:1")
        assert removed.reason == "unload-requested"


@pytest.mark.parametrize(
    ("verb", "payload", "names"),
    [
        (rpc.CHECK_AND_PULL, {"images": "base:1"}, "$.images"),
        (rpc.CHECK_AND_PULL, {"images": []}, "$.images"),
        (rpc.CHECK_AND_PULL, {"image": ["base:1"]}, "image"),
        (rpc.CREATE_KERNEL, {**KERNEL}, "kernel_id"),
        (
            rpc.CREATE_KERNEL,
            {"kernel_id": "k1", **KERNEL, "resources": {"cpu": 0, "mem": 1}},
            "$.resources.cpu",
        ),
        (rpc.CREATE_KERNEL, {"kernel_id": "a.b", **KERNEL}, "kernel_id"),
        (rpc.DESTROY_KERNEL, {"kernel_id": 7}, "$.kernel_id"),
        (rpc.SYNC_KERNELS, {"running": [1]}, "$.running[0]"),
        (rpc.UNLOAD, {}, "images"),
        (rpc.PULL_STATUS, b"not json", "JSON"),
    ],
)
async def test_bad_requests_get_an_error_naming_the_field(
    nc: Client, store: EventStore, verb: str, payload: object, names: str
) -> None:
    runtime = dummy()
    async with running(nc, store, runtime, config("a1")):
        reply = await call(nc, "a1", verb, payload)
        assert set(reply) == {"error"}
        assert reply["error"]["code"] == "invalid-request"
        assert names in reply["error"]["message"], reply
        assert runtime.kernels == {} and runtime.pull_attempts == {}
    assert len(await agent_events(store, "a1")) == 1  # registration only: nothing changed


async def test_a_restarted_agent_reports_what_it_has_and_forgets_old_tasks(
    nc: Client, store: EventStore
) -> None:
    host = DummyHost()  # what survives the process: images and containers
    slow = {"bandwidth_bps": 4 * MB}
    async with running(nc, store, dummy(host=host, **slow), config("a1")) as first:
        await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k1", **KERNEL})
        reply = await call(nc, "a1", rpc.CHECK_AND_PULL, {"images": ["big:1"]})
        old_task = reply["big:1"]["task_id"]
        assert first.first_registration is True
    async with running(nc, store, dummy(host=host), config("a1")) as second:
        assert second.first_registration is False
        events = await agent_events(store, "a1")
        rereg = events[-1]
        assert isinstance(rereg, ev.AgentReregistered)
        assert set(rereg.images) == {
            "docker.io/library/base:1"
        }  # the interrupted pull left nothing
        beat = await second.send_heartbeat()
        assert [k.kernel_id for k in beat.kernels] == ["k1"]
        # The surviving container still holds what it was given.
        k1 = KERNEL["resources"]
        assert beat.free.cpu == second.capacity.cpu - k1["cpu"]
        assert beat.free.mem == second.capacity.mem - k1["mem"]
        status = await call(nc, "a1", rpc.PULL_STATUS, {"task_id": old_task})
        assert status["known"] is False
        # The container is still known to the agent: a sync keeps it, a second create returns it.
        sync = await call(nc, "a1", rpc.SYNC_KERNELS, {"running": ["k1"]})
        assert sync["running"] == ["k1"]
        again = await call(nc, "a1", rpc.CREATE_KERNEL, {"kernel_id": "k1", **KERNEL})
        assert again["existed"] is True
        # The new process pulls the image again, as a new task.
        reply = await call(nc, "a1", rpc.CHECK_AND_PULL, {"images": ["big:1"]})
        assert reply["big:1"]["task_id"] != old_task


def test_a_reason_names_at_most_three_kernels() -> None:
    assert first_few(["k1"]) == "k1"
    assert first_few([f"k{i}" for i in range(21)]) == "k0, k1, k2 and 18 more"
