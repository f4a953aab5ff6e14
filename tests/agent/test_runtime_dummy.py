"""DummyRuntime: simulated pulls and kernels, light enough for 100+ agents in one process."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path

import pytest

from agent.runtime import dummy_state
from agent.runtime.base import (
    ContainerSpec,
    ImageInUse,
    ImageMissing,
    ImageNotFound,
    ImageProgress,
    KernelContainer,
    KernelCreateError,
    KernelExists,
    KernelNotFound,
    PulledImage,
    PullProgress,
    TransientPullError,
    Unauthorized,
    Volume,
    VolumeInUse,
    VolumeMount,
)
from agent.runtime.dummy import DummyConfig, DummyHost, DummyRuntime, PullFailure
from agent.runtime.dummy_shell import NOT_FOUND_HINT

MiB = 1024 * 1024
HUB = "docker.io/library/"  # Docker Hub official images, canonical (domain.image_ref)


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
    assert (await rt.pull("img:1", lambda p: None)).image == "docker.io/library/img:1"
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
    with pytest.raises(ImageMissing, match="not on this host"):
        await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB)
    await rt.pull("img:1", lambda p: None)
    cid = await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB)
    with pytest.raises(KernelExists):
        await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB)
    with pytest.raises(ImageInUse):
        await rt.remove_image("img:1")
    with pytest.raises(ValueError, match="mem: must be at least 6 MiB"):
        await rt.create("k2", "s1", "img:1", 1.0, 0)

    restarted = DummyRuntime("a", DummyConfig(), host)
    [k] = await restarted.list_kernels()
    assert (k.kernel_id, k.session_id, k.container_id, k.running) == ("k1", "s1", cid, True)
    assert [i.image for i in await restarted.list_images()] == ["docker.io/library/img:1"]
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
    assert len(pulled) == 200 and all(p.image == "docker.io/library/img:1" for p in pulled)
    assert sum(p.current for p in updates if p.status == "Pull complete") == 200 * 100 * MiB


# -- what kernels run (agent.runtime.dummy_shell) -------------------------------------------------


def _rt(**cfg: object) -> DummyRuntime:
    values: dict[str, object] = {"bandwidth_bps": None, "preloaded": {"img:1"}}
    return DummyRuntime("a", DummyConfig(**{**values, **cfg}), address="10.0.0.7")  # type: ignore[arg-type]


async def _exits(rt: DummyRuntime) -> asyncio.Queue[KernelContainer]:
    ended: asyncio.Queue[KernelContainer] = asyncio.Queue()
    rt.watch_exits(ended.put_nowait)
    return ended


async def _logs(rt: DummyRuntime, kernel_id: str, tail: int | None = None) -> bytes:
    return b"".join([c async for c in rt.logs(kernel_id, tail, follow=False)])


@pytest.mark.parametrize(
    ("command", "code", "output"),
    [
        (["echo", "hello", "world"], 0, b"hello world\n"),
        (["true"], 0, b""),
        (["false"], 1, b""),
        (["sh", "-c", "echo a; exit 3; echo b"], 3, b"a\n"),
        (["sh", "-c", "false && echo no; echo yes"], 0, b"yes\n"),
        (["sh", "-c", "echo $GREETING ${GREETING}!"], 0, b"hi hi!\n"),
        (["python", "train.py"], 127, f"python: not found{NOT_FOUND_HINT}\n".encode()),
        (["sh", "-c", "echo x && nope"], 127, f"x\nnope: not found{NOT_FOUND_HINT}\n".encode()),
    ],
)
async def test_a_kernel_runs_its_command_and_reports_its_exit(
    command: list[str], code: int, output: bytes
) -> None:
    rt = _rt()
    ended = await _exits(rt)
    spec = ContainerSpec(command=command, env={"GREETING": "hi"})
    cid = await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB, spec)
    k = await asyncio.wait_for(ended.get(), 5)
    assert (k.kernel_id, k.container_id, k.running) == ("k1", cid, False)
    assert k.exit is not None and k.exit.exit_code == code
    [listed] = await rt.list_kernels()
    assert listed.exit == k.exit  # kept, with its exit, until destroyed
    assert await _logs(rt, "k1") == output


async def test_sleep_takes_its_time_and_none_runs_until_destroyed() -> None:
    rt = _rt()
    ended = await _exits(rt)
    start = time.monotonic()
    await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB, ContainerSpec(command=["sleep", "0.2"]))
    await rt.create("k2", "s1", "img:1", 1.0, 64 * MiB)  # no command: runs until destroyed
    k = await asyncio.wait_for(ended.get(), 5)
    assert k.kernel_id == "k1" and k.exit is not None and k.exit.exit_code == 0
    assert 0.19 <= time.monotonic() - start < 1 and 0.19 <= k.exit.ran_s < 1
    await asyncio.sleep(0.1)
    assert ended.empty() and {k.kernel_id: k.running for k in await rt.list_kernels()} == {
        "k1": False,
        "k2": True,
    }
    assert await rt.destroy("k2") is True and ended.empty()  # a removal is not an exit


async def test_logs_tail_and_follow_and_exec() -> None:
    rt = _rt()
    script = "echo one; echo two; echo three; sleep 0.2; echo four"
    await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB, ContainerSpec(command=["sh", "-c", script]))
    await asyncio.sleep(0.05)
    assert await _logs(rt, "k1", tail=2) == b"two\nthree\n"
    assert await _logs(rt, "k1", tail=0) == b""
    followed = b"".join([c async for c in rt.logs("k1", 1, follow=True)])
    assert followed == b"three\nfour\n"  # until the process ended
    with pytest.raises(KernelNotFound):
        rt.logs("nope", None, False)
    with pytest.raises(KernelCreateError, match="not running"):
        await rt.exec("k1", ["true"])

    await rt.create("k2", "s1", "img:1", 1.0, 64 * MiB)
    run = await rt.exec("k2", ["sh", "-c", "echo $X; exit 4"], env={"X": "from exec"})
    assert b"".join([c async for c in run.output()]) == b"from exec\n"
    assert await run.wait() == 4
    slow = await rt.exec("k2", ["sleep", "infinity"])
    await slow.kill()
    assert await slow.wait() == 137


async def test_output_rate_and_the_bounded_log() -> None:
    rt = _rt(output_bps=80_000, tick_s=0.02, log_limit_bytes=4000)
    await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB)
    await asyncio.sleep(0.3)
    out = rt.kernels["k1"].out
    assert 16_000 <= out.end <= 32_000  # about 24 kB written at 80 kB/s
    assert len(out.data) <= 4000 and out.start > 0  # the oldest dropped
    logs = await _logs(rt, "k1")
    assert logs.endswith(b"\n") and b"k1 output line" in logs
    await rt.close()


async def test_ports_volumes_and_slots() -> None:
    rt = _rt(slots={"gpu": 2})
    spec = ContainerSpec(
        ports=[8888, 22],
        mounts=[VolumeMount("data", "/data")],
        owner="alice",
        slots={"gpu": 1},
    )
    await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB, spec)
    [k] = await rt.list_kernels()
    assert [(p.port, p.host) for p in k.ports] == [(8888, "10.0.0.7"), (22, "10.0.0.7")]
    assert len({p.host_port for p in k.ports}) == 2 and k.slots == {"gpu": 1}
    assert await rt.list_volumes() == [Volume("data", "alice", ("k1",))]
    with pytest.raises(KernelCreateError, match="volume data belongs to another owner"):
        await rt.create("k2", "s2", "img:1", 1.0, 64 * MiB, ContainerSpec(
            mounts=[VolumeMount("data", "/d")], owner="bob"
        ))  # fmt: skip
    with pytest.raises(VolumeInUse, match="k1"):
        await rt.remove_volume("data")
    await rt.destroy("k1")
    assert await rt.remove_volume("data") is True
    assert await rt.remove_volume("data") is False

    no_gpu = _rt()
    with pytest.raises(KernelCreateError, match="could not select device driver"):
        await no_gpu.create("k1", "s1", "img:1", 1.0, 64 * MiB, ContainerSpec(slots={"gpu": 1}))


async def test_a_thousand_kernels_with_output_stay_cheap() -> None:
    """50 agents x 20 kernels in one process, each writing 2 kB/s, some exiting."""
    rts = [_rt(output_bps=2000, tick_s=0.1, seed=i) for i in range(50)]
    exits: asyncio.Queue[KernelContainer] = asyncio.Queue()
    for rt in rts:
        rt.watch_exits(exits.put_nowait)
    start = time.monotonic()
    for rt in rts:
        for i in range(20):
            command = ["sh", "-c", "sleep 0.3; exit 1"] if i % 10 == 0 else None
            await rt.create(f"k{i}", "s1", "img:1", 0.1, 8 * MiB, ContainerSpec(command=command))
    await asyncio.sleep(0.5)
    assert exits.qsize() == 100
    assert time.monotonic() - start < 5
    assert all(len(rt.kernels["k1"].out.data) > 0 for rt in rts)
    for rt in rts:
        await rt.close()


async def test_a_state_file_keeps_the_host_across_a_restart(tmp_path: Path) -> None:
    """The agent process goes, the simulated host stays: images pulled, containers running
    (their processes on from where they would be now), exits, logs, volumes and ports."""
    state = tmp_path / "dummy" / "a.json"
    cfg = DummyConfig(image_sizes={"img:1": MiB}, default_size=None, bandwidth_bps=None)
    rt = DummyRuntime("a", cfg, state_file=state)
    await rt.pull("img:1", lambda p: None)
    mount = VolumeMount("data", "/data")
    forever = ContainerSpec(ports=[8888], mounts=[mount], owner="ann")
    cid = await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB, forever)
    script = ContainerSpec(command=["sh", "-c", "echo one; sleep 0.4; echo two; exit 3"])
    await rt.create("k2", "s1", "img:1", 1.0, 64 * MiB, script)
    await rt.create("k3", "s1", "img:1", 1.0, 64 * MiB, ContainerSpec(command=["exit", "5"]))
    await asyncio.sleep(0.1)  # k3 ended, k2 wrote "one" and sleeps
    await rt.close()
    del rt  # the agent process is gone; its host is in the file

    again = DummyRuntime("a", cfg, state_file=state)
    ended = await _exits(again)
    assert [i.image for i in await again.list_images()] == ["docker.io/library/img:1"]
    kernels = {k.kernel_id: k for k in await again.list_kernels()}
    assert (kernels["k1"].container_id, kernels["k1"].running) == (cid, True)
    assert [(p.port, p.host_port) for p in kernels["k1"].ports] == [(8888, 30001)]
    assert kernels["k2"].running
    assert kernels["k3"].exit is not None and kernels["k3"].exit.exit_code == 5
    assert await again.volume_names() == ["data"]
    k2 = await asyncio.wait_for(ended.get(), 5)  # k2 goes on: its sleep ends ~0.3 s later
    assert k2.kernel_id == "k2" and k2.exit is not None and k2.exit.exit_code == 3
    assert 0.35 < k2.exit.ran_s < 1
    assert await _logs(again, "k2") == b"one\ntwo\n"  # once each
    assert again.pull_attempts == {}
    await again.close()


async def test_a_container_that_ended_while_its_agent_was_away_is_found_ended(
    tmp_path: Path,
) -> None:
    state = tmp_path / "a.json"
    cfg = DummyConfig(bandwidth_bps=None, preloaded={"img:1"})
    rt = DummyRuntime("a", cfg, state_file=state)
    await rt.create("k1", "s1", "img:1", 1.0, 64 * MiB, ContainerSpec(command=["sleep", "0.2"]))
    await rt.close()
    await asyncio.sleep(1.0)  # the agent is away longer than the process runs
    again = DummyRuntime("a", cfg, state_file=state)
    await asyncio.sleep(0.01)
    [k] = await again.list_kernels()
    # Its own run (0.2 s, more on a loaded host), not the time its agent was away (1 s).
    assert k.exit is not None and k.exit.exit_code == 0 and 0.19 < k.exit.ran_s < 0.8


def test_a_state_file_that_is_no_dummy_host_is_refused_naming_the_flag(tmp_path: Path) -> None:
    state = tmp_path / "a.json"
    state.write_text("{not json")
    with pytest.raises(ValueError, match=r"--dummy-state .*a\.json.*move it away"):
        DummyRuntime("a", DummyConfig(), state_file=state)
    assert state.read_text() == "{not json"  # left as it was


async def test_a_state_file_saved_under_other_spellings_is_read_under_the_engines(
    tmp_path: Path,
) -> None:
    """A file saved before names were canonical (``python``, or the canonical form): the images
    are found, listed once, and removable under any spelling."""
    state = tmp_path / "a.json"
    held = [PulledImage("python", "sha256:1", MiB), PulledImage(HUB + "busybox:1", "sha256:2", 1)]
    dummy_state.save(state, dummy_state.SavedHost(images=held))
    rt = DummyRuntime("a", DummyConfig(bandwidth_bps=None), state_file=state)
    assert await rt.has_image("python:latest") is not None
    assert await rt.has_image("busybox:1") is not None
    listed = sorted(i.image for i in await rt.list_images())
    assert listed == [HUB + "busybox:1", HUB + "python:latest"]
    assert await rt.remove_image(HUB + "python:latest")
    assert await rt.has_image("python") is None
    await rt.close()


def test_a_saved_kernel_and_a_live_one_share_the_copied_fields() -> None:
    from dataclasses import fields

    from agent.runtime.dummy import DummyKernel

    live = {f.name for f in fields(DummyKernel)}
    saved = set(dummy_state.SavedKernel.__struct_fields__)
    assert set(dummy_state.KERNEL_FIELDS) <= live & saved
