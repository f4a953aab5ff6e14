"""Helpers for the manager tests: an in-process manager, in-process dummy agents (the agent
package, as tests/agent does), and the API called over NATS like a client would."""

from __future__ import annotations

import argparse
import base64
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from agent.pulls import PullPolicy
from agent.runtime.dummy import DummyConfig, DummyHost, DummyRuntime
from agent.server import AgentServer
from domain.scheduling import Limits, Policy
from domain.subjects import SESSION_CREATE, SESSION_GET, SESSION_LOGS, STREAM_READ, inbox_prefix
from eventstore.store import EventStore
from services.manager.main import Manager, ManagerConfig
from services.manager.scheduler_loop import Plan
from tests.agent.agent_harness import config, running, wait_for
from transport.client import Client

MB = 1024 * 1024
GB = 1024 * MB
SETTLED = {"RUNNING", "ERROR", "CANCELLED", "TERMINATED"}


def dummy(agent_id: str, host: DummyHost | None = None, **cfg: Any) -> DummyRuntime:
    values: dict[str, Any] = {
        "default_size": 8 * MB,
        "bandwidth_bps": None,  # instant pulls unless a test wants them slow
        "tick_s": 0.01,
        "preloaded": {"base:1"},
    }
    return DummyRuntime(agent_id, DummyConfig(**{**values, **cfg}), host)


@asynccontextmanager
async def agents(
    nc: Client,
    store: EventStore,
    ids: list[str],
    *,
    cpu: float = 4,
    mem: int = 8 * GB,
    pulls: PullPolicy | None = None,
    resource_group: str = "default",
    **dummy_cfg: Any,
) -> AsyncIterator[dict[str, AgentServer]]:
    """Dummy agents serving their RPC subjects in this process."""
    async with AsyncExitStack() as stack:
        out = {}
        for agent_id in ids:
            cfg = config(
                agent_id,
                cpu=cpu,
                mem=mem,
                disk=100 * GB,
                resource_group=resource_group,
                pulls=pulls or PullPolicy(backoff_s=0.05, stall_timeout_s=60),
            )
            runtime = dummy(agent_id, **dummy_cfg)
            out[agent_id] = await stack.enter_async_context(running(nc, store, runtime, cfg))
        yield out


def manager_config(**overrides: Any) -> ManagerConfig:
    values: dict[str, Any] = {
        "limits": Limits(),
        "policy": Policy(),
        "pull_check_interval_s": 0.2,
        "retry_s": 0.2,
        # One in-process manager leads unleased: no lease renewals in the log a test reads
        # (tests of several managers give each a lease_ttl_s and a manager_id).
        "lease_ttl_s": None,
        # The tests' images are simulated (dummy agents) or in the test registry: a test that
        # wants the registry asked (tests/fleet/test_prepull_registry.py) says so.
        "prepull_registry": False,
    }
    return ManagerConfig(**{**values, **overrides})


@asynccontextmanager
async def manager(
    nc: Client, planner: Plan | None = None, **overrides: Any
) -> AsyncIterator[Manager]:
    m = Manager(nc, manager_config(**overrides), planner)
    await m.start()
    try:
        yield m
    finally:
        await m.stop()


