"""Aggregates driven through every command, for the domain tests."""

from __future__ import annotations

from collections.abc import Callable

from domain import events as ev
from domain.agent import Agent
from domain.codec import SCHEMA_HEADER, TYPE_HEADER, VERSION_HEADER
from domain.dotfiles import Dotfiles
from domain.liveness import AgentLiveness
from domain.prepull import PrepullPolicy
from domain.quota import Quota, ResourcePolicy
from domain.reservation import AgentReservations
from domain.resource_group import ResourceGroup
from domain.session import Session
from domain.status import KernelStatus
from domain.user import User

S = KernelStatus


def new_session(cluster_size: int = 1) -> Session:
    return Session.enqueue(
        owner="alice",
        image="127.0.0.1:5000/busybox:1",
        resources={"cpu": 1.5, "mem": 256 * 2**20},
        resource_group="default",
        cluster_size=cluster_size,
        request_id="req-1",
    )


def only_kernel(session: Session) -> str:
    (kernel_id,) = session.kernels
    return kernel_id


# One command per target status (kernel id given); PENDING means "scheduling failed again".
COMMANDS: dict[KernelStatus, Callable[[Session, str], None]] = {
    S.PENDING: lambda s, k: s.scheduling_failed("no-available-instances"),
    S.SCHEDULED: lambda s, k: s.schedule({k: "agent-1"}),
    S.PREPARING: lambda s, k: s.mark_preparing(k),
    S.PULLING: lambda s, k: s.mark_pulling(k, "pull-1"),
    S.PREPARED: lambda s, k: s.mark_prepared(k),
    S.CREATING: lambda s, k: s.mark_creating(k),
    S.RUNNING: lambda s, k: s.mark_created(k, "container-1"),
    S.TERMINATING: lambda s, k: s.mark_terminating(k, "user-requested"),
    S.TERMINATED: lambda s, k: s.mark_terminated(k, "exited", detail="exit code 0"),
    S.ERROR: lambda s, k: s.creation_failed(k, "OCI runtime error: no such file"),
    S.CANCELLED: lambda s, k: s.cancel(k, "user-requested"),
}

# A legal route from PENDING to each status.
ROUTES: dict[KernelStatus, list[KernelStatus]] = {
    S.PENDING: [],
    S.SCHEDULED: [S.SCHEDULED],
    S.PREPARING: [S.SCHEDULED, S.PREPARING],
    S.PULLING: [S.SCHEDULED, S.PREPARING, S.PULLING],
    S.PREPARED: [S.SCHEDULED, S.PREPARED],
    S.CREATING: [S.SCHEDULED, S.PREPARED, S.CREATING],
    S.RUNNING: [S.SCHEDULED, S.PREPARED, S.CREATING, S.RUNNING],
    S.TERMINATING: [S.SCHEDULED, S.PREPARED, S.CREATING, S.RUNNING, S.TERMINATING],
    S.TERMINATED: [S.SCHEDULED, S.PREPARED, S.CREATING, S.RUNNING, S.TERMINATED],
    S.ERROR: [S.SCHEDULED, S.PREPARED, S.CREATING, S.ERROR],
    S.CANCELLED: [S.CANCELLED],
}


def session_at(status: KernelStatus) -> tuple[Session, str]:
    """A one-kernel session whose kernel is in ``status``."""
    session = new_session()
    kernel_id = only_kernel(session)
    for step in ROUTES[status]:
        COMMANDS[step](session, kernel_id)
    assert session.kernels[kernel_id].status == status
    return session, kernel_id


def full_session_history() -> list[ev.Event]:
    """Events of a two-kernel session that passes through every session event type."""
    session = new_session(cluster_size=2)
    k1, k2 = session.kernels
    session.scheduling_failed("no-available-instances")
    session.scheduling_failed("predicate-checks-failed: concurrency")
    session.hook_skipped("audit", "enqueue", "timed out after 2s")
    session.schedule({k1: "agent-1", k2: "agent-2"})
    session.mark_preparing(k1)
    session.mark_pulling(k1, "pull-1")
    session.mark_prepared(k1)
    session.mark_prepared(k2)
    session.mark_creating(k1)
    session.mark_creating(k2)
    session.mark_created(k1, "c1")
    session.creation_failed(k2, "no space left on device")
    session.mark_terminating(k1, "user-requested")
    session.mark_terminated(k1, "terminated")
    other = new_session()
    session_events = list(session.collect_events())
    other.cancel(only_kernel(other), "image-pull-failed", detail="manifest unknown")
    return session_events + list(other.collect_events())


def new_agent() -> Agent:
    return Agent.register(
        agent_id="agent-1",
        resource_group="default",
        capacity={"cpu": 8, "mem": 16 * 2**30, "disk": 100 * 2**30},
        runtime="docker",
        images={"127.0.0.1:5000/base:1": {"digest": "sha256:aa", "size_bytes": 1000}},
    )


