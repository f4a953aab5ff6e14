"""The agent's command line: ``HOIST_NATS_URL=URL python -m agent --id ID --runtime docker|dummy
--resource-group G [options]`` (or ``--nats-url URL``, which ``ps`` shows; ``hoist agent ...``
runs the same).  Runs until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from agent.config import (
    RUNTIMES,
    AgentConfig,
    load_registry_auth,
    parse_gpu_ids,
    parse_size,
    parse_slot,
)
from agent.gc import GcPolicy
from agent.pulls import PullPolicy
from agent.runtime.base import Runtime
from agent.server import AgentServer
from transport.connection import connect_for_ever, run_process, serve_until_signalled
from transport.metrics import MetricsServer

URL_ENV = "HOIST_NATS_URL"  # the NATS URL with the agent's password, kept out of `ps`

log = logging.getLogger("agent")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hoist agent", description="Run one Hoist agent: pulls images, runs kernels."
    )
    p.add_argument("--id", required=True, help="agent id (letters, digits, '_', '-')")
    p.add_argument("--runtime", required=True, choices=RUNTIMES)
    p.add_argument("--resource-group", required=True, help="the resource group it serves")
    p.add_argument(
        "--nats-url",
        default=os.environ.get(URL_ENV),
        help=f"e.g. nats://agent-ID:PASSWORD@host:4222, or a cluster's servers comma-separated"
        f" (default: ${URL_ENV}, which keeps the password out of `ps`)",
    )
    cap = p.add_argument_group("capacity offered (default: what the host has)")
    cap.add_argument("--cpu", type=float, help="cores")
    cap.add_argument("--mem", help="bytes, or a size like 512m, 16g")
    cap.add_argument("--disk", help="bytes for images, or a size like 100g")
    cap.add_argument(
        "--slot",
        action="append",
        default=[],
        metavar="NAME=AMOUNT",
        help="another resource slot offered, e.g. gpu=2 (repeatable)",
    )
    cap.add_argument(
        "--gpu-ids",
        metavar="ID,ID,...",
        help="with --slot gpu=N: the N GPUs to hand out, device indices or UUIDs"
        " (default: 0,1,...,N-1)",
    )
    p.add_argument(
        "--address", default="127.0.0.1", help="where kernels' published ports are reachable"
    )
    p.add_argument(
        "--keep-exited",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how long an ended kernel's container (and its logs) is kept",
    )
    p.add_argument("--docker-host", help="docker runtime: e.g. unix:///var/run/docker.sock")
    p.add_argument("--dummy-config", type=Path, help="dummy runtime: JSON of DummyConfig fields")
    p.add_argument(
        "--dummy-state",
        type=Path,
        metavar="FILE",
        help="dummy runtime: keep the simulated host (images, containers, volumes) in this JSON"
        " file, so a restarted agent finds it as it was (default: in memory only)",
    )
    p.add_argument("--registry-auth", type=Path, help="JSON {registry: {username, password}}")
    pulls = p.add_argument_group("pulls")
    d = PullPolicy()
    pulls.add_argument("--max-parallel-pulls", type=int, default=d.max_parallel)
    pulls.add_argument("--pull-timeout", type=float, default=d.timeout_s, help="seconds")
    pulls.add_argument(
        "--stall-timeout", type=float, default=d.stall_timeout_s, help="seconds without progress"
    )
    pulls.add_argument("--pull-retries", type=int, default=d.retries)
    p.add_argument("--heartbeat-interval", type=float, default=2.0, help="seconds")
    gc = p.add_argument_group("image GC (kubelet's rule: LRU, never in use or pinned)")
    fs = "percent full of the engine's filesystem (Docker: its root dir; else of --disk)"
    gc.add_argument("--image-gc-high", type=float, default=85.0, help=f"GC starts above: {fs}")
    gc.add_argument("--image-gc-low", type=float, default=80.0, help=f"GC stops at: {fs}")
    gc.add_argument("--image-gc-interval", type=float, default=30.0, help="seconds")
    p.add_argument(
        "--metrics-port", type=int, help="serve Prometheus /metrics on this port (0: any free one)"
    )
    p.add_argument(
        "--metrics-host", default="127.0.0.1", help="the address /metrics binds (default local)"
    )
    p.add_argument("--log-level", default="INFO")
    return p


def config_from(args: argparse.Namespace) -> AgentConfig:
    return AgentConfig(
        agent_id=args.id,
        resource_group=args.resource_group,
        runtime=args.runtime,
        cpu=args.cpu,
        mem=parse_size(args.mem, "--mem") if args.mem is not None else None,
        disk=parse_size(args.disk, "--disk") if args.disk is not None else None,
        heartbeat_interval_s=args.heartbeat_interval,
        slots=_slots(args.slot),
        gpu_ids=parse_gpu_ids(args.gpu_ids) if args.gpu_ids else (),
        address=args.address,
        keep_exited_s=args.keep_exited,
        pulls=PullPolicy(
            max_parallel=args.max_parallel_pulls,
            timeout_s=args.pull_timeout,
            stall_timeout_s=args.stall_timeout,
            retries=args.pull_retries,
        ),
        registry_auth=load_registry_auth(args.registry_auth) if args.registry_auth else {},
        gc=GcPolicy(
            high=args.image_gc_high / 100,
            low=args.image_gc_low / 100,
            interval_s=args.image_gc_interval,
        ),
    )


def _slots(values: list[str]) -> dict[str, float]:
    slots: dict[str, float] = {}
    for value in values:
        name, amount = parse_slot(value)
        if name in slots:
            raise ValueError(f"--slot {name} is given twice")
        slots[name] = amount
    return slots


def make_runtime(args: argparse.Namespace, agent_id: str) -> Runtime:
    if args.runtime == "docker":
        from agent.runtime.docker import DockerRuntime

        return DockerRuntime(agent_id, base_url=args.docker_host, address=args.address)
    from agent.runtime.dummy import DummyConfig, DummyRuntime

    config = DummyConfig()
    if args.dummy_config is not None:
        try:
            config = DummyConfig(**json.loads(args.dummy_config.read_text()))
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(f"--dummy-config {args.dummy_config}: {e}") from None
    if not config.slots:  # a simulated host has the devices its agent offers
        config = dataclasses.replace(config, slots=_slots(args.slot))
    return DummyRuntime(agent_id, config, address=args.address, state_file=args.dummy_state)


async def run(args: argparse.Namespace) -> None:
    config = config_from(args)
    runtime = make_runtime(args, config.agent_id)

    if not args.nats_url:
        raise ValueError(
            f"no NATS URL: set {URL_ENV} (or give --nats-url),"
            " e.g. nats://agent-ID:PASSWORD@host:4222"
        )
    nc = await connect_for_ever(args.nats_url, f"hoist-agent-{config.agent_id}", log)
    agent = AgentServer(nc, config, runtime)
    metrics = None
    if args.metrics_port is not None:
        metrics = MetricsServer(agent.metrics.registry, args.metrics_host, args.metrics_port)
        port = await metrics.start()
        log.info("metrics at http://%s:%d/metrics", args.metrics_host, port)
    try:
        await serve_until_signalled(nc, agent, f"agent {config.agent_id} ready")
    finally:
        if metrics is not None:
            await metrics.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    hint = f"check {URL_ENV} (or --nats-url) and that nats-server runs"
    return run_process("hoist agent", args.log_level, run(args), hint)
