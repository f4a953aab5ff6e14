"""Chaos on a `hoist up --nats-nodes 3` stack: SIGKILL nats-servers (the event stream's leader)
while sessions are being created, and count what was acknowledged against what the log holds.

Each round creates ``--sessions`` sessions (dummy agents, a short simulated pull) and, once a
quarter of them are acknowledged, SIGKILLs the nats-server leading the event stream; the
killed node is started again before the next round (``--rounds``), so every round loses the
then-leader.  Creates are retried with the same request id until acknowledged (a retry of an
acknowledged create gets the same session).  After each round:

- acked vs found: every acknowledged session is in the log (0 lost);
- every session reaches RUNNING or a final status with a reason;
- ``hoist verify``: the read models equal a rebuild from the log.

    python bench/chaos.py [--sessions 200] [--rounds 5] [--agents 2]
    python bench/chaos.py --agent-kill   # SIGKILL an agent mid-pull, then mid-create

The test suite runs one round (tests/chaos/test_node_loss.py); the functions here are its.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors

from domain import subjects
from domain.subjects import SESSION_CREATE, SESSION_DESTROY, SESSION_GET, session_events
from eventstore.store import StoreError, event_store
from services.stack.natsserver import free_cluster_port
from services.stack.up import StackInfo, is_nats
from tests.infra.cluster import stream_leader
from transport import credentials
from transport.client import Client, connect

MiB = 1024**2
IMAGE = "chaos/base:1"
DUMMY_CONFIG = {  # a pull of ~1 s, creates of 50 ms: sessions are mid-flight when a node dies
    "image_sizes": {IMAGE: 64 * MiB, "chaos/slow:1": 4096 * MiB},
    "default_size": None,
    "layers": 4,
    "bandwidth_bps": 64 * MiB,
    "tick_s": 0.1,
    "create_delay_s": 0.05,
}
FINAL = {"ERROR", "CANCELLED", "TERMINATED"}
SETTLED = {"RUNNING", *FINAL}
REFUSED = {"invalid-request", "forbidden", "not-found"}  # a create refused for good: no retry


@dataclass
class Started:
    """How a process of the stack was started: its name, command line and environment."""

    name: str
    cmd: list[str]
    env: dict[str, str]
    pid: int


class ClusterStack:
    """`hoist up --runtime dummy --nats-nodes 3` in ``data_dir``, as a user runs it."""

    def __init__(
        self, data_dir: Path, agents: int = 2, *extra: str, dummy: dict[str, Any] | None = None
    ) -> None:
        self.data_dir = data_dir
        self.agents = agents
        self.dummy = {**DUMMY_CONFIG, **(dummy or {})}
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"{data_dir.name}-up.log"
        # Processes this harness started again, by name.
        self.restarted: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, within_s: float = 90) -> ClusterStack:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir.parent / f"{self.data_dir.name}-dummy.json"
        config.write_text(json.dumps(self.dummy))
        cmd = [
            sys.executable, "-m", "services.cli.main", "--data-dir", str(self.data_dir), "up",
            "--runtime", "dummy", "--nats-nodes", "3", "--nats-port", str(free_cluster_port(3)),
            "--agents", str(self.agents), "--no-demo", "--dummy-config", str(config), *self.extra,
        ]  # fmt: skip
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + within_s
        while "Running; Ctrl-C" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"hoist up did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        return self

    def info(self) -> StackInfo:
        info = StackInfo.read(self.data_dir)
        assert info is not None, f"no stack.json in {self.data_dir}"
        return info

    def url(self, role: str) -> str:
        creds = credentials.load_credentials(self.data_dir)
        return credentials.role_url(self.info().url, role, creds)

    def pid(self, name: str) -> int:
        """The pid of the stack's process ``name`` (the restarted one, after a restart)."""
        again = [p.pid for n, p in self.restarted if n == name]
        return again[-1] if again else self.info().pids[name]

    def kill(self, name: str) -> Started:
        """SIGKILL the stack's process ``name``; how it was started, to start it again."""
        pid = self.pid(name)
        proc = Path(f"/proc/{pid}")
        cmd = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0")[:-1]]
        pairs = (e.partition(b"=") for e in (proc / "environ").read_bytes().split(b"\0") if e)
        env = {k.decode(): v.decode() for k, _, v in pairs}
        os.kill(pid, signal.SIGKILL)
        return Started(name, cmd, env, pid)

    def restart(self, how: Started, within_s: float = 30) -> None:
        """Have a killed process start again as it was started: `hoist up` starts its own
        children again by itself (wait for the new pid); a nats-server node is started here
        (its output in logs/NAME.log)."""
        if not is_nats(how.name):
            deadline = time.monotonic() + within_s
            while self.info().pids.get(how.name) in (None, how.pid):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"hoist up did not start {how.name} again")
                time.sleep(0.1)
            return
        with open(self.data_dir / "logs" / f"{how.name}.log", "ab") as out:
            proc = subprocess.Popen(
                how.cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=how.env,
            )
        self.restarted.append((how.name, proc))

    def hoist(self, *args: str, role: str = "admin") -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "HOIST_NATS_URL": self.url(role)}
        return subprocess.run(
            [sys.executable, "-m", "services.cli.main", "--data-dir", str(self.data_dir), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for _, proc in self.restarted:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def __enter__(self) -> ClusterStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def ask(nc: Client, subject: str, payload: dict[str, Any], wait_s: float = 10) -> Any:
    msg = await nc.request(subject, json.dumps(payload).encode(), timeout=wait_s)
    return json.loads(msg.data)


@dataclass
class Round:
    """What one round saw."""

    sessions: int
    acked: dict[str, str] = field(default_factory=dict)  # request id -> session id
    refused: dict[str, str] = field(default_factory=dict)  # request id -> the refusal
    retries: int = 0
    killed: str = ""
    killed_how: Started | None = None  # to start the killed node again
    kill_at_s: float = 0.0
    missing: list[str] = field(default_factory=list)  # acknowledged, not in the log
    unsettled: dict[str, str] = field(default_factory=dict)  # session id -> its last status
    histories: dict[str, str] = field(default_factory=dict)  # an unsettled one's `hoist history`
    no_reason: list[str] = field(default_factory=list)  # final without a status_info
    statuses: dict[str, int] = field(default_factory=dict)
    verify: str = ""
    verified: bool = False

    @property
    def lost(self) -> int:
        return len(self.missing)


async def create_until_acked(
    nc: Client, rid: str, out: Round, within_s: float, image: str = IMAGE
) -> None:
    """One create, sent again with the same request id until the manager acknowledges it."""
    payload = {
        "owner": "chaos",
        "image": image,
        "resources": {"cpu": 0.01, "mem": 16 * MiB},
        "request_id": rid,
    }
    deadline = time.monotonic() + within_s
    while True:
        try:
            reply = await ask(nc, SESSION_CREATE, payload)
            error = reply.get("error")
            if error is None:
                out.acked[rid] = reply["session_id"]
                return
            if error.get("code") in REFUSED:
                out.refused[rid] = str(error)
                return
        except (nats.errors.Error, TimeoutError):
            pass  # no manager reachable now, or no answer: the same request again
        if time.monotonic() > deadline:
            return
        out.retries += 1
        await asyncio.sleep(0.25)


async def node_loss_round(
    stack: ClusterStack, sessions: int, tag: str, settle_s: float = 90.0, window: int = 20
) -> Round:
    """Create ``sessions`` sessions, SIGKILL the event stream's leader once a quarter are
    acknowledged, then check the log and the sessions (see the module's doc)."""
    out = Round(sessions)
    nc = await connect(stack.url("client"), max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        room = asyncio.Semaphore(window)
        start = time.monotonic()

        quarter = asyncio.Event()

        async def one(i: int) -> None:
            async with room:
                await create_until_acked(nc, f"{tag}-{i}", out, settle_s)
            if len(out.acked) >= sessions // 4:
                quarter.set()

        async def killer() -> None:
            await quarter.wait()
            # Stream info is the HOIST account's (the manager's): readers have no JetStream.
            manager = await connect(stack.url("manager"))
            try:
                out.killed = await stream_leader(manager, subjects.EVENT_STREAM)
            finally:
                await manager.close()
            out.killed_how = stack.kill(out.killed)
            out.kill_at_s = time.monotonic() - start

        kill = asyncio.create_task(killer())
        await asyncio.gather(*(one(i) for i in range(sessions)))
        await kill
        await check_round(stack, nc, out, settle_s)
    finally:
        await nc.close()
    return out


async def check_round(stack: ClusterStack, nc: Client, out: Round, settle_s: float) -> None:
    store = event_store(nc)
    for sid in out.acked.values():
        try:
            history = await store.read_subject(session_events(sid))
        except StoreError:
            history = []
        if not history:
            out.missing.append(sid)
    last: dict[str, dict[str, Any]] = {}
    pending = set(out.acked.values())
    deadline = time.monotonic() + settle_s
    while pending and time.monotonic() < deadline:
        for sid in list(pending):
            try:
                view = await ask(nc, SESSION_GET, {"session_id": sid})
            except (nats.errors.Error, TimeoutError):
                continue
            if "error" in view:
                continue
            last[sid] = view
            if view["status"] in SETTLED:
                pending.discard(sid)
        if pending:
            await asyncio.sleep(0.5)
    for sid in out.acked.values():
        view = last.get(sid, {"status": "?", "status_info": ""})
        out.statuses[view["status"]] = out.statuses.get(view["status"], 0) + 1
        if sid in pending:
            out.unsettled[sid] = view["status"]
            # What a reader of a failure needs: the session's whole history, who did what.
            history = await asyncio.to_thread(stack.hoist, "history", sid)
            out.histories[sid] = (history.stdout + history.stderr)[-4000:]
        elif view["status"] in FINAL and not view.get("status_info"):
            out.no_reason.append(sid)
    verify = await asyncio.to_thread(stack.hoist, "verify")
    out.verified = verify.returncode == 0
    out.verify = (verify.stdout + verify.stderr).strip()


async def agent_kills(args: argparse.Namespace) -> int:
    """SIGKILL the agent mid-pull, then mid-create, start it again; how long each kernel took
    to be RUNNING (or final) after the restart."""
    from tests.chaos.test_agent_kill import agent_stack, kill_agent_mid

    with tempfile.TemporaryDirectory(prefix="hoist-chaos-") as tmp:
        with agent_stack(Path(tmp) / "data") as stack:
            nc = await connect(stack.url("client"), max_reconnect_attempts=-1)
            try:
                for phase in ("PULLING", "CREATING"):
                    start = time.monotonic()
                    after = await kill_agent_mid(stack, nc, phase)
                    print(
                        f"agent killed mid-{phase.lower()}: kernel {after['status']}"
                        f" ({after['status_info']}) {time.monotonic() - start:.1f} s after"
                        " the session was created",
                        flush=True,
                    )
            finally:
                await nc.close()
    return 0


async def run(args: argparse.Namespace) -> int:
    if args.agent_kill:
        return await agent_kills(args)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="hoist-chaos-") as tmp:
        with ClusterStack(Path(tmp) / "data", args.agents) as stack:
            print(f"hoist up --nats-nodes 3: {stack.info().url}; {args.agents} dummy agents")
            print("round  killed   at(s)  acked  found  lost  retries  statuses  verify")
            for r in range(args.rounds):
                result = await node_loss_round(stack, args.sessions, f"r{r}")
                name = result.killed
                found = len(result.acked) - result.lost
                ok = (
                    result.lost == 0
                    and not result.unsettled
                    and not result.no_reason
                    and result.verified
                )
                failures += not ok
                print(
                    f"{r:>5}  {name:<7}  {result.kill_at_s:5.1f}  {len(result.acked):5}"
                    f"  {found:5}  {result.lost:4}  {result.retries:7}  {result.statuses}"
                    f"  {'ok' if result.verified else 'DIFFERS'}",
                    flush=True,
                )
                if not ok:
                    print(f"  unsettled {result.unsettled} no reason {result.no_reason}")
                    for sid, history in result.histories.items():
                        print(f"  history of {sid}:\n{history}")
                    print(f"  verify: {result.verify}")
                await end_sessions(stack, result)
                if result.killed_how is not None:
                    stack.restart(result.killed_how)
                    await asyncio.sleep(3)  # it rejoins and catches up before the next kill
    print(f"{args.rounds} rounds, {failures} with a failure; 0 lost is the bar")
    return 1 if failures else 0


async def end_sessions(stack: ClusterStack, out: Round) -> None:
    """Destroy a round's sessions (forced): the next round has the agents' capacity again."""
    nc = await connect(stack.url("client"), max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        for sid in out.acked.values():
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await ask(nc, SESSION_DESTROY, {"session_id": sid, "forced": True})
    finally:
        await nc.close()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=200, help="sessions created per round")
    p.add_argument("--rounds", type=int, default=5, help="leader kills, one per round")
    p.add_argument("--agents", type=int, default=2)
    p.add_argument(
        "--agent-kill", action="store_true", help="kill an agent mid-pull and mid-create instead"
    )
    return p


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parser().parse_args())))
