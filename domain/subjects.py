"""Every NATS subject and stream name Hoist uses: the one place agent, manager and clients agree on.

Events live in one JetStream stream, one subject per aggregate:
``hoist.events.<kind>.<id>`` (``kind`` is ``session``, ``agent``, ``liveness``,
``prepull-policy``, ``resource-policy``, ``resource-group``, ``user``, ``dotfiles``,
``reservation`` or ``lease``; domain.admission says which events each may hold).  An agent
publishes only under its own id (``hoist.events.agent.<id>``, ``hoist.progress.<id>.>``);
nats.conf enforces it.
"""

from __future__ import annotations

import re

from domain.errors import InvalidField

EVENT_STREAM = "HOIST"
EVENTS = "hoist.events"
EVENTS_ALL = f"{EVENTS}.>"

# Pull progress: a stream that keeps only the latest message per subject, so a late watcher
# still sees where every pull stands.
PROGRESS_STREAM = "HOIST_PROGRESS"
PROGRESS = "hoist.progress"

API = "hoist.api"  # commands from clients: hoist.api.session.create, ...
QUERY = "hoist.query"  # read-model queries: hoist.query.kernels, ...
ADMIN = "hoist.admin"  # superadmin commands and queries
AGENT_RPC = "hoist.agent"  # hoist.agent.<id>.<verb>: request/reply served by one agent
HEARTBEAT = "hoist.heartbeat"  # hoist.heartbeat.<id>: core NATS, not stored

# Replies: a request's reply subject must be an inbox (nats clients' default prefix).  A
# service serves nothing else: a reply subject is the requester's to choose and could name any
# subject the service may publish on (an event subject, say), and a message with no reply at
# all may be the server's answer to someone's JetStream request, reflected onto a command
# subject (a direct get's reply subject is not checked against the requester's permissions).
INBOX = "_INBOX"


_INBOX_SUBJECT = re.compile(rf"^{INBOX}(\.[^.*>\s]+)+\Z")  # no wildcard, no empty token


def is_inbox(reply: str) -> bool:
    return _INBOX_SUBJECT.match(reply) is not None


# A request that came through an account's service import (services/stack/natsauth.py) has its
# reply rewritten by nats-server to one of the serving account's ``_R_.`` subjects, which leads
# back to the requester's own reply subject in the requester's account.
IMPORT_REPLY = "_R_"
_IMPORT_REPLY_SUBJECT = re.compile(rf"^{IMPORT_REPLY}(\.[^.*>\s]+)+\Z")
# The header nats-server sets (over any the requester sent) on a request through an import:
# JSON naming the requester's account and user.
REQUEST_INFO = "Nats-Request-Info"


def is_import_reply(reply: str) -> bool:
    """``reply`` is nats-server's stand-in for the reply of a request from another account."""
    return _IMPORT_REPLY_SUBJECT.match(reply) is not None


def inbox_prefix(user: str) -> str:
    """Where a NATS user's replies come: the only inboxes it may subscribe to."""
    return f"{INBOX}.{check_token(user, 'NATS user')}"


def is_inbox_of(reply: str, user: str) -> bool:
    """``reply`` is an inbox of ``user``: a request on a user's own subject is answered only
    there, so no user can aim the manager's answer at another user's inbox."""
    return is_inbox(reply) and reply.startswith(f"{inbox_prefix(user)}.")


_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")


def check_token(value: str, field: str) -> str:
    """A value used as one subject token: letters, digits, '_' and '-' only (else
    InvalidField naming ``field``)."""
    if not _TOKEN.match(value):
        raise InvalidField(
            field,
            f"must be 1-128 letters, digits, '_' or '-' (it becomes a NATS subject token),"
            f" got {value!r}",
        )
    return value


def aggregate_subject(kind: str, aggregate_id: str) -> str:
    return f"{EVENTS}.{check_token(kind, 'kind')}.{check_token(aggregate_id, 'aggregate id')}"


def agent_events(agent_id: str) -> str:
    return aggregate_subject("agent", agent_id)


# Facts about an agent that only the manager records (AgentLost), on a subject of their own:
# the agent's NATS user may publish only ``hoist.events.agent.<id>``, so nothing an agent writes
# can say an agent (itself or another) was lost.  Manager-only facts per agent (e.g. issue 17's
# reservations) get subjects of this shape too: ``hoist.events.<manager kind>.<agent id>``.
LIVENESS = "liveness"
# Prepull policies (domain.prepull): hoist.events.prepull-policy.<name>.
PREPULL_POLICY = "prepull-policy"
# Per-owner resource policies (domain.quota): hoist.events.resource-policy.<owner or "default">.
RESOURCE_POLICY = "resource-policy"
# Resource groups' access (domain.resource_group): hoist.events.resource-group.<group name>.
RESOURCE_GROUP = "resource-group"
# Hoist users (domain.user): hoist.events.user.<name>; each has a NATS user of that name.
USER = "user"
# A user's dotfiles (domain.dotfiles): hoist.events.dotfiles.<owner>, written into the home of
# each of their kernels at its start.
DOTFILES = "dotfiles"
# What the managers reserved on an agent (domain.reservation): hoist.events.reservation.<agent
# id>.  Only managers write it, each SessionScheduled in one atomic batch with its agents'
# reservations expecting their last sequences, so two managers never book the same room.
RESERVATION = "reservation"
# The managers' leadership (services.manager.leadership): hoist.events.lease.manager holds the
# lease (a message with a per-message TTL), hoist.events.lease.manager-fence the fence messages
# that ride in a leader's batches; both expire, neither is an aggregate's history.
LEASE = "lease"
MANAGER_LEASE_ID = "manager"
MANAGER_FENCE_ID = "manager-fence"
MANAGER_TERM_ID = "manager-term"


