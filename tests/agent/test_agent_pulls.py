"""PullManager on the dummy runtime: dedup, parallel bound, retries, timeout, stall, progress."""

from __future__ import annotations

import asyncio
import time

from agent.pulls import PullManager, PullPolicy
from agent.runtime.base import PulledImage
from agent.runtime.dummy import DummyConfig, DummyRuntime, PullFailure
from domain.rpc import PullProgress
from tests.agent.agent_harness import wait_for

MB = 1024 * 1024


class Facts:
    """The PullEvents the agent would store, kept in a list in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []

    async def pull_started(self, image: str, task_id: str) -> None:
        self.log.append(("started", image, task_id))

    async def pulled(self, task_id: str, image: PulledImage, duration_s: float) -> None:
        self.log.append(("pulled", image.image, task_id))

    async def pull_failed(
        self, image: str, task_id: str, reason: str, cancelled: bool = False
    ) -> None:
        self.log.append(("cancelled" if cancelled else "failed", image, task_id, reason))


def manager(
    config: DummyConfig, **policy: float
) -> tuple[PullManager, DummyRuntime, Facts, list[PullProgress]]:
    runtime = DummyRuntime("a1", config)
    facts = Facts()
    published: list[PullProgress] = []

    async def publish(p: PullProgress) -> None:
        published.append(p)

    defaults: dict[str, float] = {"backoff_s": 0.05, "stall_timeout_s": 5}
    pm = PullManager("a1", runtime, facts, publish, PullPolicy(**{**defaults, **policy}))  # type: ignore[arg-type]
    return pm, runtime, facts, published


async def test_concurrent_requests_for_one_image_share_one_pull() -> None:
    pm, runtime, facts, _ = manager(DummyConfig(default_size=4 * MB, bandwidth_bps=20 * MB))
    tasks = [pm.request("img:1") for _ in range(20)]
    assert len({t.task_id for t in tasks}) == 1
    await wait_for(lambda: any(f[0] == "pulled" for f in facts.log), 10, "pulled")
    assert runtime.pull_attempts == {"img:1": 1}
    assert [f[0] for f in facts.log] == ["started", "pulled"]
    # Once done, a new request is a new pull (the agent answers "present" before asking).
    assert pm.request("img:1").task_id != tasks[0].task_id


async def test_pulls_of_different_images_run_in_parallel_up_to_the_bound() -> None:
    pm, _, facts, _ = manager(
        DummyConfig(default_size=2 * MB, bandwidth_bps=8 * MB, tick_s=0.02), max_parallel=2
    )
    tasks = [pm.request(f"img-{i}:1") for i in range(5)]
    most = 0
    while not all(t.finished for t in tasks):
        most = max(most, sum(t.state == "pulling" for t in tasks))
        await asyncio.sleep(0.01)
    assert most == 2
    pulled = lambda: sorted(f[1] for f in facts.log if f[0] == "pulled")  # noqa: E731
    await wait_for(
        lambda: pulled() == [f"docker.io/library/img-{i}:1" for i in range(5)], 5, "5 ImagePulled"
    )


async def test_transient_errors_are_retried_with_growing_backoff() -> None:
    failure = PullFailure("transient", "registry said 503", times=2)
    pm, runtime, facts, _ = manager(
        DummyConfig(default_size=MB, bandwidth_bps=None, pull_failures={"img:1": failure}),
        backoff_s=0.1,
    )
    start = time.monotonic()
    task = pm.request("img:1")
    await wait_for(lambda: facts.log and facts.log[-1][0] != "started", 10, "outcome")
    assert task.state == "done", task.reason
    assert runtime.pull_attempts["img:1"] == 3
    assert time.monotonic() - start >= 0.1 + 0.2  # backoff 0.1 s, then doubled


async def test_transient_errors_give_up_after_the_retries() -> None:
    failure = PullFailure("transient", "registry said 503")
    pm, runtime, facts, _ = manager(
        DummyConfig(default_size=MB, bandwidth_bps=None, pull_failures={"img:1": failure}),
        retries=2,
    )
    task = pm.request("img:1")
    await wait_for(lambda: facts.log and facts.log[-1][0] == "failed", 10, "failure")
    assert runtime.pull_attempts["img:1"] == 3
    assert task.reason == "registry said 503 (gave up after 3 attempts)"


async def test_not_found_and_unauthorized_are_not_retried() -> None:
    denied = PullFailure("unauthorized", "unauthorized: authentication required")
    pm, runtime, facts, _ = manager(
        DummyConfig(
            image_sizes={"private:1": MB},
            default_size=None,
            bandwidth_bps=None,
            pull_failures={"private:1": denied},
        )
    )
    missing, private = pm.request("missing:1"), pm.request("private:1")
    await wait_for(lambda: missing.finished and private.finished, 10, "both to fail")
    assert runtime.pull_attempts == {"missing:1": 1, "private:1": 1}
    assert missing.state == private.state == "failed"
    assert missing.reason is not None and "not found" in missing.reason
    assert private.reason == "unauthorized: authentication required"
    await wait_for(lambda: sum(f[0] == "failed" for f in facts.log) == 2, 5, "ImagePullFailed")


async def test_a_pull_longer_than_the_timeout_fails() -> None:
    pm, _, facts, published = manager(
        DummyConfig(default_size=100 * MB, bandwidth_bps=10 * MB, tick_s=0.05), timeout_s=0.3
    )
    task = pm.request("slow:1")
    await wait_for(lambda: facts.log and facts.log[-1][0] == "failed", 10, "timeout")
    assert task.reason == "timeout: not done after 0.3s"
    assert published[-1].done and published[-1].error == task.reason


async def test_a_stalled_pull_fails_with_the_stall_reason() -> None:
    stall = PullFailure("stall", stall_at=0.3)
    pm, runtime, facts, published = manager(
        DummyConfig(default_size=4 * MB, bandwidth_bps=40 * MB, pull_failures={"img:1": stall}),
        stall_timeout_s=0.4,
    )
    task = pm.request("img:1")
    await wait_for(lambda: facts.log and facts.log[-1][0] == "failed", 10, "stall")
    assert task.reason == "stalled: no progress for 0.4s"
    assert facts.log[-1] == ("failed", "img:1", task.task_id, task.reason)
    assert runtime.pull_attempts["img:1"] == 1  # a stall is not retried
    last = published[-1]
    assert last.done and last.error == task.reason and 0 < last.current < last.total


async def test_progress_is_rate_bounded_monotonic_and_ends_at_the_total() -> None:
    # 200 layer updates in ~1 s; at most 10 messages a second get out.
    pm, _, facts, published = manager(
        DummyConfig(default_size=20 * MB, bandwidth_bps=20 * MB, tick_s=0.005, layers=2),
        progress_interval_s=0.1,
    )
    started = time.monotonic()
    task = pm.request("img:1")
    await wait_for(lambda: facts.log and facts.log[-1][0] == "pulled", 10, "pulled")
    elapsed = time.monotonic() - started  # about 1 s; longer on a loaded host, with more ticks
    currents = [p.current for p in published]
    assert currents == sorted(currents)
    # One message per 0.1 s at most, plus the first and the last (the bound, not a count that
    # holds only where the pull takes exactly 1 s)
    assert 3 <= len(published) <= elapsed / 0.1 + 4, (len(published), elapsed)
    last = published[-1]
    assert last.done and last.error is None and last.current == last.total == 20 * MB
    assert [layer.current for layer in last.layers] == [layer.total for layer in last.layers]
    assert all(p.task_id == task.task_id and p.image == "img:1" for p in published)


async def test_a_pull_its_last_kernel_releases_is_cancelled_early() -> None:
    pm, runtime, facts, published = manager(
        DummyConfig(default_size=40 * MB, bandwidth_bps=4 * MB, tick_s=0.02)  # a 10 s pull
    )
    task = pm.request("img:1", ["k1"])
    assert pm.request("img:1", ["k2"]) is task  # one pull, two waiters
    await wait_for(lambda: task.current > 0, 5, "bytes")
    assert pm.release("img:1", ["k1"], "k1 cancelled") is task
    await asyncio.sleep(0.2)
    assert task.state == "pulling"  # k2 still waits for it
    pm.release("img:1", ["k2", "k9"], "no kernel waits for it")
    await asyncio.wait_for(task.ended.wait(), 2)  # stopped early, not after 10 s
    assert (task.state, task.reason) == ("cancelled", "no kernel waits for it")
    assert [f[0] for f in facts.log] == ["started", "cancelled"]
    assert await runtime.has_image("img:1") is None
    last = published[-1]
    assert last.done and last.cancelled and last.error == "no kernel waits for it"
    assert last.current < 40 * MB  # ends where it stopped, not at 100 %
    # Again: nothing in flight, nothing changes; a new request is a new pull.
    assert pm.release("img:1", ["k2"], "again") is None
    assert pm.request("img:1", ["k3"]).task_id != task.task_id


async def test_a_pull_an_anonymous_caller_wants_is_never_cancelled() -> None:
    pm, _, facts, _ = manager(DummyConfig(default_size=2 * MB, bandwidth_bps=8 * MB, tick_s=0.02))
    task = pm.request("img:1", ["k1"])
    pm.request("img:1")  # a preload or an admin's pull: says no kernel
    pm.release("img:1", ["k1"], "k1 cancelled")
    await asyncio.wait_for(task.ended.wait(), 5)
    assert task.state == "done" and [f[0] for f in facts.log] == ["started", "pulled"]
