"""`hoist up`: start a local stack (nats-server, managers, agents, the web view), run its demo
session once per data dir, and keep the stack's processes running until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Any

from agent.runtime.dummy_shell import SIMULATES
from client.connection import CliError, Connection
from domain.subjects import SESSION_CREATE
from services.cli import demo, stack_cmds
from services.cli.progress_view import watch_and_report
from services.cli.streams import interrupt_event
from services.stack import home as stack_home
from services.stack import up as stack

# --- up ------------------------------------------------------------------------------------------


async def cmd_up(args: argparse.Namespace) -> int:
    stop = interrupt_event()
    # Its terminal closed: stop the stack in order, as on Ctrl-C (the default would kill).
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, stop.set)
    runtime = args.runtime
    if busy := stack.already_running(Path(args.data_dir)):  # not the Docker Engine's absence
        raise CliError(busy)
    fallback = ""  # said once the stack started: a refused `hoist up` says only why
    if runtime != "dummy":
        reachable, where = await asyncio.to_thread(stack.docker_reachable, args.docker_host)
        if runtime == "docker" and not reachable:
            raise CliError(
                f"no Docker Engine reachable at {where}: start dockerd, pass --docker-host,"
                " or use --runtime dummy"
            )
        if runtime is None:
            runtime = "docker" if reachable else "dummy"
            if not reachable:
                fallback = (
                    f"no Docker Engine reachable at {where}: using the dummy runtime"
                    " (simulated pulls)"
                )
    data_dir = Path(args.data_dir)
    local = stack.Stack(
        data_dir,
        nats_port=args.nats_port or stack.remembered_port(data_dir),
        nats_nodes=args.nats_nodes or stack.remembered_nodes(data_dir),
        sync_always=not args.no_sync_always,
        agents=args.agents,
        runtime=runtime,
        docker_host=args.docker_host,
        dummy_config=_read_json(args.dummy_config) if args.dummy_config else None,
        slots=args.slot,
        managers=args.managers,
        web=not args.no_web,
        web_host=args.web_host,
        web_port=args.web_port or 0,
    )
    try:
        await local.start()
        if local.converted:
            print(local.converted, flush=True)
        if fallback:
            print(fallback, flush=True)
        _print_started(local, data_dir)
        code = 0
        if not args.no_demo and local.agent_ids and not stop.is_set():
            code = await _demo(local, args, runtime, stop)
        if not stop.is_set():
            _print_connect(data_dir)
            await _supervise(local, stop)
        return code
    except stack.StackError as e:
        raise CliError(str(e)) from None
    finally:
        started = local.server is not None  # refused before nats-server: nothing stopped
        local.stop()
        if started:
            with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) takes no more output
                print("Hoist stack stopped (the event log stays in the data dir)", flush=True)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CliError(f"--dummy-config {path}: {e}") from None
    if not isinstance(value, dict):
        raise CliError(f"--dummy-config {path} must hold a JSON object of DummyConfig fields")
    return value


def _print_started(local: stack.Stack, data_dir: Path) -> None:
    agents = ", ".join(local.agent_ids) or "none"
    servers = f"{len(local.servers)} nats-servers (a cluster)" if len(local.servers) > 1 else ""
    print(
        f"Hoist stack up: {servers or 'nats-server'} at {local.url}, data in {data_dir}",
        flush=True,
    )
    if not local.sync_always:
        print("  --no-sync-always: acknowledged events can be lost on power loss", flush=True)
    managers = "manager" if local.managers == 1 else f"{local.managers} managers (one leads)"
    print(f"  {managers} and {len(local.agent_ids)} {local.runtime} agent(s): {agents}", flush=True)
    if local.runtime == "dummy":
        images = ", ".join(stack.DEMO_IMAGES)
        print(f"  dummy agents' images (others are not found): {images}", flush=True)
        print(f"  the dummy runtime simulates {SIMULATES}", flush=True)
    if local.web_url:
        print(f"  web view: {local.web_url}?token={local.web_token}", flush=True)
    metrics = ", ".join(f"{n} :{p}" for n, p in local.metrics_ports.items())
    print(f"  Prometheus /metrics on 127.0.0.1: {metrics} (also in stack.json)", flush=True)


def _print_connect(data_dir: Path) -> None:
    hoist = stack_cmds.hoist_command() + stack_home.data_dir_flag(data_dir)
    print("Running; Ctrl-C stops the stack. From another terminal:", flush=True)
    for line in (
        f"{hoist} run jupyter/scipy-notebook:2024-05 --cluster-size 2",
        f"{hoist} ps | sessions | agents | images | pulls",
        f"{hoist} events --follow",
        f"{hoist} creds client     (a NATS URL for scripts and the nats CLI)",
        f"{hoist} status | down     (check the stack, stop it)",
    ):
        print(f"  {line}", flush=True)


async def _demo(
    local: stack.Stack, args: argparse.Namespace, runtime: str, stop: asyncio.Event
) -> int:
    image = args.demo_image or stack.DEMO_IMAGE[runtime]
    size = min(2, len(local.agent_ids))
    conn = await Connection.open(local.role_url("client"), "hoist-up-demo")
    try:
        # Once per data dir (the log knows): a restarted stack does not pile up demos.
        earlier = None if args.demo else await demo.earlier_demo(conn)
        if earlier is not None:
            print(
                f"demo: session {earlier} was started here before (`hoist ps` shows it);"
                " `hoist up --demo` starts another",
                flush=True,
            )
            return 0
        print(f"demo: a {size}-kernel session of {image}", flush=True)
        reply = await conn.request(
            SESSION_CREATE,
            {
                "owner": demo.OWNER,
                "image": image,
                "resources": {"cpu": 1, "mem": 512 * 1024**2},
                "cluster_size": size,
                **({} if args.demo else {"request_id": demo.REQUEST_ID}),
            },
        )
        return await watch_and_report(conn, reply["session_id"], max_wait=0, detach=stop)
    except CliError as e:
        print(f"demo failed: {e}", flush=True)  # the stack itself is fine: keep it up
        return 0
    finally:
        await conn.close()


# A child that dies is started again after this long, doubled for each death that follows
# within RESTART_RESET_S of its start (a crash loop backs off), up to RESTART_MAX_S.
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
RESTART_RESET_S = 60.0


async def _supervise(local: stack.Stack, stop: asyncio.Event) -> None:
    """Wait for Ctrl-C; start a child process that died on its own again (saying so), as a
    service manager would: each recovers from a kill by design."""
    backoff: dict[str, float] = {}
    due: dict[str, float] = {}  # child name -> when to start it again
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        for child in local.exited():
            now = loop.time()
            if child.name not in due:
                ran = time.monotonic() - child.started_at
                wait = RESTART_FIRST_S if ran >= RESTART_RESET_S else backoff.get(child.name, 0)
                wait = min(max(wait, RESTART_FIRST_S), RESTART_MAX_S)
                backoff[child.name] = wait * 2
                due[child.name] = now + wait
                print(
                    f"{child.name} exited with code {child.proc.returncode}; starting it again"
                    f" in {wait:g}s (its log: {child.log})",
                    flush=True,
                )
            elif now >= due[child.name]:
                del due[child.name]
                again = local.restart(child)
                print(f"{child.name} started again (pid {again.proc.pid})", flush=True)
        with contextlib.suppress(TimeoutError):  # asyncio.timeout: see EventStore.replay
            async with asyncio.timeout(0.5):
                await stop.wait()