async def request(
    nc: Client, subject: str, payload: Any, within: float = 10, user: str | None = None
) -> Any:
    """One request; on a user's own subject (``hoist.api.<user>.<x>.<y>``,
    ``hoist.query.<user>.<name>``, or ``user``'s: ``hoist.admin.<user>.…``) from that user's
    inbox, the only one the manager answers."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    user = user or _user_of(subject)
    if user is None:
        reply = await nc.request(subject, data, timeout=within)
    else:
        inbox = f"{inbox_prefix(user)}.{uuid.uuid4().hex}"
        sub = await nc.subscribe(inbox, max_msgs=1)
        await nc.publish(subject, data, reply=inbox)
        reply = await sub.next_msg(timeout=within)
    return json.loads(reply.data)


def _user_of(subject: str) -> str | None:
    tokens = subject.split(".")
    if tokens[:2] == ["hoist", "api"] and len(tokens) == 5:
        return tokens[2]
    if tokens[:2] == ["hoist", "query"] and len(tokens) == 4:
        return tokens[2]
    return None


def create_payload(**overrides: Any) -> dict[str, Any]:
    return {"owner": "alice", "image": "base:1", "resources": {"cpu": 1, "mem": 256 * MB}} | (
        overrides
    )


async def create(nc: Client, **overrides: Any) -> dict[str, Any]:
    reply = await request(nc, SESSION_CREATE, create_payload(**overrides))
    assert "error" not in reply, reply
    return reply  # type: ignore[no-any-return]


async def get(nc: Client, session_id: str) -> dict[str, Any]:
    reply = await request(nc, SESSION_GET, {"session_id": session_id})
    assert "error" not in reply, reply
    return reply  # type: ignore[no-any-return]


async def until(
    nc: Client,
    session_id: str,
    check: Callable[[dict[str, Any]], bool] = lambda s: s["status"] in SETTLED,
    within: float = 15,
    what: str = "settled",
) -> dict[str, Any]:
    """Poll session.get until ``check`` holds; the last view."""
    last: dict[str, Any] = {}

    async def probe() -> bool:
        nonlocal last
        last = await get(nc, session_id)
        return check(last)

    try:
        await wait_for(probe, within, f"session {session_id} {what}")
    except AssertionError as e:
        raise AssertionError(f"{e}; last: {last}") from None
    return last


def elapsed(start: float) -> float:
    return time.monotonic() - start


ENDED = {"TERMINATED", "CANCELLED", "ERROR"}


def ended(s: dict[str, Any]) -> bool:
    return s["status"] in ENDED


# Names of the manager's loops and of the agent RPCs: words for developers, never for the person
# reading a status_info (a reason code such as check-and-pull-failed is not one: whole words).
INTERNAL_NAMES = (
    "check-pulling-kernels", "check-and-pull", "pull-status", "sync-kernels", "pin-images",
    "agent resource sync", "agent reconciliation", "scheduling pass", "liveness check",
    "prepull convergence", "lifetime and idle check", "reactor",
)  # fmt: skip
_INTERNAL = re.compile(
    "|".join(rf"(?<![\w-]){re.escape(name)}(?![\w-])" for name in INTERNAL_NAMES)
)


def internal_names(manager: Manager) -> list[str]:
    """Every status_info of the manager's sessions that names an internal loop or RPC."""
    return [
        change.status_info
        for session in manager.fleet.sessions.values()
        for kernel in session.kernels.values()
        for change in kernel.status_history
        if _INTERNAL.search(change.status_info)
    ]


async def read_stream(
    nc: Client, opened: dict[str, Any], within: float = 30
) -> tuple[bytes, dict[str, Any]]:
    """Everything a kernel output stream gives until its last chunk: (the bytes, that chunk)."""
    assert "error" not in opened, opened
    data, cursor = b"", 0
    deadline = time.monotonic() + within
    while True:
        chunk = await request(
            nc,
            STREAM_READ,
            {"agent_id": opened["agent_id"], "stream_id": opened["stream_id"], "cursor": cursor,
             "wait": 1},
        )  # fmt: skip
        assert "error" not in chunk, chunk  # a refusal (why a stream ended is its "reason")
        data += base64.b64decode(chunk["data"])
        cursor = chunk["cursor"]
        if chunk.get("done"):
            return data, chunk
        assert time.monotonic() < deadline, f"stream not done after {within}s: {data!r}"


async def logs(nc: Client, session_id: str, **extra: Any) -> bytes:
    """A kernel's whole output (the main kernel's unless ``kernel_id`` says another)."""
    opened = await request(nc, SESSION_LOGS, {"session_id": session_id, **extra})
    return (await read_stream(nc, opened))[0]


async def run_cli(register: Callable[[Any], None], *argv: str) -> None:
    """One CLI command of a module that ``register``s its sub-commands (e.g. services.cli.quotas),
    run as ``hoist`` would, in this process."""
    parser = argparse.ArgumentParser(prog="hoist")
    parser.add_argument("--data-dir", default=".hoist")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    await args.func(args)
