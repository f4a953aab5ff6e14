"""SIGKILL an agent mid-pull and mid-create and start it again (same id, same simulated host,
on a three-node stack): its kernel is recovered (RUNNING) or ended with a reason, within the
deadline the manager keeps for it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.chaos import FINAL, ClusterStack, ask
from domain import events as ev
from domain.codec import decode
from domain.subjects import SESSION_CREATE, SESSION_GET, session_events
from eventstore.store import event_store
from transport import progress as progress_stream
from transport.client import Client, connect

MiB = 1024**2
SLOW = "chaos/slow:1"  # 256 MiB at 64 MiB/s: a 4 s pull
SLOW_CREATE = "chaos/base:1"  # pulled in 0.25 s, then a 3 s create
# The kill must come before the create ends: 0.5 s after the kernel is seen CREATING, plus however
# late a loaded host sees it and kills (a 2 s create left about 1.3 s for that; 1 s more costs 1 s).
CREATE_S = 3.0
# A pull that stops is the stall timeout's (300 s by default): a restarted agent resumes it at
# once, so the kernel runs within the pull's own time plus a margin.  A create in flight when its
# agent died ends as the agent re-registers (services/manager/agent_rpc.py: agent_gone), not at
# the call's one-minute timeout: the kernel runs within the create's own time plus a margin.
DEADLINE_S = {"PULLING": 4.0 + 20.0, "CREATING": CREATE_S + 15.0}
PHASES = {"PULLING": SLOW, "CREATING": SLOW_CREATE}
# The event that ends each phase: written after the kill, it was cut off by it.
ENDED_BY = {"PULLING": ev.KernelPrepared, "CREATING": ev.KernelCreated}


async def kernel(nc: Client, sid: str) -> dict[str, Any]:
    view = await ask(nc, SESSION_GET, {"session_id": sid})
    assert "error" not in view, view
    return dict(view["kernels"][0])


async def until_kernel(nc: Client, sid: str, statuses: set[str], within_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            last = await kernel(nc, sid)
        except TimeoutError:
            continue
        if last["status"] in statuses:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"kernel of {sid} not {statuses} within {within_s}s: {last}")


async def kill_agent_mid(stack: ClusterStack, nc: Client, phase: str) -> dict[str, Any]:
    """Create a session, SIGKILL its agent while its kernel is in ``phase``, have `hoist up`
    start the agent again (a second later, as it does); the kernel once RUNNING or final
    (AssertionError after the phase's deadline), with ``killed_at``: the stream's last sequence
    just after the kill, and its ``session_id``."""
    reply = await ask(
        nc,
        SESSION_CREATE,
        {"owner": "chaos", "image": PHASES[phase], "resources": {"cpu": 0.1, "mem": 64 * MiB}},
    )
    sid = reply["session_id"]
    before = await until_kernel(nc, sid, {phase}, 30)
    await asyncio.sleep(0.5)  # well inside the pull, or the create
    how = stack.kill(before["agent_id"])
    killed_at = await event_store(nc).head()
    stack.restart(how)  # waits until `hoist up` has started it again
    after = await until_kernel(nc, sid, {"RUNNING", *FINAL}, DEADLINE_S[phase])
    return {**after, "session_id": sid, "killed_at": killed_at}


async def phase_ends(nc: Client, sid: str, phase: str) -> list[int]:
    """The stream sequences of the events that ended the session's ``phase``."""
    history = await event_store(nc).read_subject(session_events(sid))
    return [r.seq for r in history if isinstance(decode(r.data, r.headers), ENDED_BY[phase])]


def agent_stack(data_dir: Path, create_delay_s: float = CREATE_S) -> ClusterStack:
    dummy = {
        "image_sizes": {SLOW: 256 * MiB, SLOW_CREATE: 16 * MiB},
        "create_delay_s": create_delay_s,
    }
    return ClusterStack(data_dir, 1, dummy=dummy)


async def test_an_agent_killed_mid_pull_recovers_its_kernel(tmp_path: Path) -> None:
    # The create after the pull is not what this test is about: the dummy's quick one.
    with agent_stack(tmp_path / "data", create_delay_s=0.05) as stack:
        nc = await connect(stack.url("client"), max_reconnect_attempts=-1)
        try:
            after = await kill_agent_mid(stack, nc, "PULLING")
            assert after["status"] == "RUNNING" and after["status_info"], after
            # The pull ended after the kill (the kill cut it off), once.
            pulled = await phase_ends(nc, after["session_id"], "PULLING")
            assert len(pulled) == 1 and pulled[0] > after["killed_at"], (pulled, after)
            # The pull asked again is in the log (KernelPulling again, a new task), so whoever
            # follows the kernel's pull (hoist watch, describe, the web view) follows the new
            # one, whose bytes moved to the end.
            history = await event_store(nc).read_subject(session_events(after["session_id"]))
            events = [decode(r.data, r.headers) for r in history]
            tasks = [e.task_id for e in events if isinstance(e, ev.KernelPulling)]
            assert len(tasks) == 2 and tasks[0] != tasks[1], tasks
            again = [e for e in events if isinstance(e, ev.KernelPulling)][1]
            assert "asked again" in again.status_info, again
            progress = await progress_stream.latest(nc.jetstream(), after["agent_id"], tasks[1])
            assert progress is not None and progress.done and not progress.error, progress
            assert progress.current == progress.total == 256 * MiB, progress
        finally:
            await nc.close()


async def test_an_agent_killed_mid_create_recovers_its_kernel_without_waiting_out_the_call(
    tmp_path: Path,
) -> None:
    with agent_stack(tmp_path / "data") as stack:
        nc = await connect(stack.url("client"), max_reconnect_attempts=-1)
        try:
            after = await kill_agent_mid(stack, nc, "CREATING")  # within DEADLINE_S, not 60 s
            assert after["status"] == "RUNNING" and after["status_info"], after
            # Created after the kill (the kill cut the first create off), once.
            made = await phase_ends(nc, after["session_id"], "CREATING")
            assert len(made) == 1 and made[0] > after["killed_at"], (made, after)
        finally:
            await nc.close()
