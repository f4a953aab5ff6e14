"""`hoist up`: private credentials, one stack per data dir, a clean stop on SIGTERM, the
event log kept across a restart, and a dummy stack restarted as it was, its demo run once."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from domain.image_ref import canonical
from domain.subjects import MANAGER_STATS
from tests.cli.stack_harness import HOIST, TEST_IMAGES, Stack, start_stack, stop_stack, wait_for
from transport.client import connect


def _port_open(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _processes_of(data_dir: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", str(data_dir)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_up_stop_and_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    stack = start_stack(data_dir, "--agents", "1", "--no-demo")
    try:
        for name in ("credentials.json", "auth.conf", "nats.conf"):
            assert (data_dir / name).stat().st_mode & 0o777 == 0o600, name
        info = json.loads((data_dir / "stack.json").read_text())
        assert info["runtime"] == "dummy" and info["agents"] == ["agent-1"]
        up_log = stack.log.read_text()
        assert "manager and 1 dummy agent(s): agent-1" in up_log

        # One stack per data dir; a port in use is said plainly.
        # (No engine there: the dummy fallback is not said either, only why it is refused.)
        nowhere = f"unix://{tmp_path}/no-docker.sock"
        for runtime in ([], ["--runtime", "docker"]):  # not "no Docker Engine reachable" first
            again = stack.hoist("up", "--docker-host", nowhere, "--no-demo", *runtime, timeout=30)
            assert again.returncode == 1 and "a stack already runs in" in again.stderr, runtime
            assert again.stdout == "", again.stdout
        port = info["url"].rsplit(":", 1)[1]
        up_args = ["up", "--runtime", "dummy", "--no-demo", "--nats-port", port]
        other = subprocess.run(
            [HOIST, "--data-dir", str(tmp_path / "other"), *up_args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert other.returncode == 1
        assert f"port {port} is in use: pick another with --nats-port" in other.stderr
        assert "stopped" not in other.stdout  # nothing started, so nothing stopped

        run = stack.hoist("run", stack.next_image())
        assert run.returncode == 0, run.stdout + run.stderr
        session_id = run.stdout.split()[1]
    finally:
        assert stop_stack(stack) == 0

    assert "Hoist stack stopped" in stack.log.read_text()
    assert not (data_dir / "stack.json").exists()
    assert not _port_open(info["url"])
    assert _processes_of(data_dir) == []  # nats-server and the agent (their argv name it)

    # Same data dir again: the log is still there.
    stack = start_stack(data_dir, "--agents", "1", "--no-demo")
    try:
        history = stack.hoist("history", session_id)
        assert history.returncode == 0, history.stderr
        assert "SessionEnqueued" in history.stdout and "KernelCreated" in history.stdout
    finally:
        assert stop_stack(stack) == 0


def _rows(stack: Stack, *args: str) -> list[dict[str, Any]]:
    result = stack.hoist(*args, "--json", timeout=30)
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)["rows"]
    return rows


def _demo_statuses(stack: Stack) -> list[str]:
    return [r["status"] for r in _rows(stack, "sessions", "--owner", "demo")]


def _a_sync_pass_after_a_beat(stack: Stack, within: float = 30) -> None:
    """Wait for a reconciliation pass (every 5 s) that ended after the manager had the agent's
    heartbeat: one that compared the agent's containers with the view (the manager's stats)."""

    async def wait() -> None:
        nc = await connect(stack.creds("admin"))
        try:
            deadline = time.monotonic() + within
            passes: int | None = None
            while True:
                reply = await nc.request(MANAGER_STATS, b"{}", timeout=10)
                stats = json.loads(reply.data)
                count = stats["reconciliation_passes"]["count"]
                if passes is None and stats["heartbeats"]["count"] >= 1:
                    passes = count  # a pass counted from now on had the beat
                elif passes is not None and count > passes:
                    return
                assert time.monotonic() < deadline, stats
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    asyncio.run(wait())


def test_a_restarted_dummy_stack_comes_back_as_it_was_and_runs_the_demo_once(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    image = canonical(TEST_IMAGES[0])  # the read models hold canonical references
    demo = ("--agents", "1", "--demo-image", image)
    stack = start_stack(data_dir, *demo)
    try:
        assert f"demo: a 1-kernel session of {image}" in stack.log.read_text()
        # Running, as `hoist up` said: the read models show it a moment later on a loaded host.
        wait_for(lambda: _demo_statuses(stack) == ["RUNNING"], 15)
        [first] = _rows(stack, "sessions", "--owner", "demo")
        assert first["status"] == "RUNNING", first
    finally:
        assert stop_stack(stack) == 0

    stack = start_stack(data_dir, *demo)
    try:
        up_log = stack.log.read_text()
        assert f"demo: session {first['session_id']} was started here before" in up_log
        assert "1-kernel session" not in up_log
        # Past a resource sync (its beat judges a container 2 s after its last change, which
        # was before the restart): the demo's container is still there, its image was not
        # pulled again.
        _a_sync_pass_after_a_beat(stack)
        wait_for(lambda: len(_rows(stack, "ps", "--owner", "demo")) == 1, 15)
        [kernel] = _rows(stack, "ps", "--owner", "demo")
        assert (kernel["session_id"], kernel["status"]) == (first["session_id"], "RUNNING")
        pulls = [r for r in _rows(stack, "pulls") if r["image"] == image]
        assert len(pulls) == 1, pulls
        assert [r["session_id"] for r in _rows(stack, "sessions", "--owner", "demo")] == [
            first["session_id"]
        ]
    finally:
        assert stop_stack(stack) == 0

    # Asked for, another demo starts.
    stack = start_stack(data_dir, *demo, "--demo")
    try:
        assert f"demo: a 1-kernel session of {image}" in stack.log.read_text()
        wait_for(lambda: len(_rows(stack, "sessions", "--owner", "demo")) == 2, 15)
    finally:
        assert stop_stack(stack) == 0


def test_up_with_two_managers_names_the_leader_and_survives_its_kill(tmp_path: Path) -> None:
    """`hoist up --managers 2`: `hoist status` names the leader; SIGKILLed, it is started
    again by `hoist up` (saying so), a manager leads (the other once the lease lapses, or the
    same one taking its own lease back) and sessions still run; `hoist down` stops both."""
    data_dir = tmp_path / "data"
    stack = start_stack(data_dir, "--agents", "1", "--no-demo", "--managers", "2")
    try:
        status = stack.hoist("status")
        assert status.returncode == 0, status.stdout + status.stderr
        leader = next(line for line in status.stdout.splitlines() if line.split()[1] == "leader")
        name = leader.split()[2]  # "ok leader manager-1 leads (lease at event N)"
        assert name in ("manager-1", "manager-2"), leader
        process = "manager" if name == "manager-1" else name
        pid = json.loads((data_dir / "stack.json").read_text())["pids"][process]
        subprocess.run(["kill", "-9", str(pid)])

        def started_again() -> bool:
            pids = json.loads((data_dir / "stack.json").read_text())["pids"]
            return pids[process] != pid

        wait_for(started_again, 15)
        assert f"{process} exited with code -9; starting it again" in stack.log.read_text()
        wait_for(lambda: " leads (lease at event" in stack.hoist("status").stdout, 15)
        run = stack.hoist("run", stack.next_image())
        assert run.returncode == 0, run.stdout + run.stderr
    finally:
        stop_stack(stack)
    assert _processes_of(data_dir) == []
