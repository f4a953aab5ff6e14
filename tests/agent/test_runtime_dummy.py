"""DummyRuntime: simulated pulls and kernels, light enough for 100+ agents in one process."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import pytest

from agent.runtime.base import (
    ImageInUse,
    ImageNotFound,
    ImageProgress,
    KernelCreateError,
    KernelExists,
    PullProgress,
    TransientPullError,
    Unauthorized,
)
from agent.runtime.dummy import DummyConfig, DummyHost, DummyRuntime, PullFailure

MiB = 1024 * 1024


async def test_progress_adds_up_per_layer_and_per_image() -> None:
    rt = DummyRuntime(
        "a",
        DummyConfig(
            image_sizes={"img:1": 10 * MiB}, layers=3, bandwidth_bps=1000 * MiB, tick_s=0.001
        ),
    )
    updates: list[PullProgress] = []
    pulled = await rt.pull("img:1", updates.append)
    per_layer: dict[str, list[int]] = defaultdict(list)
    for p in updates:
        per_layer[p.layer].append(p.current)
    assert len(per_layer) == 3
    assert all(seq == sorted(seq) and len(seq) > 2 for seq in per_layer.values())
    summed = ImageProgress()
    for p in updates:
        summed.add(p)
    assert summed.current == summed.total == pulled.size_bytes == 10 * MiB
    assert await rt.has_image("img:1") == pulled
    assert await rt.list_images() == [pulled]


async def test_bandwidth_sets_the_pull_duration() -> None:
    rt = DummyRuntime("a", DummyConfig(default_size=MiB, bandwidth_bps=10 * MiB, tick_s=0.02))
    start = time.monotonic()
    await rt.pull("img:1", lambda p: None)
    assert time.monotonic() - start >= 0.09  # 1 MiB at 10 MiB/s


async def test_unknown_images_are_not_found_when_there_is_no_default_size() -> None:
    rt = DummyRuntime("a", DummyConfig(image_sizes={"known:1": MiB}, default_size=None))
    with pytest.raises(ImageNotFound):
        await rt.pull("unknown:1", lambda p: None)
    assert (await rt.pull("known:1", lambda p: None)).size_bytes == MiB


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("not-found", ImageNotFound),
        ("unauthorized", Unauthorized),
        ("transient", TransientPullError),
    ],
)
async def test_injected_pull_failures(kind: str, error: type[Exception]) -> None:
    failure = PullFailure(kind, reason=f"boom {kind}")  # type: ignore[arg-type]
    rt = DummyRuntime("a", DummyConfig(bandwidth_bps=None, pull_failures={"img:1": failure}))
    updates: list[PullProgress] = []
    with pytest.raises(error, match=f"boom {kind}"):
        await rt.pull("img:1", updates.append)
    assert updates and updates[-1].current < updates[-1].total  # failed halfway
    assert await rt.has_image("img:1") is None


async def test_a_transient_failure_for_the_first_attempts_only() -> None:
    failure = PullFailure("transient", times=2)
    rt = DummyRuntime("a", DummyConfig(bandwidth_bps=None, pull_failures={"img:1": failure}))
    for _ in range(2):
        with pytest.raises(TransientPullError):
            await rt.pull("img:1", lambda p: None)
    assert (await rt.pull("img:1", lambda p: None)).image == "img:1"
    assert rt.pull_attempts["img:1"] == 3


async def test_a_stalled_pull_hangs_until_cancelled() -> None:
    failure = PullFailure("stall", stall_at=0.25)
    rt = DummyRuntime(
        "a", DummyConfig(default_size=4 * MiB, bandwidth_bps=None, pull_failures={"img:1": failure})
    )
    summed = ImageProgress()
    task = asyncio.create_task(rt.pull("img:1", summed.add))
    await asyncio.sleep(0.05)
    assert not task.done() and summed.current == MiB
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await rt.has_image("img:1") is None


async def test_random_failures_repeat_with_the_seed() -> None:
    async def outcomes(seed: int) -> list[bool]:
        rt = DummyRuntime("a", DummyConfig(bandwidth_bps=None, pull_failure_rate=0.5, seed=seed))
        results = []
        for i in range(20):
            try:
                await rt.pull(f"img:{i}", lambda p: None)
                results.append(True)
            except TransientPullError:
                results.append(False)
        return results

    first = await outcomes(7)
    assert first == await outcomes(7)
    assert True in first and False in first


async def test_kernels_create_destroy_and_survive_a_restart() -> None:
    host = DummyHost()
    rt = DummyRuntime("a", DummyConfig(bandwidth_bps=None, create_delay_s=0.01), host)
    with pytest.raises(KernelCreateError, match="not on this host"):
        await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB)
    await rt.pull("img:1", lambda p: None)
    cid = await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB)
    with pytest.raises(KernelExists):
        await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB)
    with pytest.raises(ImageInUse):
        await rt.remove_image("img:1")
    with pytest.raises(ValueError, match="mem_bytes"):
        await rt.create("k2", "s1", "img:1", 1.0, 0)

    restarted = DummyRuntime("a", DummyConfig(), host)
    [k] = await restarted.list_kernels()
    assert (k.kernel_id, k.session_id, k.container_id, k.running) == ("k1", "s1", cid, True)
    assert [i.image for i in await restarted.list_images()] == ["img:1"]
    assert await restarted.destroy("k1") is True
    assert await restarted.destroy("k1") is False
    assert await restarted.remove_image("img:1") is True


async def test_injected_create_failures() -> None:
    rt = DummyRuntime("a", DummyConfig(preloaded={"bad:1", "good:1"}, create_failures={"bad:1"}))
    with pytest.raises(KernelCreateError, match="injected"):
        await rt.create("k1", "s1", "bad:1", 1.0, 64 * MiB)
    assert await rt.create("k2", "s1", "good:1", 1.0, 64 * MiB)
    assert [k.kernel_id for k in await rt.list_kernels()] == ["k2"]


async def test_two_hundred_agents_pull_at_zero_delay() -> None:
    agents = [DummyRuntime(f"a{i}", DummyConfig(bandwidth_bps=None, seed=i)) for i in range(200)]
    updates: list[PullProgress] = []
    # A hang guard, not a speed target (bench/ measures speed): zero delay needs no real time.
    pulled = await asyncio.wait_for(
        asyncio.gather(*(rt.pull("img:1", updates.append) for rt in agents)), 30
    )
    assert len(pulled) == 200 and all(p.image == "img:1" for p in pulled)
    assert sum(p.current for p in updates if p.status == "Pull complete") == 200 * 100 * MiB
