"""Every command the manager serves: its subject and the request struct it takes.

The manager's message bus (services.manager.bus) finds a command's handler by the request's
type, so each command has a type of its own, the ones that take nothing included.
"""

from __future__ import annotations

import msgspec

from domain.contracts.agents import SyncAgents
from domain.contracts.common import NoRequest
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
from domain.subjects import (
    AGENT_SYNC,
    DOTFILE_LIST,
    DOTFILE_REMOVE,
    DOTFILE_SET,
    GROUP_LIST,
    GROUP_REMOVE,
    GROUP_SET,
    JOB,
    JOBS,
    KERNEL_CANCEL,
    MANAGER_STATS,
    POLICY_LIST,
    POLICY_PLAN,
    POLICY_REMOVE,
    POLICY_SET,
    PRELOAD,
    QUOTA_MINE,
    QUOTA_REMOVE,
    QUOTA_SET,
    QUOTA_SHOW,
    SESSION_CREATE,
    SESSION_DESTROY,
    SESSION_EXEC,
    SESSION_GET,
    SESSION_LOGS,
    STREAM_READ,
    UNLOAD,
    USER_ADD,
    USER_DISABLE,
    USER_LIST,
    VOLUME_LIST,
    VOLUME_REMOVE,
)


class ListPolicies(NoRequest, frozen=True, kw_only=True):
    """``{}`` -> ``{"policies": [...]}``."""


class ShowPlans(NoRequest, frozen=True, kw_only=True):
    """``{}`` -> ``{"plans": {agent: plan}, "converged": bool}``."""


class ListJobs(NoRequest, frozen=True, kw_only=True):
    """``{}`` -> ``{"jobs": [...]}``."""


class ShowStats(NoRequest, frozen=True, kw_only=True):
    """``{}`` -> the manager's counters and timers since it started (services.manager.stats):
    ``{"live_sessions", "sessions", "agents", "live_agents", "log_seq", "uptime_s",
    "startup_fold": {"seconds", "events"}, "scheduling_passes", "heartbeats",
    "reconciliation_passes"}``, each of the last three ``{"count", "total_s", "mean_ms",
    "max_ms"}``."""


COMMANDS: dict[str, type[msgspec.Struct]] = {
    SESSION_CREATE: CreateSession,
    SESSION_GET: GetSession,
    SESSION_DESTROY: DestroySession,
    KERNEL_CANCEL: CancelKernel,
    SESSION_LOGS: SessionLogs,
    SESSION_EXEC: SessionExec,
    STREAM_READ: ReadStream,
    VOLUME_LIST: ListVolumes,
    VOLUME_REMOVE: RemoveVolume,
    AGENT_SYNC: SyncAgents,
    PRELOAD: PreloadRequest,
    UNLOAD: UnloadRequest,
    JOB: JobRequest,
    JOBS: ListJobs,
    POLICY_SET: SetPolicy,
    POLICY_REMOVE: RemovePolicy,
    POLICY_LIST: ListPolicies,
    POLICY_PLAN: ShowPlans,
    QUOTA_SET: SetQuota,
    QUOTA_REMOVE: RemoveQuota,
    QUOTA_SHOW: ShowQuotas,
    QUOTA_MINE: MyQuota,
    GROUP_SET: SetGroup,
    GROUP_REMOVE: RemoveGroup,
    GROUP_LIST: ListGroups,
    USER_ADD: AddUser,
    USER_DISABLE: DisableUser,
    USER_LIST: ListUsers,
    DOTFILE_SET: SetDotfile,
    DOTFILE_REMOVE: RemoveDotfile,
    DOTFILE_LIST: ListDotfiles,
    MANAGER_STATS: ShowStats,
}
