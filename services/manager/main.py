"""The manager process: ``python -m services.manager --nats-url URL [options]``.

It folds the event log into its view (fleet), then serves the commands (server, through the
message bus to sessions, agent_sync, images_admin, prepull, quotas, groups, users) and runs the
scheduler, the session reactors, the check-pulling-kernels loop, agent resource sync, prepull
convergence, the lifetime check and the liveness watcher.  ``Manager`` is the bootstrap: it
builds each part and the bus's one table.  It keeps nothing the log cannot rebuild: killed at any
moment and started again, it replays, kicks every unsettled session, and each carries on from its
state in the log.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from domain import events as ev
from domain.contracts.agents import DEFAULT_TRIGGERS, TRIGGERS, SyncAgents
from domain.contracts.commands import ListJobs, ListPolicies, ShowPlans, ShowStats
from domain.contracts.dotfiles import ListDotfiles, RemoveDotfile, SetDotfile
from domain.contracts.groups import ListGroups, RemoveGroup, SetGroup
from domain.contracts.images import JobRequest, PreloadRequest, UnloadRequest
from domain.contracts.policies import RemovePolicy, SetPolicy
from domain.contracts.quotas import MyQuota, RemoveQuota, SetQuota, ShowQuotas
from domain.contracts.sessions import (
    CancelKernel,
    CreateSession,
    DestroySession,
    GetSession,
    ListVolumes,
    ReadStream,
    RemoveVolume,
    SessionExec,
    SessionLogs,
)
from domain.contracts.users import AddUser, DisableUser, ListUsers
from domain.scheduling import Limits, Policy
from eventstore.bulk import bulk_reader
from eventstore.repository import Repository
from eventstore.store import Write, event_store
from services.manager.admin_sql import DEFAULT_MEMORY
from services.manager.agent_rpc import AgentRpc
from services.manager.agent_sync import AgentSync
from services.manager.bus import LookAgain, MessageBus, On, RoomFreed, Serve
from services.manager.dotfiles import DotfileCommands
from services.manager.fleet import Fleet
from services.manager.groups import Groups
from services.manager.history import History
from services.manager.hooks import DEFAULT_TIMEOUT_S as DEFAULT_HOOK_TIMEOUT_S
from services.manager.hooks import HookCalls, Hooks
from services.manager.images_admin import ImagesAdmin
from services.manager.kernel_io import KernelIO
from services.manager.leadership import DEFAULT_TTL_S, Leadership
from services.manager.liveness import DEFAULT_BEATS_PER_S, DEFAULT_DEADLINE_S, LivenessWatcher
from services.manager.metrics import ManagerMetrics
from services.manager.open_streams import OpenStreams
from services.manager.prepull import PrepullLoop
from services.manager.pulling_loop import PullingLoop
from services.manager.quotas import Quotas
from services.manager.reactors import Reactors
from services.manager.read_models import IN_MEMORY, ReadModels
from services.manager.read_models_process import ReadModelsProcess
from services.manager.registry import RegistryClient
from services.manager.scheduler_loop import Plan, SchedulerLoop
from services.manager.server import CommandServer
from services.manager.sessions import SessionCommands
from services.manager.stats import Stats
from services.manager.uow import UnitOfWork
from services.manager.users import Users
from transport import credentials, progress
from transport.client import Client
from transport.connection import connect_for_ever, run_process, serve_until_signalled
from transport.gc_pauses import keep_pauses_short
from transport.metrics import MetricsServer

log = logging.getLogger("manager")

# Commands whose state is the leading manager's memory: the streams logs and exec opened,
# preload and unload jobs, agent sync.  Every other command any manager serves, appending with
# optimistic concurrency like the leader (services.manager.leadership).
LEADER_ONLY: frozenset[type] = frozenset(
    {
        SessionLogs,
        SessionExec,
        ReadStream,
        PreloadRequest,
        UnloadRequest,
        JobRequest,
        ListJobs,
        SyncAgents,
    }
)


M = TypeVar("M")  # a message of the bus (an event or a command)
R = TypeVar("R")  # a command's reply


@dataclass(frozen=True)
class Drills:
    """Switches of the several-managers chaos drills (tests/manager/test_chaos_managers.py,
    bench/chaos_managers.py; hidden flags of `hoist manager`): at their defaults, as in
    production, the manager behaves as documented."""

    fencing: bool = True  # False: the leader's batches carry no fence, to prove the OCC alone
    step_down_after_s: float | None = None  # lead this long, then step down (flip leaders)


@dataclass(frozen=True)
class ManagerConfig:
    """Every setting of a manager and its default (`hoist manager`'s flags take theirs from
    here)."""

    limits: Limits = field(default_factory=Limits)
    policy: Policy = field(default_factory=Policy)
    pull_timeout_s: float = 7200.0  # Backend.AI's default
    stall_timeout_s: float = 300.0
    pull_check_interval_s: float = 5.0
    liveness_deadline_s: float = DEFAULT_DEADLINE_S
    heartbeats_per_s: float = DEFAULT_BEATS_PER_S  # the fleet's, at most (domain.beats)
    retry_s: float = 1.0  # an unreachable agent is asked again after this
    # Agent resource sync: triggers, heartbeat reconciliation, lost agents' kernels.
    sync_triggers: frozenset[str] = DEFAULT_TRIGGERS
    reconcile_interval_s: float = 5.0
    reconcile_grace_s: float = 2.0  # a heartbeat this much newer than a change can judge it
    lost_grace_s: float = 15.0  # RUNNING kernels of an agent lost this long: TERMINATED
    prepull_interval_s: float = 10.0
    prepull_parallelism: int = 16  # agents asked to converge at a time
    # Ask the registries what the policies' images are at each round (services.manager.registry):
    # sizes of images no agent held, tags pushed again. HTTP for these hosts (and loopback).
    prepull_registry: bool = True
    insecure_registries: tuple[str, ...] = ()
    lifetime_check_interval_s: float = 5.0  # how often max_lifetime_s, idle_timeout_s are checked
    read_models: Path | None = None  # the DuckDB file; None: in memory (rebuilt at each start)
    # NATS URL (with credentials) of a child process that runs the read models
    # (services.manager.read_models_process); None: they run in this process (tests)
    read_models_url: str | None = None
    # DuckDB's threads for the read models and admin SQL (services.manager.read_models)
    read_models_threads: int = 1
    # Admin SQL's memory cap in bytes: each query runs in a process of its own under it
    # (services.manager.admin_sql), so the read models and the manager keep theirs
    admin_sql_memory: int = DEFAULT_MEMORY
    # NATS URL (with credentials) a child process reads long catch-ups through; None: in-process
    bulk_read_url: str | None = None
    # Freeze long-lived objects for the garbage collector (transport.gc_pauses): the
    # process does, in-process managers of tests leave their process's collector alone.
    short_gc_pauses: bool = False
    # Several managers (services.manager.leadership): this one's name in the lease (distinct
    # per manager; the same after a restart, so it takes its own lease back at once), and the
    # lease's TTL; None: no lease, this manager always leads (one manager; tests of the OCC).
    manager_id: str = field(default_factory=socket.gethostname)
    lease_ttl_s: float | None = DEFAULT_TTL_S
    drills: Drills = field(default_factory=lambda: Drills())
    # /metrics (services.manager.metrics) on this port of metrics_host; None: not served
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    # Lifecycle hooks (services.manager.hooks): besides the installed entry points, these
    # (``MODULE:ATTR``), and how long a call may take before the manager goes on without it.
    hooks: tuple[str, ...] = ()
    hook_timeout_s: float = DEFAULT_HOOK_TIMEOUT_S


class Manager:
    """``await Manager(nc, config).start()`` ... ``await manager.stop()``.

    The bootstrap: every part is built here with what it needs, and the message bus's one
    table says which handler follows which event and which command."""

    def __init__(
        self, nc: Client, config: ManagerConfig | None = None, planner: Plan | None = None
    ) -> None:
        self.nc = nc
        self.config = config = config or ManagerConfig()
        self.store = event_store(nc)
        self.repository = Repository(self.store, actor="manager")
        self.bus = MessageBus()  # wired below, once every handler exists
        bulk = bulk_reader(config.bulk_read_url) if config.bulk_read_url else None
        self.fleet = Fleet(self.store, self.repository, publish=self.bus.publish, bulk=bulk)
        self.uow = UnitOfWork(self.fleet, publish=self.bus.publish, fence=self._fence)
        self.rpc = AgentRpc(nc)
        # The parts below tell the stats how long their work takes (constructor hooks).
        self.metrics = ManagerMetrics(self.fleet, self._read_seq)
        self.stats = Stats(self.fleet, observe_pass=self.metrics.scheduler_pass.observe)
        self.liveness = LivenessWatcher(
            nc,
            self.repository,
            deadline_s=config.liveness_deadline_s,
            beats_per_s=config.heartbeats_per_s,
            acts=self.leads,
            agents=self.rpc,
            fence=self._fence,
            on_heartbeat=self.stats.heartbeats.add,
        )
        self.sync = AgentSync(
            self.fleet,
            self.uow,
            self.rpc,
            self.liveness,
            triggers=config.sync_triggers,
            interval_s=config.reconcile_interval_s,
            grace_s=config.reconcile_grace_s,
            lost_grace_s=config.lost_grace_s,
            assured=lambda: self.leadership is None or self.leadership.assured,
            on_round=self.stats.reconciliation_passes.add,  # its work, not its pauses
        )
        self.reactors = Reactors(
            self.fleet,
            self.uow,
            self.rpc,
            retry_s=config.retry_s,
            sync_before_create=self.sync.before_create(),
            sync_after_refusal=self.sync.trigger("on-creation-failure"),
            address_of=self.liveness.address_of,
        )
        self.leadership = (
            None
            if config.lease_ttl_s is None
            else Leadership(
                self.store,
                config.manager_id,
                ttl_s=config.lease_ttl_s,
                on_lead=self._lead,
                on_follow=self._follow,
                fencing=config.drills.fencing,
                step_down_after_s=config.drills.step_down_after_s,
            )
        )
        self.scheduler = SchedulerLoop(
            self.fleet,
            self.uow,
            config.limits,
            config.policy,
            **({"planner": planner} if planner else {}),
            fence=self._fence,
            on_pass=self.stats.scheduling_passes.add,
        )
        self.hooks = Hooks.load(config.hooks, config.hook_timeout_s)
        self.hook_calls = HookCalls(self.hooks, self.fleet, self.uow)
        self.sessions = SessionCommands(self.fleet, self.uow, self.hooks)
        self.kernel_io = KernelIO(self.fleet, self.rpc)
        self.prepull = PrepullLoop(
            self.fleet,
            self.uow,
            self.rpc,
            interval_s=config.prepull_interval_s,
            parallelism=config.prepull_parallelism,
            registry=(
                RegistryClient(config.insecure_registries) if config.prepull_registry else None
            ),
        )
        self.images = ImagesAdmin(nc, self.fleet, self.rpc, policy_pins=self.prepull.pins)
        self.pulling = PullingLoop(
            self.fleet,
            self.uow,
            self.rpc,
            interval_s=config.pull_check_interval_s,
            pull_timeout_s=config.pull_timeout_s,
            stall_timeout_s=config.stall_timeout_s,
        )
        self.streams = OpenStreams()  # what logs and exec opened, for whose session
        self.quotas = Quotas(
            self.fleet,
            self.uow,
            interval_s=config.lifetime_check_interval_s,
            streams=self.streams,
        )
        self.groups = Groups(self.fleet, self.uow)
        self.users = Users(self.fleet, self.uow)
        self.dotfiles = DotfileCommands(self.fleet, self.uow)
        self.metrics_server: MetricsServer | None = None
        self._wire(self.bus)
        self.server = CommandServer(
            nc,
            self.bus,
            owner_of=self._owner_of,
            user_enabled=self._user_enabled,
            user_admin=self._user_admin,
            streams=self.streams,
            leader_only=LEADER_ONLY,
        )
        self.history = History(nc, self.store, self._owner_of, self._user_enabled, self._user_admin)
        path = str(config.read_models or IN_MEMORY)
        self.read_models: ReadModels | ReadModelsProcess = (
            ReadModels(
                nc,
                self.store,
                path,
                bulk,
                last_heartbeat=self.liveness.last_heartbeat_at,
                threads=config.read_models_threads,
                sql_memory=config.admin_sql_memory,
            )
            if config.read_models_url is None
            else ReadModelsProcess(
                nc,
                config.read_models_url,
                path,
                bulk=bulk is not None,
                threads=config.read_models_threads,
                sql_memory=config.admin_sql_memory,
            )
        )

    def leads(self) -> bool:
        """Whether this manager leads the scheduler, the reactors and the loops now."""
        return self.leadership is None or self.leadership.leading

    def _fence(self) -> tuple[Write, ...]:
        """The leader's fence for a write only the leader makes (services.manager.leadership;
        NotLeading if this manager does not lead); none without a lease (one manager)."""
        return () if self.leadership is None else self.leadership.fence()

    def _if_leading(self, handler: Callable[[M], object]) -> Callable[[M], object]:
        """``handler``, called only while this manager leads (a follower folds and serves
        commands and queries; the leader acts on what happens)."""

        def handle(message: M) -> object:
            return handler(message) if self.leads() else None

        return handle

    async def _lead(self) -> None:
        """Take over: serve the leader's commands, run the scheduler and the loops, and pick up
        every unsettled session."""
        await self.server.lead()
        self.scheduler.start()
        for sid in self.fleet.unsettled_sessions():
            self.reactors.kick(sid)
        self.pulling.start()
        self.sync.start()
        self.prepull.start()
        self.quotas.start()

    async def _follow(self) -> None:
        """Stop acting: another manager leads (or may)."""
        await self.server.follow()
        await self.scheduler.stop()
        await self.reactors.stop()
        await self.quotas.stop()
        await self.prepull.stop()
        await self.sync.stop()
        await self.pulling.stop()

    def _read_seq(self) -> int | None:
        """The sequence every read model reflects (None before they run): their lag's base."""
        if isinstance(self.read_models, ReadModelsProcess):
            return self.read_models.seq
        runner = self.read_models.runner
        return None if runner is None else runner.seq

    def _agent_restarted(self, event: ev.AgentReregistered) -> None:
        self.rpc.agent_gone(event.originator_id, "the agent restarted during the call")

    def _agent_lost(self, event: ev.AgentLost) -> None:
        self.rpc.agent_gone(event.originator_id, f"the agent was lost ({event.status_info})")

    def _owner_of(self, session_id: str) -> str | None:
        """The owner of a session (None: no such session): per-user subjects' scope."""
        session = self.fleet.sessions.get(session_id)
        return None if session is None else session.owner

    def _user_enabled(self, name: str) -> bool:
        """Whether ``name`` is an enabled Hoist user: per-user subjects serve only those."""
        user = self.fleet.users.get(name)
        return user is not None and user.enabled

    def _user_admin(self, name: str) -> bool:
        """Whether ``name`` is an enabled admin user: they may act for any owner."""
        user = self.fleet.users.get(name)
        return user is not None and user.enabled and user.admin

    def _use(self, handler: Callable[[M], Awaitable[R]]) -> Callable[[M], Awaitable[R]]:
        """``handler``, each request it serves counted as a use of its session (idle timeout)."""

        async def handle(request: M) -> R:
            reply = await handler(request)
            self.quotas.used(request, reply)
            return reply

        return handle

    def _wire(self, bus: MessageBus) -> None:
        """What follows each event and which handler serves each command."""
        lead = self._if_leading
        r, s, sync, prepull, images = (
            self.reactors,
            self.scheduler,
            self.sync,
            self.prepull,
            self.images,
        )
        bus.wire(
            events=[
                On(ev.SessionEnqueued, lead(s.wake)),
                On(
                    ev.SessionScheduled,
                    lead(r.session_changed),
                    lead(sync.scheduled),
                    lead(self.hook_calls.scheduled),
                ),
                On(ev.KernelEvent, lead(r.session_changed), lead(self.hook_calls.kernel_changed)),
                # a reloaded session may be pending
                On(LookAgain, lead(r.look_again), lead(s.wake)),
                On(RoomFreed, lead(s.wake)),
                On(ev.KernelCreated, self.metrics.kernel_created),  # on every manager
                On(
                    ev.AgentRegistered,
                    lead(s.wake),
                    lead(sync.agent_registered),
                    lead(prepull.agent_registered),
                ),
                On(
                    ev.AgentReregistered,
                    self._agent_restarted,  # before the reactors look at its sessions again
                    lead(s.wake),
                    lead(r.agent_changed),
                    lead(sync.agent_registered),
                    lead(prepull.agent_registered),
                ),
                On(ev.AgentLost, self._agent_lost, lead(r.agent_changed), lead(prepull.wake)),
                On(ev.ImagePulled, lead(s.wake), lead(r.pull_ended), images.pull_ended),
                On(ev.ImagePullFailed, lead(r.pull_ended), images.pull_ended),
                On(ev.KernelExited, lead(r.kernel_exited)),
                On(ev.PrepullPolicySet, lead(prepull.wake)),
                On(ev.PrepullPolicyRemoved, lead(prepull.wake)),
                On(ev.ResourcePolicySet, lead(s.wake)),  # a raised quota may let sessions start
                On(ev.ResourcePolicyRemoved, lead(s.wake)),
            ],
            commands=[
                Serve(CreateSession, self.sessions.create),
                Serve(GetSession, self._use(self.sessions.get)),
                Serve(DestroySession, self.sessions.destroy),
                Serve(CancelKernel, self.sessions.cancel_kernel),
                Serve(SessionLogs, self._use(self.kernel_io.logs)),
                Serve(SessionExec, self._use(self.kernel_io.exec)),
                Serve(ReadStream, self._use(self.kernel_io.read)),
                Serve(ListVolumes, self.kernel_io.list_volumes),
                Serve(RemoveVolume, self.kernel_io.remove_volume),
                Serve(SyncAgents, sync.handle),
                Serve(PreloadRequest, images.preload),
                Serve(UnloadRequest, images.unload),
                Serve(JobRequest, images.job),
                Serve(ListJobs, images.list_jobs),
                Serve(SetPolicy, prepull.set_policy),
                Serve(RemovePolicy, prepull.remove_policy),
                Serve(ListPolicies, prepull.list_policies),
                Serve(ShowPlans, prepull.show_plan),
                Serve(SetQuota, self.quotas.set),
                Serve(RemoveQuota, self.quotas.remove),
                Serve(ShowQuotas, self.quotas.show),
                Serve(MyQuota, self.quotas.mine),
                Serve(SetGroup, self.groups.set),
                Serve(RemoveGroup, self.groups.remove),
                Serve(ListGroups, self.groups.list),
                Serve(AddUser, self.users.add),
                Serve(DisableUser, self.users.disable),
                Serve(ListUsers, self.users.list),
                Serve(SetDotfile, self.dotfiles.set),
                Serve(RemoveDotfile, self.dotfiles.remove),
                Serve(ListDotfiles, self.dotfiles.list),
                Serve(ShowStats, self.stats.show),
            ],
        )

    async def start(self) -> None:
        await self.store.ensure_stream()
        await progress.ensure(self.nc.jetstream())
        # The whole log folded before anything acts on it.
        await self.stats.startup_fold.timed(self.fleet.start)()
        self.stats.folded_events = self.fleet.last_seq
        if self.config.short_gc_pauses:
            keep_pauses_short()  # what the fold built lives as long as the process
        await self.liveness.start(a for a, s in self.fleet.agents.items() if s.live)
        await self.images.start()
        await self.server.start()
        await self.history.start()
        await self.read_models.start()
        if self.leadership is None:
            await self._lead()
        else:
            await self.leadership.start()  # leads now if the lease is free (or its own)
        if self.config.metrics_port is not None:
            self.metrics_server = MetricsServer(
                self.metrics.registry, self.config.metrics_host, self.config.metrics_port
            )
            port = await self.metrics_server.start()
            log.info("metrics at http://%s:%d/metrics", self.config.metrics_host, port)
        log.info(
            "manager ready: %d sessions, %d agents, log at %d",
            len(self.fleet.sessions),
            len(self.fleet.agents),
            self.fleet.last_seq,
        )

    async def stop(self) -> None:
        if self.leadership is not None:
            await self.leadership.stop()  # a lease held is released: a standby takes over
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        await self.server.stop()
        await self.history.stop()
        await self.quotas.stop()
        await self.prepull.stop()
        await self.sync.stop()
        await self.images.stop()
        await self.read_models.stop()
        await self.pulling.stop()
        await self.scheduler.stop()
        await self.reactors.stop()
        await self.hook_calls.stop()
        await self.liveness.stop()
        await self.fleet.stop()


