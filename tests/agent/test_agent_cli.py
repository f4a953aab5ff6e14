"""``python -m agent`` as a real process: starts, registers, serves, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from domain import events as ev
from domain import rpc
from eventstore.store import EventStore
from services.stack.natsserver import NatsServer
from tests.agent.agent_harness import (
    call,
    event_of,
    store_fixture,  # noqa: F401 - the `store` fixture
)
from transport.client import Client

GB = 1024**3


async def test_python_m_agent_registers_serves_and_stops_cleanly(
    nats_server: NatsServer, nc: Client, store: EventStore
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent",
        "--id", "cli-1", "--runtime", "dummy", "--resource-group", "rg",
        "--nats-url", nats_server.url, "--cpu", "2", "--mem", "1g", "--disk", "10GiB",
        "--heartbeat-interval", "0.2", "--slot", "gpu=2", "--keep-exited", "60",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line == b"agent cli-1 ready\n"
        registered = await event_of(store, "cli-1", ev.AgentRegistered)
        assert registered.capacity == ev.Capacity(cpu=2, mem=GB, disk=10 * GB, slots={"gpu": 2})
        reply = await call(nc, "cli-1", rpc.CHECK_AND_PULL, {"images": ["x:1"]})
        await event_of(store, "cli-1", ev.ImagePulled, task_id=reply["x:1"]["task_id"])
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 30)
    assert rc == 0


async def test_bad_options_exit_2_naming_the_option(nats_server: NatsServer) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent",
        "--id", "cli-2", "--runtime", "dummy", "--resource-group", "rg",
        "--nats-url", nats_server.url, "--mem", "lots",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert b"--mem must be bytes or a size like 512m" in err


async def test_a_bad_slot_exits_2_naming_the_option(nats_server: NatsServer) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent",
        "--id", "cli-4", "--runtime", "dummy", "--resource-group", "rg",
        "--nats-url", nats_server.url, "--slot", "gpu",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert b"--slot must be NAME=AMOUNT, e.g. gpu=2" in err


async def test_no_nats_url_anywhere_exits_2_saying_where_to_put_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HOIST_NATS_URL"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "--id", "cli-3", "--runtime", "dummy",
        "--resource-group", "rg", stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert b"no NATS URL: set HOIST_NATS_URL (or give --nats-url)" in err
