"""Session lifecycle: create -> RUNNING through the whole control plane, zero simulated delays.

Three processes on one embedded nats-server: the manager (``python -m services.manager``),
50 dummy agents in one process (instant creates, the image already present), and this client.
Each create carries ``max_wait``, so its reply comes when the session is RUNNING: the reply
time is the control-plane overhead of one session (API, enqueue, schedule, check-and-pull,
create, five appends to the event log, two agent round trips).

1. Throughput: ``--burst`` sessions created at once; sessions/s = burst / time to the last
   RUNNING reply.  Target >= 300 sessions/s.
2. Latency at a steady ``--rate`` sessions/s for ``--seconds``: p50 and p99 of create ->
   RUNNING.  Target p99 <= 50 ms.
3. Batch (``--batch``): ``--burst`` batch sessions whose kernel runs ``--command`` (``exit 0``;
   ``sleep 0.1`` for a command that takes time) created at once; sessions completed per
   second = burst / time from the first create to the last session TERMINATED (its kernel's
   KernelTerminated, seen on the event subjects). Measured side by side with an interactive
   burst of the same size (create -> RUNNING), alternating ``--rounds`` times, and reported as
   the ratio of the two: the cost of running a command to its end (the agent's exit fact, the
   manager's wind-down) on top of getting it running. No steady phase in this mode.
4. Scale (``--scale``): one row per size in ``--live``: a burst brings the live sessions up to
   that size (sessions/s against the >= 500/s target), then the steady ``--rate`` for
   ``--seconds`` (p50, p99 create -> RUNNING; those sessions stay live too), then the
   manager's resident memory per live session (its RSS, /proc/<pid>/status, minus its RSS
   before the first burst), its scheduling pass time (mean/max), heartbeat handling time and
   reconciliation pass time per agent (``hoist.admin.manager.stats``, since the manager
   started, i.e. over the row), the read models' lag in events (the log's head minus the
   ``seq`` a query replies), and the start-up fold: the manager is restarted at the end of each
   row and folds the whole log (its own timing, and the time until it printed 'manager ready').
   The ``--agents`` dummy agents run in ``--agent-procs`` processes.

    python bench/lifecycle.py [--agents 50] [--burst 2000] [--rate 50] [--seconds 20]
                              [--settle 0] [--sync-always] [--profile-manager FILE]
                              [--managers 2]  (the same with 2 managers beside 1: ratios)
    python bench/lifecycle.py --nats-nodes 3 [--burst 500] [--seconds 10] [--sync-always]
    python bench/lifecycle.py --sync-compare [--burst 500] [--seconds 10]
    python bench/lifecycle.py --batch [--agents 50] [--burst 2000] [--rounds 2]
                              [--command 'sleep 0.1'] [--sync-always]
    python bench/lifecycle.py --scale [--agents 1000] [--live 1000,5000,20000] [--rate 50]
                              [--seconds 20] [--agent-procs 4] [--heartbeat-interval 2]
                              [--profile-manager FILE] [--verify]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg

from agent.config import AgentConfig
from agent.pulls import PullPolicy
from agent.runtime.base import Capacity
from agent.runtime.dummy import DummyConfig, DummyRuntime
from agent.server import AgentServer
from domain.subjects import EVENTS, MANAGER_STATS, SESSION_CREATE, VERIFY_SUBJECT, query_subject
from services.eventstore.store import EventStore, event_store
from services.stack.natsserver import NatsCluster, NatsServer
from services.transport import progress
from services.transport.client import Client, connect

GB = 1024**3
IMAGE = "bench/base:1"
SCRIPT = str(Path(__file__).resolve())


async def run_agents(url: str, count: int, first: int = 0, heartbeat_s: float = 2.0) -> None:
    """One agents' process: dummy agents ``bench-<first>`` ... with zero delays, until SIGTERM."""
    nc = await connect(url, name="bench-agents", pending_size=256 * 1024 * 1024)
    store = event_store(nc)
    await store.ensure_stream()
    await progress.ensure(nc.jetstream())
    dummy = DummyConfig(
        preloaded={IMAGE},
        bandwidth_bps=None,
        capacity=Capacity(1000.0, 4096 * GB, 1000 * GB),
    )
    agents = []
    for i in range(first, first + count):
        cfg = AgentConfig(
            agent_id=f"bench-{i}",
            resource_group="default",
            runtime="dummy",
            heartbeat_interval_s=heartbeat_s,
            pulls=PullPolicy(),
        )
        agent = AgentServer(nc, cfg, DummyRuntime(cfg.agent_id, dummy), store)
        await agent.start()
        agents.append(agent)
    print("agents ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for agent in agents:
        await agent.stop()
    await nc.close()


async def create(nc: Client, i: int, tag: str) -> float:
    payload = {
        "owner": f"user-{i % 97}",
        "image": IMAGE,
        "resources": {"cpu": 0.1, "mem": 64 * 1024 * 1024},
        "max_wait": 60,
        "request_id": f"{tag}-{i}",
    }
    start = time.perf_counter()
    reply = json.loads((await nc.request(SESSION_CREATE, json.dumps(payload).encode(), 90)).data)
    took = time.perf_counter() - start
    if reply.get("status") != "RUNNING":
        raise RuntimeError(f"session {i} ended {reply.get('status')}: {reply}")
    return took


class Ends:
    """When each session's kernel was TERMINATED: its KernelTerminated on the event subjects
    (a core subscription sees every append; one kernel per session here)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.all_in = asyncio.Event()
        self.expected = 0

    async def on_msg(self, msg: Msg) -> None:
        if (msg.headers or {}).get("Hoist-Event") == "KernelTerminated":
            self.at.setdefault(msg.subject.rsplit(".", 1)[-1], time.perf_counter())
            if len(self.at) >= self.expected:
                self.all_in.set()


async def create_batch(nc: Client, i: int, tag: str, command: list[str]) -> str:
    payload = {
        "owner": f"user-{i % 97}",
        "image": IMAGE,
        "resources": {"cpu": 0.1, "mem": 64 * 1024 * 1024},
        "session_type": "batch",
        "command": command,
        "request_id": f"{tag}-{i}",
    }
    reply = json.loads((await nc.request(SESSION_CREATE, json.dumps(payload).encode(), 90)).data)
    if "error" in reply:
        raise RuntimeError(f"batch session {i}: {reply}")
    return str(reply["session_id"])


async def batch_burst(nc: Client, n: int, tag: str, command: list[str]) -> float:
    """Sessions completed per second: n batch sessions from the first create to the last end."""
    ends = Ends()
    ends.expected = n
    sub = await nc.subscribe(f"{EVENTS}.session.>", cb=ends.on_msg)
    try:
        start = time.perf_counter()
        sids = await asyncio.gather(*(create_batch(nc, i, tag, command) for i in range(n)))
        await asyncio.wait_for(ends.all_in.wait(), 300)
    finally:
        await sub.unsubscribe()
    if missing := set(sids) - ends.at.keys():
        raise RuntimeError(f"{len(missing)} batch sessions never ended, e.g. {min(missing)}")
    await check_succeeded(nc, sids)
    return n / (max(ends.at[s] for s in sids) - start)


async def check_succeeded(nc: Client, sids: list[str]) -> None:
    """Every session ended TERMINATED ``succeeded`` (the read model; 200 ids a query)."""
    for at in range(0, len(sids), 200):
        request = {"session_id": sids[at : at + 200], "limit": 1000}
        for _ in range(100):
            reply = json.loads(
                (await nc.request(query_subject("sessions"), json.dumps(request).encode(), 30)).data
            )
            rows = reply.get("rows", [])
            if len(rows) == len(sids[at : at + 200]) and all(
                (r["status"], r["status_info"]) == ("TERMINATED", "succeeded") for r in rows
            ):
                break
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"sessions did not all end succeeded: {reply}")


async def burst(nc: Client, n: int, tag: str = "burst") -> float:
    start = time.perf_counter()
    await asyncio.gather(*(create(nc, i, tag) for i in range(n)))
    return n / (time.perf_counter() - start)


async def windowed_burst(nc: Client, n: int, tag: str, window: int) -> float:
    """Sessions/s for ``n`` creates with at most ``window`` waiting at a time (0: all at once)."""
    if window <= 0 or window >= n:
        return await burst(nc, n, tag)
    room = asyncio.Semaphore(window)

    async def one(i: int) -> float:
        async with room:
            return await create(nc, i, tag)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - start)


async def steady(nc: Client, rate: float, seconds: float) -> list[float]:
    return await steady_tagged(nc, rate, seconds, "steady")


async def steady_tagged(nc: Client, rate: float, seconds: float, tag: str) -> list[float]:
    tasks = []
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        # Open loop: each create leaves on schedule whatever the earlier ones are doing.
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(create(nc, i, tag)))
    return list(await asyncio.gather(*tasks))


async def spawn(*args: str, ready: str, log: Path) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=log.open("ab")
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    if line.decode().strip() != ready:
        raise RuntimeError(f"{args[:2]} did not start: {line!r}; see {log}")
    return proc


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_run(url: str, args: argparse.Namespace, log: Path) -> tuple[float, list[float]]:
    """The burst's sessions/s and the steady phase's latencies on the server(s) at ``url``."""
    agents = await spawn(
        SCRIPT, "--role", "agents", "--url", url, "--agents", str(args.agents),
        ready="agents ready", log=log,
    )  # fmt: skip
    manager = await spawn(
        "-m", "services.manager", "--nats-url", url, "--log-level", "WARNING",
        ready="manager ready", log=log,
    )  # fmt: skip
    nc = await connect(url, name="bench-client")
    try:
        await burst(nc, 50)  # warm up
        rate = await burst(nc, args.burst)
        await asyncio.sleep(args.settle)
        return rate, await steady(nc, args.rate, args.seconds)
    finally:
        await nc.close()
        await stop(manager)
        await stop(agents)


def nats(tmpdir: Path, nodes: int, sync_always: bool) -> NatsServer | NatsCluster:
    """One nats-server or an ``nodes``-node cluster (R3 streams) in ``tmpdir``, fsyncing before
    every ack with ``sync_always`` (the project's nats.conf) or every 2 min (the default)."""
    if nodes > 1:
        return NatsCluster(tmpdir / "cluster", nodes, sync_always=sync_always)
    config = None
    if sync_always:
        config = tmpdir / "nats.conf"
        store = json.dumps(str(tmpdir / "nats"))
        config.write_text(f"jetstream {{\n store_dir: {store}\n sync_interval: always\n}}\n")
    return NatsServer(tmpdir / "nats", config=config)


async def side_by_side(args: argparse.Namespace) -> None:
    """The same burst and steady phase on each setup in one invocation; ratios to the first.
    ``--nats-nodes N``: one node vs an N-node cluster (same fsync setting); ``--sync-compare``:
    one node with the default fsync vs ``sync_interval: always``."""
    if args.sync_compare:
        setups = [("1 node, lazy fsync", 1, False), ("1 node, fsync always", 1, True)]
    else:
        sync = args.sync_always
        setups = [("1 node", 1, sync), (f"{args.nats_nodes} nodes (R3)", args.nats_nodes, sync)]
    rows: dict[str, tuple[float, list[float]]] = {}
    for name, nodes, sync in setups:
        with tempfile.TemporaryDirectory(prefix="hoist-bench-") as tmp:
            tmpdir = Path(tmp)
            with nats(tmpdir, nodes, sync) as server:
                rows[name] = await one_run(server.url, args, tmpdir / "processes.log")
    print(f"agents: {args.agents} dummy, zero delays; burst {args.burst}, steady {args.rate:g}/s")
    print(f"{'setup':<24}  sessions/s  p50 ms  p99 ms  ratio sessions/s  ratio p99")
    (base_rate, base_lat) = next(iter(rows.values()))
    for name, (rate, lat) in rows.items():
        print(
            f"{name:<24}  {rate:10.0f}  {pct(lat, 0.5) * 1000:6.1f}  {pct(lat, 0.99) * 1000:6.1f}"
            f"  {rate / base_rate:16.2f}  {pct(lat, 0.99) / pct(base_lat, 0.99):9.2f}"
        )


async def main(args: argparse.Namespace) -> None:
    if args.nats_nodes > 1 or args.sync_compare:
        await side_by_side(args)
        return
    if args.managers > 1 and not args.batch:
        await compare_managers(args)
        return
    rates, rate, latencies, errors = await run_once(args, managers=1)
    sync = "sync_interval always" if args.sync_always else "default sync (every 2 min)"
    print(f"agents: {args.agents} dummy, zero delays; nats-server with {sync}")
    if args.batch:
        report_batch(args, rates, errors)
        return
    p50, p99 = pct(latencies, 0.5) * 1000, pct(latencies, 0.99) * 1000
    print(
        f"throughput: {args.burst} sessions create->RUNNING at {rate:.0f} sessions/s"
        f"  (target >= 300: ratio {rate / 300:.2f})"
    )
    print(
        f"steady {args.rate:g} sessions/s for {args.seconds:g} s ({len(latencies)} sessions):"
        f" create->RUNNING p50 {p50:.1f} ms, p99 {p99:.1f} ms, mean"
        f" {statistics.mean(latencies) * 1000:.1f} ms  (target p99 <= 50 ms: ratio"
        f" {50 / p99:.2f})"
    )
    print(
        f"Kubernetes' pod-startup SLO for the same span is p99 <= 5 s (pulls excluded):"
        f" {5000 / p99:.0f}x this p99. Backend.AI's scheduler breaks above ~70 sessions in one"
        f" tick; here {rate:.0f} sessions/s went through one scheduler without a tick."
    )
    if errors:
        print(f"{len(errors)} ERROR lines in the process logs, first: {errors[0]}")


async def compare_managers(args: argparse.Namespace) -> None:
    """The same burst and steady phase with one manager, then with ``--managers`` (one leads,
    the others serve commands and stand by), each on a fresh log: the ratios of the two."""
    rows = {}
    for n in (1, args.managers):
        _, rate, latencies, errors = await run_once(args, managers=n)
        rows[n] = (rate, pct(latencies, 0.5) * 1000, pct(latencies, 0.99) * 1000)
        if errors:
            print(f"{n} managers: {len(errors)} ERROR lines, first: {errors[0]}")
    print(f"agents: {args.agents} dummy, zero delays; burst {args.burst}, steady {args.rate:g}/s")
    for n, (rate, p50, p99) in rows.items():
        print(f"{n} manager(s): {rate:.0f} sessions/s, steady p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    (r1, _, p1), (rn, _, pn) = rows[1], rows[args.managers]
    print(
        f"{args.managers} managers / 1: sessions/s ratio {rn / r1:.2f}, steady p99 ratio"
        f" {pn / p1:.2f}"
    )


async def run_once(
    args: argparse.Namespace, managers: int
) -> tuple[dict[str, list[float]], float, list[float], list[str]]:
    """One stack (nats-server, agents, ``managers`` managers): the burst and steady phases
    (or the batch rounds); (batch rates, burst rate, steady latencies, ERROR log lines)."""
    rates: dict[str, list[float]] = {"interactive": [], "batch": []}
    rate, latencies = 0.0, []
    with tempfile.TemporaryDirectory(prefix="hoist-bench-") as tmp:
        tmpdir = Path(tmp)
        log = tmpdir / "processes.log"
        with nats(tmpdir, 1, args.sync_always) as server:
            agents = await spawn(
                SCRIPT, "--role", "agents", "--url", server.url, "--agents", str(args.agents),
                ready="agents ready", log=log,
            )  # fmt: skip
            profile = ("-m", "cProfile", "-o", args.profile_manager) if args.profile_manager else ()
            procs = []
            for m in range(1, managers + 1):
                args_m = ["-m", "services.manager", "--nats-url", server.url]
                args_m += ["--log-level", "WARNING", "--manager-id", f"bench-manager-{m}"]
                first = profile if m == 1 else ()
                procs.append(await spawn(*first, *args_m, ready="manager ready", log=log))
            nc = await connect(server.url, name="bench-client")
            try:
                await burst(nc, 50)  # warm up: imports, first subscriptions, JIT-free caches
                if args.batch:
                    command = shlex.split(args.command)
                    await batch_burst(nc, 50, "warm-batch", command)
                    for r in range(args.rounds):  # alternating: a drift hits both
                        rates["interactive"].append(await burst(nc, args.burst, f"i{r}"))
                        rates["batch"].append(await batch_burst(nc, args.burst, f"b{r}", command))
                else:
                    rate = await burst(nc, args.burst)
                    await asyncio.sleep(args.settle)
                    latencies = await steady(nc, args.rate, args.seconds)
            finally:
                await nc.close()
                for proc in procs:
                    await stop(proc)
                await stop(agents)
            errors = [line for line in log.read_text().splitlines() if "ERROR" in line]
    return rates, rate, latencies, errors


def report_batch(
    args: argparse.Namespace, rates: dict[str, list[float]], errors: list[str]
) -> None:
    interactive, batch = (statistics.mean(rates[k]) for k in ("interactive", "batch"))
    each = ", ".join(
        f"{i:.0f}/{b:.0f}" for i, b in zip(rates["interactive"], rates["batch"], strict=True)
    )
    print(
        f"{args.rounds} rounds of {args.burst} sessions at once, alternating (interactive/batch:"
        f" {each} sessions/s)"
    )
    print(f"interactive: create->RUNNING at {interactive:.0f} sessions/s")
    print(
        f"batch ({args.command!r}): enqueue->TERMINATED (succeeded) at {batch:.0f} sessions"
        f" completed/s: ratio {batch / interactive:.2f} of the interactive rate"
    )
    if errors:
        print(f"{len(errors)} ERROR lines in the process logs, first: {errors[0]}")


# -- scale mode ----------------------------------------------------------------------------------

BURST_TARGET = 500.0  # sessions/s: what the manager did on a small fleet before issue 16


def cpu_s(pid: int) -> float:
    """CPU seconds a process used so far (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    """A process's resident memory (VmRSS) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


async def ask(
    nc: Client, subject: str, payload: dict[str, Any], wait_s: float = 60
) -> dict[str, Any]:
    reply = json.loads((await nc.request(subject, json.dumps(payload).encode(), wait_s)).data)
    if "error" in reply:
        raise RuntimeError(f"{subject}: {reply['error']}")
    return dict(reply)


async def start_manager(
    url: str, log: Path, profile: str | None = None
) -> tuple[asyncio.subprocess.Process, float]:
    """The manager, and the seconds from its start to 'manager ready' (imports, the fold of the
    whole log, its subscriptions); under cProfile if ``profile`` names a stats file."""
    start = time.perf_counter()
    cprofile = ("-m", "cProfile", "-o", profile) if profile else ()
    proc = await spawn(
        *cprofile, "-m", "services.manager", "--nats-url", url, "--log-level", "WARNING",
        ready="manager ready", log=log,
    )  # fmt: skip
    return proc, time.perf_counter() - start


class Row:
    """One size's figures, printed as a table row (a failure ends the row with what failed)."""

    HEADER = (
        "| agents | live sessions | burst sessions/s | p50 ms | p99 ms | KiB/session (live,"
        " after restart) | scheduling pass ms (mean/max) | heartbeat us/agent | reconciliation"
        " us/agent | fold s (own, to ready) | read-model lag (events) |"
    )

    def __init__(self, agents: int, size: int) -> None:
        self.cells: list[str] = [f"{agents:,}", f"{size:,}"]

    def add(self, *cells: str) -> None:
        self.cells.extend(cells)

    def show(self, failed: str | None = None) -> str:
        cells = [*self.cells]
        if failed is not None:
            cells.append(f"failed: {failed}")
        return "| " + " | ".join(cells) + " |"


async def run_scale(args: argparse.Namespace) -> None:
    sizes = [int(n) for n in args.live.split(",")]
    procs = args.agent_procs or max(1, -(-args.agents // 250))
    with tempfile.TemporaryDirectory(prefix="hoist-bench-") as tmp:
        tmpdir = Path(tmp)
        log = args.log or tmpdir / "processes.log"
        with NatsServer(tmpdir / "nats") as server:
            share = [args.agents // procs + (p < args.agents % procs) for p in range(procs)]
            firsts = [sum(share[:p]) for p in range(procs)]
            starting = []
            for n, first in zip(share, firsts, strict=True):
                flags = ["--agents", str(n), "--first", str(first)]
                flags += ["--heartbeat-interval", str(args.heartbeat_interval)]
                agents = spawn(SCRIPT, "--role", "agents", "--url", server.url, *flags,
                               ready="agents ready", log=log)  # fmt: skip
                starting.append(agents)
            agent_procs = await asyncio.gather(*starting)
            # profiled: the first manager, i.e. the first row until its restart
            manager, _ = await start_manager(server.url, log, args.profile_manager)
            base_kib = rss_kib(manager.pid)  # before any session, as a restarted one starts
            nc = await connect(server.url, name="bench-client", pending_size=256 * 1024 * 1024)
            store = event_store(nc)
            print(
                f"{args.agents} dummy agents in {len(agent_procs)} processes, heartbeat every"
                f" {args.heartbeat_interval:g} s; steady {args.rate:g} sessions/s for"
                f" {args.seconds:g} s a row; burst target >= {BURST_TARGET:.0f} sessions/s,"
                f" {args.window or 'all'} creates waiting at a time",
                flush=True,
            )
            print(Row.HEADER)
            print("| " + " | ".join(["---"] * 11) + " |", flush=True)
            began = time.perf_counter()
            try:
                await burst(nc, 50, "warm")  # imports, first subscriptions
                live = 50
                for size in sizes:
                    row = Row(args.agents, size)
                    try:
                        live, manager = await scale_row(
                            args, nc, store, server.url, log, manager, row, size, live, base_kib
                        )
                    except Exception as e:
                        print(row.show(f"{type(e).__name__}: {e}"), flush=True)
                        break
                    print(row.show(), flush=True)
            finally:
                wall = time.perf_counter() - began
                agents_cpu = sum(cpu_s(p.pid) for p in agent_procs if p.returncode is None)
                await nc.close()
                await stop(manager)
                for proc in agent_procs:
                    await stop(proc)
            errors = [line for line in log.read_text().splitlines() if "ERROR" in line]
    print(
        f"the agents' processes used {agents_cpu / wall:.0%} of a core over the {wall:.0f} s"
        f" run (2 cores here, shared with the manager, nats-server and this client)"
    )
    if errors:
        print(f"{len(errors)} ERROR lines in the process logs, first: {errors[0]}")


async def scale_row(
    args: argparse.Namespace,
    nc: Client,
    store: EventStore,
    url: str,
    log: Path,
    manager: asyncio.subprocess.Process,
    row: Row,
    size: int,
    live: int,
    base_kib: int,
) -> tuple[int, asyncio.subprocess.Process]:
    """One row: burst up to ``size`` live, the steady rate, the figures, a restart; the live
    count after it and the (restarted) manager."""
    more = max(0, size - live)
    rate = await windowed_burst(nc, more, f"burst-{size}", args.window) if more else 0.0
    live += more
    row.add(f"{rate:.0f}" if more else "-")
    latencies = await steady_tagged(nc, args.rate, args.seconds, f"steady-{size}")
    live += len(latencies)
    row.add(f"{pct(latencies, 0.5) * 1000:.1f}", f"{pct(latencies, 0.99) * 1000:.1f}")
    stats = await ask(nc, MANAGER_STATS, {})
    head = await store.head()
    models = await ask(nc, query_subject("sessions"), {"limit": 1})
    live_kib = rss_kib(manager.pid)
    if args.verify:  # what `hoist verify` asks: the live read models against a rebuild
        verified = await ask(nc, VERIFY_SUBJECT, {}, 600)
        print(
            f"hoist verify at {live:,} live: "
            + ("match" if verified["ok"] else f"DIFFER {verified['differences']}")
            + f" (stream sequence {verified['seq']})",
            flush=True,
        )
    await stop(manager)
    manager, to_ready = await start_manager(url, log)
    restarted = await ask(nc, MANAGER_STATS, {})
    restart_kib = rss_kib(manager.pid)
    counted = int(stats["live_sessions"])
    if counted != live:
        raise RuntimeError(f"the manager counts {counted} live sessions, the bench {live}")
    passes, beats, recs = (
        stats[k] for k in ("scheduling_passes", "heartbeats", "reconciliation_passes")
    )
    agents = int(stats["live_agents"])
    row.cells[1] = f"{live:,}"
    row.add(
        f"{(live_kib - base_kib) / live:.1f}, {(restart_kib - base_kib) / live:.1f}",
        f"{passes['mean_ms']:.2f} / {passes['max_ms']:.1f}",
        f"{beats['mean_ms'] * 1000:.0f}",
        f"{recs['mean_ms'] * 1000 / max(agents, 1):.1f}" if recs["count"] else "-",
        f"{restarted['startup_fold']['seconds']:.2f}, {to_ready:.2f}",
        f"{head - int(models['seq'])}",
    )
    return live, manager


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=("bench", "agents"), default="bench")
    p.add_argument("--url", help="(agents role) nats-server URL")
    p.add_argument("--agents", type=int, default=50)
    p.add_argument(
        "--managers",
        type=int,
        default=1,
        help="also run with this many managers (one leads) and print the ratios to one",
    )
    p.add_argument("--burst", type=int, default=2000)
    p.add_argument("--rate", type=float, default=50)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument(
        "--sync-always", action="store_true", help="fsync every append (as nats.conf does)"
    )
    p.add_argument(
        "--batch",
        action="store_true",
        help="batch sessions completed/s beside the interactive create->RUNNING rate",
    )
    p.add_argument("--command", default="exit 0", help="(--batch) what each kernel runs")
    p.add_argument("--rounds", type=int, default=2, help="(--batch) alternating bursts of each")
    p.add_argument("--scale", action="store_true", help="one row per size in --live")
    p.add_argument(
        "--live", default="1000,5000,20000", help="(--scale) live session counts, one row each"
    )
    p.add_argument(
        "--agent-procs", type=int, help="processes the agents run in (default: one per 250)"
    )
    p.add_argument(
        "--window",
        type=int,
        default=100,
        help="(--scale) at most this many burst creates waiting at a time (0: all at once)",
    )
    p.add_argument("--log", type=Path, help="(--scale) keep the processes' log here")
    p.add_argument("--first", type=int, default=0, help="(agents role) the first agent's number")
    p.add_argument(
        "--heartbeat-interval", type=float, default=2.0, help="the agents' (their default: 2 s)"
    )
    p.add_argument(
        "--settle",
        type=float,
        default=0,
        help="seconds between the burst and the steady phase (the read models catch up)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="(--scale) after each row, the live read models against a rebuild (hoist verify)",
    )
    p.add_argument(
        "--profile-manager",
        metavar="FILE",
        help="run the manager under cProfile, stats to FILE (--scale: the first row's)",
    )
    p.add_argument(
        "--nats-nodes",
        type=int,
        default=1,
        help="N > 1: run on one nats-server and on an N-node cluster (R3), side by side",
    )
    p.add_argument(
        "--sync-compare",
        action="store_true",
        help="run on one nats-server with the default fsync and with sync_interval always",
    )
    return p


if __name__ == "__main__":
    arguments = parser().parse_args()
    if arguments.role == "agents":
        a = arguments
        asyncio.run(run_agents(a.url, a.agents, a.first, a.heartbeat_interval))
    elif arguments.scale:
        asyncio.run(run_scale(arguments))
    else:
        asyncio.run(main(arguments))