def parser() -> argparse.ArgumentParser:
    d = ManagerConfig()  # every default, said once
    p = argparse.ArgumentParser(
        prog="hoist manager", description="Run the Hoist manager (the control plane)."
    )
    p.add_argument(
        "--nats-url",
        required=True,
        help="nats://[user:password@]host:port, or a cluster's servers comma-separated",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        help="a stack's data dir: log in as its manager user when the URL has no credentials",
    )
    s = p.add_argument_group("scheduling")
    s.add_argument("--strategy", choices=("concentrated", "dispersed"), default=d.policy.strategy)
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
    s.add_argument(
        "--order",
        choices=("fifo", "drf"),
        default=d.policy.order,
        help="which pending session goes first: fifo (enqueue order) or drf (the owner with"
        " the smallest dominant share of the fleet, then enqueue order)",
    )
    s.add_argument("--max-sessions-per-owner", type=int)
    s.add_argument("--max-cpu-per-session", type=float, help="cores")
    s.add_argument("--max-mem-per-session", type=int, help="bytes")
    s.add_argument("--max-cluster-size", type=int)
    pulls = p.add_argument_group("pulls")
    pulls.add_argument("--pull-timeout", type=float, default=d.pull_timeout_s, help="seconds")
    pulls.add_argument(
        "--stall-timeout",
        type=float,
        default=d.stall_timeout_s,
        help="seconds without pull progress",
    )
    pulls.add_argument(
        "--pull-check-interval",
        type=float,
        default=d.pull_check_interval_s,
        help="seconds between checks",
    )
    p.add_argument(
        "--heartbeat-deadline", type=_positive, default=d.liveness_deadline_s, help="seconds"
    )
    p.add_argument(
        "--heartbeats-per-second",
        type=_positive,
        default=d.heartbeats_per_s,
        help="the fleet's heartbeats a second, at most (default %(default)s): past twice this many"
        " agents (2 s each), the leader asks every agent to beat less often, in whole seconds up"
        " to 60, and waits longer before it judges one lost (4 such beats and 5 s)",
    )
    sync = p.add_argument_group("agent resource sync")
    sync.add_argument(
        "--agent-resource-sync-trigger",
        action="append",
        choices=TRIGGERS,
        help=f"when to sync agents' kernels (repeatable; default {sorted(DEFAULT_TRIGGERS)})",
    )
    sync.add_argument(
        "--reconcile-interval",
        type=float,
        default=d.reconcile_interval_s,
        help="seconds between heartbeat checks",
    )
    sync.add_argument(
        "--lost-grace",
        type=float,
        default=d.lost_grace_s,
        help="seconds after AgentLost before its RUNNING kernels are TERMINATED agent-lost",
    )
    p.add_argument("--prepull-interval", type=float, default=d.prepull_interval_s, help="seconds")
    p.add_argument(
        "--no-prepull-registry",
        action="store_true",
        help="never ask registries for the prepull policies' images (sizes then come only from"
        " agents that held them, and a tag pushed again is not pulled again)",
    )
    p.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="a registry the manager asks over plain HTTP (loopback ones always are); repeatable",
    )
    p.add_argument(
        "--read-models",
        type=Path,
        help="the read models' DuckDB file (default: DATA_DIR/readmodels.duckdb with --data-dir,"
        " else in memory)",
    )
    p.add_argument(
        "--read-models-threads",
        type=_threads,
        default=d.read_models_threads,
        help="DuckDB threads for the read models and admin SQL (default 1: their writes are"
        " small, and more threads take every core at each commit from the manager and"
        " nats-server; more make large admin SQL queries quicker)",
    )
    p.add_argument(
        "--admin-sql-memory",
        type=_memory,
        default=d.admin_sql_memory,
        metavar="SIZE",
        help=f"the memory one admin SQL query may use, e.g. 512MB or 2GB (default"
        f" {d.admin_sql_memory >> 20}MB): it runs in a process of its own under this cap, so a"
        " heavy query fails with a clear error while the read models and the manager go on",
    )
    p.add_argument(
        "--read-models-in-process",
        action="store_true",
        help="run the read models in the manager's own process, not in a child of it (one"
        " process fewer; under load, creates wait longer)",
    )
    p.add_argument(
        "--no-bulk-read",
        action="store_true",
        help="catch up the read models in this process only, without a reader child process"
        " (it helps only with a second core)",
    )
    lead = p.add_argument_group("several managers (services.manager.leadership)")
    lead.add_argument(
        "--manager-id",
        default=d.manager_id,
        help="this manager's name in the lease: distinct per manager, the same after a restart"
        " (default: the host name)",
    )
    lead.add_argument(
        "--lease-ttl",
        type=float,
        default=d.lease_ttl_s,
        help="seconds a leader's lease lives unrenewed (at least 1): a standby takes over this"
        " long after the leader died; 0: no lease, this manager always leads (one manager only)",
    )
    lead.add_argument("--no-fence", action="store_true", help=argparse.SUPPRESS)  # tests only
    lead.add_argument("--step-down-after", type=float, help=argparse.SUPPRESS)  # tests only
    p.add_argument(
        "--metrics-port", type=int, help="serve Prometheus /metrics on this port (0: any free one)"
    )
    p.add_argument(
        "--hook",
        action="append",
        metavar="MODULE:ATTR",
        help="a lifecycle hook besides the installed ones (entry points hoist.hooks); repeat",
    )
    p.add_argument(
        "--hook-timeout",
        type=_positive,
        default=d.hook_timeout_s,
        help="seconds a hook's call may take before the manager goes on without it",
    )
    p.add_argument(
        "--metrics-host", default=d.metrics_host, help="the address /metrics binds (default local)"
    )
    p.add_argument("--log-level", default="INFO")
    return p


