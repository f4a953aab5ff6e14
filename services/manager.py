"""The manager process: ``python -m services.manager --nats-url URL [options]``.

It folds the event log into its view (services.fleet), then serves the commands (services.api)
and runs the scheduler, the session reactors, the check-pulling-kernels loop and the liveness
watcher. It keeps nothing the log cannot rebuild: killed at any moment and started again, it
replays, kicks every unsettled session, and each carries on from its state in the log.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import nats
from nats.aio.client import Client

from domain.scheduling import Limits, Policy
from services import natsauth
from services.api import Api
from services.eventstore import progress
from services.eventstore.repository import Repository
from services.fleet import Fleet
from services.liveness import DEFAULT_DEADLINE_S, LivenessWatcher
from services.pulling_loop import PullingLoop
from services.reactors import AgentRpc, Reactors
from services.scheduler_loop import Plan, SchedulerLoop
from services.stack import event_store

log = logging.getLogger("manager")


@dataclass(frozen=True)
class ManagerConfig:
    limits: Limits = field(default_factory=Limits)
    policy: Policy = field(default_factory=Policy)
    pull_timeout_s: float = 7200.0  # Backend.AI's default
    stall_timeout_s: float = 300.0
    pull_check_interval_s: float = 5.0
    liveness_deadline_s: float = DEFAULT_DEADLINE_S
    retry_s: float = 1.0  # an unreachable agent is asked again after this


class Manager:
    """``await Manager(nc, config).start()`` ... ``await manager.stop()``."""

    def __init__(
        self, nc: Client, config: ManagerConfig | None = None, planner: Plan | None = None
    ) -> None:
        self.nc = nc
        self.config = config = config or ManagerConfig()
        self.store = event_store(nc)
        self.repository = Repository(self.store)
        self.fleet = Fleet(self.store, self.repository)
        self.rpc = AgentRpc(nc)
        self.reactors = Reactors(self.fleet, self.rpc, retry_s=config.retry_s)
        self.scheduler = SchedulerLoop(
            self.fleet,
            config.limits,
            config.policy,
            self.reactors.kick,
            **({"planner": planner} if planner else {}),
        )
        self.api = Api(nc, self.fleet, self.reactors, self.scheduler.wake)
        self.pulling = PullingLoop(
            self.fleet,
            self.rpc,
            self.reactors,
            interval_s=config.pull_check_interval_s,
            pull_timeout_s=config.pull_timeout_s,
            stall_timeout_s=config.stall_timeout_s,
        )
        self.liveness = LivenessWatcher(nc, self.repository, deadline_s=config.liveness_deadline_s)
        self.fleet.on_room = self.scheduler.wake
        self.fleet.on_agent_event = self.reactors.on_agent_event
        self.fleet.on_session_reloaded = self.reactors.kick

    async def start(self) -> None:
        await self.store.ensure_stream()
        await progress.ensure(self.nc.jetstream())
        await self.fleet.start()  # the whole log folded before anything acts on it
        await self.liveness.start(a for a, s in self.fleet.agents.items() if s.live)
        await self.api.start()
        self.scheduler.start()
        for sid in self.fleet.unsettled_sessions():
            self.reactors.kick(sid)
        self.pulling.start()
        log.info(
            "manager ready: %d sessions, %d agents, log at %d",
            len(self.fleet.sessions),
            len(self.fleet.agents),
            self.fleet.last_seq,
        )

    async def stop(self) -> None:
        await self.api.stop()
        await self.pulling.stop()
        await self.scheduler.stop()
        await self.reactors.stop()
        await self.liveness.stop()
        await self.fleet.stop()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hoist manager", description="Run the Hoist manager (the control plane)."
    )
    p.add_argument("--nats-url", required=True, help="nats://[user:password@]host:port")
    p.add_argument(
        "--data-dir",
        type=Path,
        help="a stack's data dir: log in as its manager user when the URL has no credentials",
    )
    s = p.add_argument_group("scheduling")
    s.add_argument("--strategy", choices=("concentrated", "dispersed"), default="dispersed")
    s.add_argument(
        "--no-image-locality",
        action="store_true",
        help="do not prefer agents that already hold the image",
    )
    s.add_argument(
        "--fifo-strict",
        action="store_true",
        help="a session that does not fit holds back later ones of its resource group",
    )
    s.add_argument("--max-sessions-per-owner", type=int)
    s.add_argument("--max-cpu-per-session", type=float, help="cores")
    s.add_argument("--max-mem-per-session", type=int, help="bytes")
    s.add_argument("--max-cluster-size", type=int)
    pulls = p.add_argument_group("pulls")
    pulls.add_argument("--pull-timeout", type=float, default=7200.0, help="seconds")
    pulls.add_argument(
        "--stall-timeout", type=float, default=300.0, help="seconds without pull progress"
    )
    pulls.add_argument(
        "--pull-check-interval", type=float, default=5.0, help="seconds between checks"
    )
    p.add_argument("--heartbeat-deadline", type=float, default=DEFAULT_DEADLINE_S, help="seconds")
    p.add_argument("--log-level", default="INFO")
    return p


def config_from(args: argparse.Namespace) -> ManagerConfig:
    return ManagerConfig(
        limits=Limits(
            max_sessions_per_owner=args.max_sessions_per_owner,
            max_cpu_per_session=args.max_cpu_per_session,
            max_mem_per_session=args.max_mem_per_session,
            max_cluster_size=args.max_cluster_size,
        ),
        policy=Policy(
            strategy=args.strategy,
            image_locality=not args.no_image_locality,
            fifo_strict=args.fifo_strict,
        ),
        pull_timeout_s=args.pull_timeout,
        stall_timeout_s=args.stall_timeout,
        pull_check_interval_s=args.pull_check_interval,
        liveness_deadline_s=args.heartbeat_deadline,
    )


def _url(args: argparse.Namespace) -> str:
    if args.data_dir is None or urlsplit(args.nats_url).username:
        return str(args.nats_url)
    return natsauth.role_url(args.nats_url, "manager", natsauth.load_credentials(args.data_dir))


async def run(args: argparse.Namespace) -> None:
    config = config_from(args)
    nc = await nats.connect(
        _url(args), name="hoist-manager", max_reconnect_attempts=-1, reconnect_time_wait=0.5
    )
    manager = Manager(nc, config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await manager.start()
        print("manager ready", flush=True)  # for supervisors and tests
        await stop.wait()
    finally:
        await manager.stop()
        await nc.drain()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    try:
        asyncio.run(run(args))
    except (ValueError, FileNotFoundError) as e:
        print(f"hoist manager: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
