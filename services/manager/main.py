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
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from domain import events as ev
from domain.contracts.agents import DEFAULT_TRIGGERS, TRIGGERS
from domain.scheduling import Limits, Policy
from domain.subjects import (
    AGENT_SYNC,
    JOB,
    JOBS,
    POLICY_LIST,
    POLICY_PLAN,
    POLICY_REMOVE,
    POLICY_SET,
    PRELOAD,
    UNLOAD,
)
from services.eventstore.bulk import bulk_reader
from services.eventstore.repository import Repository
from services.eventstore.store import event_store
from services.manager.agent_sync import AgentSync
from services.manager.api import Api
from services.manager.fleet import Fleet
from services.manager.images_admin import ImagesAdmin
from services.manager.liveness import DEFAULT_DEADLINE_S, LivenessWatcher
from services.manager.prepull import PrepullLoop
from services.manager.pulling_loop import PullingLoop
from services.manager.reactors import AgentRpc, Reactors
from services.manager.read_models import IN_MEMORY, ReadModels
from services.manager.scheduler_loop import Plan, SchedulerLoop
from services.transport import credentials, progress
from services.transport.client import Client
from services.transport.connection import connect_for_ever, serve_until_signalled

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
    # Agent resource sync (seed 002): triggers, heartbeat reconciliation, lost agents' kernels.
    sync_triggers: frozenset[str] = DEFAULT_TRIGGERS
    reconcile_interval_s: float = 5.0
    reconcile_grace_s: float = 2.0  # a heartbeat this much newer than a change can judge it
    lost_grace_s: float = 15.0  # RUNNING kernels of an agent lost this long: TERMINATED
    prepull_interval_s: float = 10.0
    prepull_parallelism: int = 16  # agents asked to converge at a time
    read_models: Path | None = None  # the DuckDB file; None: in memory (rebuilt at each start)
    # NATS URL (with credentials) a child process reads long catch-ups through; None: in-process
    bulk_read_url: str | None = None


class Manager:
    """``await Manager(nc, config).start()`` ... ``await manager.stop()``."""

    def __init__(
        self, nc: Client, config: ManagerConfig | None = None, planner: Plan | None = None
    ) -> None:
        self.nc = nc
        self.config = config = config or ManagerConfig()
        self.store = event_store(nc)
        self.repository = Repository(self.store, actor="manager")
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
        self.prepull = PrepullLoop(
            self.fleet,
            self.repository,
            self.rpc,
            interval_s=config.prepull_interval_s,
            parallelism=config.prepull_parallelism,
        )
        self.images = ImagesAdmin(nc, self.fleet, self.rpc, policy_pins=self.prepull.pins)
        self.pulling = PullingLoop(
            self.fleet,
            self.rpc,
            self.reactors,
            interval_s=config.pull_check_interval_s,
            pull_timeout_s=config.pull_timeout_s,
            stall_timeout_s=config.stall_timeout_s,
        )
        self.liveness = LivenessWatcher(nc, self.repository, deadline_s=config.liveness_deadline_s)
        self.sync = AgentSync(
            self.fleet,
            self.rpc,
            self.reactors,
            self.liveness,
            triggers=config.sync_triggers,
            interval_s=config.reconcile_interval_s,
            grace_s=config.reconcile_grace_s,
            lost_grace_s=config.lost_grace_s,
        )
        self.scheduler.on_scheduled = self._scheduled
        for subject, handler in {
            AGENT_SYNC: self.sync.handle,
            PRELOAD: self.images.preload,
            UNLOAD: self.images.unload,
            JOB: self.images.job,
            JOBS: self.images.list_jobs,
            POLICY_SET: self.prepull.set_policy,
            POLICY_REMOVE: self.prepull.remove_policy,
            POLICY_LIST: self.prepull.list_policies,
            POLICY_PLAN: self.prepull.show_plan,
        }.items():
            self.api.register(subject, handler)
        self.read_models = ReadModels(
            nc,
            self.store,
            config.read_models or IN_MEMORY,
            bulk=bulk_reader(config.bulk_read_url) if config.bulk_read_url else None,
        )
        self.fleet.on_room = self.scheduler.wake
        self.fleet.on_agent_event = self._agent_event
        self.fleet.on_policy_event = lambda name: self.prepull.wake()
        self.fleet.on_session_reloaded = self.reactors.kick

    def _scheduled(self, session_id: str) -> None:
        self.sync.after_scheduling(session_id)
        self.reactors.kick(session_id)

    def _agent_event(self, agent_id: str, event: ev.Event) -> None:
        self.reactors.on_agent_event(agent_id, event)
        self.images.on_agent_event(agent_id, event)
        self.prepull.on_agent_event(agent_id, event)
        if isinstance(event, ev.AgentRegistered | ev.AgentReregistered):
            self.sync.forget_pins(agent_id)

    async def start(self) -> None:
        await self.store.ensure_stream()
        await progress.ensure(self.nc.jetstream())
        await self.fleet.start()  # the whole log folded before anything acts on it
        await self.liveness.start(a for a, s in self.fleet.agents.items() if s.live)
        await self.images.start()
        await self.api.start()
        await self.read_models.start()
        self.scheduler.start()
        for sid in self.fleet.unsettled_sessions():
            self.reactors.kick(sid)
        self.pulling.start()
        self.sync.start()
        self.prepull.start()
        log.info(
            "manager ready: %d sessions, %d agents, log at %d",
            len(self.fleet.sessions),
            len(self.fleet.agents),
            self.fleet.last_seq,
        )

    async def stop(self) -> None:
        await self.api.stop()
        await self.prepull.stop()
        await self.sync.stop()
        await self.images.stop()
        await self.read_models.stop()
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
    sync = p.add_argument_group("agent resource sync (seed 002)")
    sync.add_argument(
        "--agent-resource-sync-trigger",
        action="append",
        choices=TRIGGERS,
        help=f"when to sync agents' kernels (repeatable; default {sorted(DEFAULT_TRIGGERS)})",
    )
    sync.add_argument(
        "--reconcile-interval", type=float, default=5.0, help="seconds between heartbeat checks"
    )
    sync.add_argument(
        "--lost-grace",
        type=float,
        default=15.0,
        help="seconds after AgentLost before its RUNNING kernels are TERMINATED agent-lost",
    )
    p.add_argument("--prepull-interval", type=float, default=10.0, help="seconds")
    p.add_argument(
        "--read-models",
        type=Path,
        help="the read models' DuckDB file (default: DATA_DIR/readmodels.duckdb with --data-dir,"
        " else in memory)",
    )
    p.add_argument(
        "--no-bulk-read",
        action="store_true",
        help="catch up the read models in this process only, without a reader child process"
        " (it helps only with a second core)",
    )
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
        sync_triggers=frozenset(args.agent_resource_sync_trigger or DEFAULT_TRIGGERS),
        reconcile_interval_s=args.reconcile_interval,
        lost_grace_s=args.lost_grace,
        prepull_interval_s=args.prepull_interval,
        read_models=args.read_models
        or (args.data_dir / "readmodels.duckdb" if args.data_dir else None),
        bulk_read_url=None if args.no_bulk_read else _url(args),
    )


def _url(args: argparse.Namespace) -> str:
    if args.data_dir is None or urlsplit(args.nats_url).username:
        return str(args.nats_url)
    return credentials.role_url(
        args.nats_url, "manager", credentials.load_credentials(args.data_dir)
    )


async def run(args: argparse.Namespace) -> None:
    config = config_from(args)

    nc = await connect_for_ever(_url(args), "hoist-manager", log)
    await serve_until_signalled(nc, Manager(nc, config), "manager ready")


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