def full_agent_history() -> list[ev.Event]:
    agent = new_agent()
    agent.pull_started("127.0.0.1:5000/busybox:1", "pull-1")
    agent.pulled("127.0.0.1:5000/busybox:1", "pull-1", "sha256:bb", 2_000_000, 3.25)
    agent.mark_preloaded("127.0.0.1:5000/busybox:1", "preload: job j1", True)
    agent.pull_started("127.0.0.1:5000/big:1", "pull-2")
    agent.pull_failed("127.0.0.1:5000/big:1", "pull-2", "manifest unknown")
    agent.image_removed("127.0.0.1:5000/base:1", "gc-disk-pressure")
    agent.kernel_exited("k-1", "s-1", 137, 2.5, oom_killed=False)
    agent.reregister(
        resource_group="default",
        capacity={"cpu": 8, "mem": 16 * 2**30, "disk": 100 * 2**30},
        runtime="docker",
        images={"127.0.0.1:5000/busybox:1": {"digest": "sha256:bb", "size_bytes": 2_000_000}},
    )
    return list(agent.collect_events())


def full_liveness_history() -> list[ev.Event]:
    liveness = AgentLiveness.mark_lost(None, "agent-1", "heartbeat-timeout: no heartbeat for 15s")
    AgentLiveness.mark_lost(liveness, "agent-1", "heartbeat-timeout: no heartbeat for 15s")
    return list(liveness.collect_events())


def full_policy_history() -> list[ev.Event]:
    policy = PrepullPolicy.set(
        None, name="p", resource_groups=[], rules=[{"kind": "images", "images": ["a:1"]}]
    )
    policy.remove()
    return list(policy.collect_events())


def full_resource_policy_history() -> list[ev.Event]:
    quota = Quota(
        max_cpu=4, max_mem=8 * 2**30, max_slots={"gpu": 1}, max_lifetime_s=3600, idle_timeout_s=600
    )
    policy = ResourcePolicy.set(None, name="alice", quota=quota)
    policy.remove()
    return list(policy.collect_events())


def full_resource_group_history() -> list[ev.Event]:
    group = ResourceGroup.set(None, name="gpu", users=["alice"], description="the A100s")
    group.remove()
    return list(group.collect_events())


def full_user_history() -> list[ev.Event]:
    user = User.add(None, name="alice", by="admin")
    user.disable(by="admin")
    User.add(user, name="alice", admin=True, by="admin")
    return list(user.collect_events())


def full_dotfiles_history() -> list[ev.Event]:
    dotfiles = Dotfiles.set(
        None, owner="alice", path=".bashrc", content=b"alias ll='ls -l'\n", by="alice"
    )
    Dotfiles.set(
        dotfiles, owner="alice", path=".config/git/config", content=b"", mode=0o600, by="client"
    )
    dotfiles.remove(".bashrc", by="alice")
    return list(dotfiles.collect_events())


# ImagePulled as schema 1 wrote it (duration in integer milliseconds), event 3 of agent-1.
V1_PULLED = (
    b'{"type":"ImagePulled","originator_id":"agent-1","originator_version":3,'
    b'"timestamp":"2025-06-01T12:00:00Z","image":"127.0.0.1:5000/busybox:1",'
    b'"task_id":"pull-1","digest":"sha256:bb","size_bytes":2000000,"duration_ms":3250}',
    {TYPE_HEADER: "ImagePulled", SCHEMA_HEADER: "1", VERSION_HEADER: "3"},
)


def full_reservation_history() -> list[ev.Event]:
    capacity = ev.Capacity(cpu=8.0, mem=16 * 2**30, disk=10 * 2**30)
    res = ev.Resources(cpu=1.0, mem=2**30)
    reservations = AgentReservations.reserve(None, "agent-1", capacity, "s1", ["k1", "k2"], res)
    reservations.release("s1", ["k1"], "kernel-ended: k1 TERMINATED")
    return list(reservations.collect_events())


def lease_messages() -> list[ev.Event]:
    """The managers' lease and fence messages (standalone: no aggregate folds them)."""
    at = ev.ManagerLeaseTaken.create_timestamp()
    return [
        ev.ManagerLeaseTaken(
            originator_id="manager", originator_version=1, timestamp=at, holder="m1", ttl_s=3.0
        ),
        ev.ManagerLeaseReleased(
            originator_id="manager", originator_version=1, timestamp=at, holder="m1"
        ),
        ev.ManagerTermBegan(
            originator_id="manager-term", originator_version=1, timestamp=at, holder="m1"
        ),
        ev.ManagerFence(
            originator_id="manager-fence",
            originator_version=1,
            timestamp=at,
            holder="m1",
            term_seq=7,
        ),
    ]