def liveness_events(agent_id: str) -> str:
    return aggregate_subject(LIVENESS, agent_id)


def reservation_events(agent_id: str) -> str:
    return aggregate_subject(RESERVATION, agent_id)


def manager_lease() -> str:
    return aggregate_subject(LEASE, MANAGER_LEASE_ID)


def manager_fence() -> str:
    return aggregate_subject(LEASE, MANAGER_FENCE_ID)


def manager_term() -> str:
    return aggregate_subject(LEASE, MANAGER_TERM_ID)


# The kinds of aggregate subject only the manager writes; an agent writes only its own
# ``hoist.events.agent.<id>``.  services.natsauth grants exactly this at the server, so the
# manager cannot write an agent's facts and an agent cannot write anything else.
MANAGER_KINDS = (
    "session",
    LIVENESS,
    PREPULL_POLICY,
    RESOURCE_POLICY,
    RESOURCE_GROUP,
    USER,
    DOTFILES,
    RESERVATION,
    LEASE,
)


def session_events(session_id: str) -> str:
    return aggregate_subject("session", session_id)


def agent_rpc(agent_id: str, verb: str) -> str:
    return f"{AGENT_RPC}.{check_token(agent_id, 'agent id')}.{verb}"


def agent_progress(agent_id: str, pull_token: str) -> str:
    return f"{PROGRESS}.{check_token(agent_id, 'agent id')}.{check_token(pull_token, 'pull id')}"


def heartbeat(agent_id: str) -> str:
    return f"{HEARTBEAT}.{check_token(agent_id, 'agent id')}"


# -- the manager's commands and queries (payloads: domain.contracts) ------------------------------

# Sessions (domain.contracts.sessions)
SESSION_CREATE = f"{API}.session.create"
SESSION_GET = f"{API}.session.get"
SESSION_DESTROY = f"{API}.session.destroy"
KERNEL_CANCEL = f"{ADMIN}.kernel.cancel"
SESSION_LOGS = f"{API}.session.logs"
SESSION_EXEC = f"{API}.session.exec"
STREAM_READ = f"{API}.stream.read"
VOLUME_LIST = f"{API}.volume.list"
VOLUME_REMOVE = f"{API}.volume.remove"

# Prepull policies (domain.contracts.policies)
POLICY_SET = f"{ADMIN}.image.policy.set"
POLICY_REMOVE = f"{ADMIN}.image.policy.remove"
POLICY_LIST = f"{ADMIN}.image.policy.list"
POLICY_PLAN = f"{ADMIN}.image.policy.plan"

# Resource policies and quotas (domain.contracts.quotas)
QUOTA_SET = f"{ADMIN}.quota.set"
QUOTA_REMOVE = f"{ADMIN}.quota.remove"
QUOTA_SHOW = f"{ADMIN}.quota.show"
QUOTA_MINE = f"{API}.quota.mine"  # one's own quota: any user

# Resource groups and who may use each (domain.contracts.groups)
GROUP_SET = f"{ADMIN}.group.set"
GROUP_REMOVE = f"{ADMIN}.group.remove"
GROUP_LIST = f"{ADMIN}.group.list"

# Hoist users (domain.contracts.users)
USER_ADD = f"{ADMIN}.user.add"
USER_DISABLE = f"{ADMIN}.user.disable"
USER_LIST = f"{ADMIN}.user.list"

# A user's dotfiles (domain.contracts.dotfiles): their own, or any owner's for the client role
DOTFILE_SET = f"{API}.dotfile.set"
DOTFILE_REMOVE = f"{API}.dotfile.remove"
DOTFILE_LIST = f"{API}.dotfile.list"

# Preload and unload jobs (domain.contracts.images)
PRELOAD = f"{ADMIN}.image.preload"
UNLOAD = f"{ADMIN}.image.unload"
JOB = f"{ADMIN}.image.job"
JOBS = f"{ADMIN}.image.jobs"

# Agent resource sync (domain.contracts.agents)
AGENT_SYNC = f"{ADMIN}.agent.sync"

# The manager's own counters and timers (domain.contracts.commands.ShowStats)
MANAGER_STATS = f"{ADMIN}.manager.stats"

# Read-model queries (domain.contracts.queries): ``hoist.query.<name>`` for each name here,
# plus the admin's SQL and verify.
QUERY_NAMES = (
    "kernels",
    "sessions",
    "occupancy",
    "agents",
    "images",
    "pulls",
    "policies",
    "quarantine",
)
SQL_SUBJECT = f"{ADMIN}.query.sql"
VERIFY_SUBJECT = f"{ADMIN}.verify"


# hoist.query.<user>.history: a session's events, for its owner (domain.contracts.history);
# served only on a user's own subject (roles read the log itself)
HISTORY = "history"


def query_subject(name: str) -> str:
    """The subject of one read-model query (a name in QUERY_NAMES)."""
    return f"{QUERY}.{name}"
