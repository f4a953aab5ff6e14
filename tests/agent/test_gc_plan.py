"""Image GC's decision (agent.gc.plan_gc) without an engine, and a pass on the dummy runtime
whose filesystem frees less than the images' sizes (shared layers), so the pass measures again
and goes on until the filesystem is under the low watermark."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.gc import DiskUsage, GcImage, GcPolicy, plan_gc
from agent.runtime.base import Filesystem
from agent.runtime.dummy import DummyConfig, DummyRuntime
from domain import events as ev
from domain import rpc
from eventstore.store import EventStore
from tests.agent.agent_harness import (
    agent_events,
    call,
    config,
    running,
    store_fixture,  # noqa: F401 - the `store` fixture
    wait_for,
)
from transport.client import Client

MIB = 1024**2
POLICY = GcPolicy(high=0.85, low=0.80)

images_st = st.lists(
    st.builds(
        GcImage,
        image=st.sampled_from([f"r/i{n}:1" for n in range(12)]),
        size_bytes=st.integers(0, 50 * MIB),
        last_used=st.floats(0, 2e9),
    ),
    unique_by=lambda i: i.image,
    max_size=12,
)


@given(
    images=images_st,
    total=st.integers(1, 400 * MIB),
    other=st.integers(0, 100 * MIB),
    kept=st.sets(st.sampled_from([f"r/i{n}:1" for n in range(12)])),
)
def test_plan_gc_removes_least_recently_used_first_down_to_low_never_what_is_kept(
    images: list[GcImage], total: int, other: int, kept: set[str]
) -> None:
    used = sum(i.size_bytes for i in images) + other
    usage = DiskUsage("/var/lib/docker", total, used)
    plan = plan_gc(images, usage, POLICY, {i: "in-use: kernel k" for i in kept})
    removed = [i for i, _ in plan.removals]
    assert not {i.image for i in removed} & kept
    if used <= POLICY.high * total:
        assert removed == [] and plan.trigger == "" and plan.note == ""
        return
    # Removals are the least recently used of the removable ones, in that order, and stop as
    # soon as the estimate reaches the low watermark.
    removable = sorted(
        (i for i in images if i.image not in kept), key=lambda i: (i.last_used, i.image)
    )
    assert removed == removable[: len(removed)]
    target = int(POLICY.low * total)
    assert plan.used_after == used - sum(i.size_bytes for i in removed)
    if removed:
        assert plan.used_after + removed[-1].size_bytes > target  # the last one was needed
    if plan.used_after > target:
        assert removed == removable and plan.note.startswith("/var/lib/docker stays at")
    else:
        assert plan.note == ""
    for _, reason in plan.removals:
        assert reason.startswith(f"gc: /var/lib/docker {used / total * 100:.0f}% used (")
        assert "> 85%, least recently used (last used " in reason


@given(images=images_st, total=st.integers(1, 400 * MIB), used_pct=st.floats(0.0, 1.0))
def test_a_pass_already_started_goes_on_above_low_and_keeps_its_first_reason(
    images: list[GcImage], total: int, used_pct: float
) -> None:
    used = int(total * used_pct)
    plan = plan_gc(images, DiskUsage("/d", total, used), POLICY, {}, trigger="gc: first round")
    if used > POLICY.low * total and images:
        assert plan.removals, "above low, a started pass goes on"
        assert all(r.startswith("gc: first round, least recently used") for _, r in plan.removals)
    if used <= POLICY.low * total:
        assert plan.removals == []


def test_plan_gc_reason_names_the_filesystem_its_use_and_the_watermark() -> None:
    images = [
        GcImage("r/old:1", 30 * MIB, 1_700_000_000),
        GcImage("r/new:1", 30 * MIB, 1_800_000_000),
    ]
    usage = DiskUsage("/var/lib/docker", 100 * MIB, 90 * MIB)
    plan = plan_gc(images, usage, POLICY, {})
    assert plan.removals == [
        (
            images[0],
            "gc: /var/lib/docker 90% used (90 MiB of 100 MiB) > 85%, least recently used"
            " (last used 2023-11-14T22:13:20+00:00)",
        )
    ]
    assert plan.used_after == 60 * MIB and plan.note == ""


class SharedLayersRuntime(DummyRuntime):
    """A dummy host with a filesystem: 40 MiB of other files, and each image takes half its
    size on disk (half of it is layers shared with the others), so removing one frees half of
    what GC expects."""

    async def filesystem(self) -> Filesystem | None:
        held = sum(i.size_bytes for i in await self.list_images())
        return Filesystem("/srv/engine", 200 * MIB, 200 * MIB - 40 * MIB - held // 2)


async def test_a_pass_measures_again_until_the_filesystem_is_under_low(
    nc: Client, store: EventStore
) -> None:
    images = [f"docker.io/r/i{n}:1" for n in range(8)]
    runtime = SharedLayersRuntime("gcfs", DummyConfig(bandwidth_bps=None, default_size=40 * MIB))
    cfg = config("gcfs", disk=10**15, gc=GcPolicy(high=0.7, low=0.5, interval_s=3600, lease_s=0))
    async with running(nc, store, runtime, cfg) as agent:
        for image in images:  # pulled in this order: i0 is the least recently used
            await call(nc, "gcfs", rpc.PRELOAD, {"images": [image], "pinned": False}, within=30)
            await wait_for(lambda i=image: i in agent.image_gc.last_used, 10, f"{image} held")  # type: ignore[misc]
            agent.image_gc.used(image)
        await call(nc, "gcfs", rpc.PIN_IMAGES, {"expected": [images[0]]})
        # 40 + 8 * 20 = 200 MiB: full; low is 100 MiB, so 3 rounds: each removal
        # frees half what plan_gc counts (3 removed, then 1, then 1).
        report = await call(nc, "gcfs", rpc.IMAGE_GC, {})
        assert report["measured"] == "/srv/engine" and report["disk"] == 200 * MIB
        assert report["used_before"] == 200 * MIB
        assert report["used_after"] <= 100 * MIB, report
        assert [r["image"] for r in report["removed"]] == images[1:6]
        assert report["kept"][images[0]].startswith("about-to-use")
        assert report["note"] == ""
        reasons = {r["reason"] for r in report["removed"]}
        assert all(
            r.startswith("gc: /srv/engine 100% used (200 MiB of 200 MiB) > 70%") for r in reasons
        )
        recorded = [e for e in await agent_events(store, "gcfs") if type(e) is ev.ImageRemoved]
        assert [e.image for e in recorded] == images[1:6]
