"""Image GC by the real disk: a Docker Engine of its own whose data-root is a 160 MiB tmpfs,
filled by pulls from the real registry over the high watermark; one pass brings the filesystem,
as statvfs measures it, under the low one, removing the least recently used images and never
the one a kernel runs, one a kernel placed here will need, or one a prepull policy pins."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.gc import GcPolicy
from agent.runtime.docker import DockerRuntime
from domain import events as ev
from domain import rpc
from eventstore.store import EventStore
from tests.agent.agent_harness import agent_events, call, config
from tests.agent.agent_harness import running as agent_running
from tests.fleet.fleet_harness import pull, run_kernel
from tests.infra.dockerd import DockerDaemon
from tests.infra.images import build_image
from tests.infra.registry import Registry
from tests.manager.harness import MB
from transport.client import Client

TMPFS_MB = 160
FILL_MB = 12  # each filler image: one layer of 12 MiB of random bytes (no busybox)
HIGH, LOW = 0.6, 0.4


def used_fraction(path: Path) -> float:
    st = os.statvfs(path)
    return 1 - st.f_bavail / st.f_blocks


@pytest.fixture
def small_engine(docker_engine: str) -> Iterator[tuple[str, Path]]:
    """(url, data-root) of a dockerd whose data-root is a TMPFS_MB tmpfs. (``docker_engine``
    puts the test in the Docker group: one Docker test at a time on the machine.)"""
    root = Path(tempfile.mkdtemp(prefix="hoist-gcfs-"))
    data = root / "data"
    data.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m", "tmpfs", str(data)], check=True
    )
    daemon = DockerDaemon(root)
    try:
        try:
            daemon.start()
        except RuntimeError as e:
            pytest.fail(f"the tmpfs dockerd did not start: {e}", pytrace=False)
        yield daemon.url, data
    finally:
        daemon.stop()
        if subprocess.run(["umount", str(data)], check=False).returncode:
            subprocess.run(["umount", "-l", str(data)], check=False)
        shutil.rmtree(root, ignore_errors=True)


async def test_gc_brings_a_full_engine_filesystem_under_the_low_watermark(
    nc: Client,
    store: EventStore,
    registry: Registry,
    small_image: str,
    small_engine: tuple[str, Path],
) -> None:
    url, data = small_engine
    agent_id = f"f{uuid.uuid4().hex[:8]}"
    tag = uuid.uuid4().hex[:6]
    fillers = [
        build_image(registry, f"hoist/gcfill{n}", tag, pad_mb=FILL_MB, busybox=False)
        for n in range(9)
    ]
    runtime = DockerRuntime(agent_id, base_url=url)
    cfg = config(
        agent_id,
        runtime="docker",
        cpu=2,
        mem=2 * 1024 * MB,
        disk=10**15,  # the budget the scheduler sees: GC must not count against it here
        gc=GcPolicy(high=HIGH, low=LOW, interval_s=3600, lease_s=0),
    )
    async with agent_running(nc, store, runtime, cfg) as agent:  # type: ignore[arg-type]
        await pull(nc, agent, small_image)
        await run_kernel(nc, agent, "gcfs-k1", small_image)
        pulled = []
        for image in fillers:  # in this order: fillers[0] is the least recently used
            if used_fraction(data) > HIGH + 0.05:
                break
            await pull(nc, agent, image)
            pulled.append(image)
        before = used_fraction(data)
        assert before > HIGH, f"{len(pulled)} images fill only {before:.0%} of the tmpfs"
        expected, pinned = pulled[0], pulled[1]  # a kernel placed here, a policy's image
        await call(nc, agent_id, rpc.PIN_IMAGES, {"expected": [expected], "policy": [pinned]})

        report = await call(nc, agent_id, rpc.IMAGE_GC, {})

        after = used_fraction(data)
        assert after <= LOW, (before, after, report)
        assert report["measured"] == str(data), report
        assert report["disk"] == os.statvfs(data).f_blocks * os.statvfs(data).f_frsize
        assert abs(report["used_before"] / report["disk"] - before) < 0.02
        assert report["used_after"] <= LOW * report["disk"] and report["note"] == ""
        removed = [r["image"] for r in report["removed"]]
        assert removed and removed == pulled[2 : 2 + len(removed)], (removed, pulled)
        pct = f"{before * 100:.0f}%"
        for r in report["removed"]:
            assert r["reason"].startswith(f"gc: {data} {pct} used ("), r["reason"]
            assert f"of {TMPFS_MB} MiB) > 60%, least recently used (last used " in r["reason"]
        assert report["kept"][small_image] == "in-use: kernel gcfs-k1"
        assert report["kept"][expected].startswith("about-to-use")
        assert report["kept"][pinned] == "pinned: a prepull policy wants it"
        for image in (small_image, expected, pinned):
            assert await runtime.has_image(image) is not None
        for image in removed:
            assert await runtime.has_image(image) is None
        recorded = [e for e in await agent_events(store, agent_id) if type(e) is ev.ImageRemoved]
        assert [(e.image, e.reason) for e in recorded] == [
            (r["image"], r["reason"]) for r in report["removed"]
        ]
        await call(nc, agent_id, rpc.DESTROY_KERNEL, {"kernel_id": "gcfs-k1"})