_Number = TypeVar("_Number", int, float)


def _parsed(text: str, kind: type[_Number], noun: str) -> _Number:
    """`text` as `kind`, or the argparse error naming what was given."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a {noun}: {text!r}") from None


def _positive(text: str) -> float:
    """A finite number > 0 (refused before anything connects, with what was given)."""
    value = _parsed(text, float, "number")
    if not 0 < value < math.inf:  # also NaN
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _threads(text: str) -> int:
    """A whole number from 1 to this host's cores (more only cost memory and switches)."""
    value = _parsed(text, int, "whole number")
    cores = os.cpu_count() or 1
    if not 1 <= value <= cores:
        raise argparse.ArgumentTypeError(
            f"must be from 1 to {cores} (this host's cores), got {text}"
        )
    return value


_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?", re.IGNORECASE)
_MIN_MEMORY = 64 << 20  # below it the query's process hardly holds its tables


def _memory(text: str) -> int:
    """A size: bytes, or with KB/MB/GB/TB (or KiB/MiB/GiB/TiB; both powers of 1024)."""
    m = _MEMORY.fullmatch(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"must be a size like 512MB or 2GB, got {text!r}")
    unit = (m[2] or "b")[0].lower()
    value = int(float(m[1]) * (1 << (10 * "bkmgt".index(unit))))
    if value < _MIN_MEMORY:
        raise argparse.ArgumentTypeError(f"must be at least {_MIN_MEMORY >> 20}MB, got {text}")
    return value


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
            order=args.order,
        ),
        pull_timeout_s=args.pull_timeout,
        stall_timeout_s=args.stall_timeout,
        pull_check_interval_s=args.pull_check_interval,
        liveness_deadline_s=args.heartbeat_deadline,
        heartbeats_per_s=args.heartbeats_per_second,
        sync_triggers=frozenset(args.agent_resource_sync_trigger or DEFAULT_TRIGGERS),
        reconcile_interval_s=args.reconcile_interval,
        lost_grace_s=args.lost_grace,
        prepull_interval_s=args.prepull_interval,
        prepull_registry=not args.no_prepull_registry,
        insecure_registries=tuple(args.insecure_registry),
        read_models=args.read_models
        or (args.data_dir / "readmodels.duckdb" if args.data_dir else None),
        read_models_url=None if args.read_models_in_process else _url(args),
        read_models_threads=args.read_models_threads,
        admin_sql_memory=args.admin_sql_memory,
        bulk_read_url=None if args.no_bulk_read else _url(args),
        short_gc_pauses=True,
        manager_id=args.manager_id,
        lease_ttl_s=args.lease_ttl or None,
        drills=Drills(fencing=not args.no_fence, step_down_after_s=args.step_down_after),
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        hooks=tuple(args.hook or ()),
        hook_timeout_s=args.hook_timeout,
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
    hint = "check --nats-url and that nats-server runs"
    return run_process("hoist manager", args.log_level, run(args), hint)


if __name__ == "__main__":
    sys.exit(main())
