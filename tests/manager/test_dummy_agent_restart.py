"""A dummy agent restarted on the same state file comes back as a docker agent does when the
Docker Engine ran on: its kernels still RUNNING (no container-gone), its images still pulled."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from agent.runtime.dummy import DummyConfig, DummyRuntime
from eventstore.store import EventStore
from tests.agent.agent_harness import config, running, wait_for
from tests.manager.harness import GB, MB, create, manager, until
from transport.client import Client

AGENT = config("a1", cpu=4, mem=8 * GB, disk=100 * GB, resource_group="default")


def runtime(state: Path | None) -> DummyRuntime:
    cfg = DummyConfig(default_size=8 * MB, bandwidth_bps=None, tick_s=0.01)
    return DummyRuntime("a1", cfg, state_file=state)


async def test_a_restarted_dummy_agent_keeps_its_images_and_running_kernels(
    nc: Client, store: EventStore, tmp_path: Path
) -> None:
    state = tmp_path / "dummy-hosts" / "a1.json"
    async with manager(nc, reconcile_interval_s=0.1, reconcile_grace_s=0.2) as m:
        async with running(nc, store, runtime(state), AGENT) as first:
            created = await create(nc, image="py:3")
            sid = created["session_id"]
            assert (await until(nc, sid))["status"] == "RUNNING"
            assert first.runtime.pull_attempts == {"py:3": 1}
        kernels = m.fleet.sessions[sid].kernels.values()
        changed = max(c.at for k in kernels for c in k.status_history)
        restarted = datetime.now(UTC)
        async with running(nc, store, runtime(state), AGENT) as again:
            # Several resource syncs of the new process after a beat of it that can judge its
            # kernel (reconcile_grace_s after the kernel's last change).
            def judging() -> bool:
                beat = m.liveness.last_beat.get("a1")
                return beat is not None and beat.sent_at > max(restarted, changed + m.sync.grace)

            await wait_for(judging, 10, "a beat of the new process past the grace")
            passes = m.stats.reconciliation_passes.count
            await wait_for(lambda: m.stats.reconciliation_passes.count >= passes + 3, 10, "3 syncs")
            session = await until(nc, sid)
            assert session["status"] == "RUNNING", session
            history = [
                c.status_info for k in m.fleet.sessions[sid].kernels.values()
                for c in k.status_history
            ]  # fmt: skip
            assert not [i for i in history if i.startswith(("container-gone", "agent-lost"))]
            # A new session of the same image: the image is still there, nothing is pulled.
            second = await create(nc, image="py:3")
            done = await until(nc, second["session_id"])
            assert done["status"] == "RUNNING", done
            assert again.runtime.pull_attempts == {}
