"""What the scheduler reads and answers: the agents and pending sessions as it sees them, the
limits and the policy it applies, and its decisions (domain.scheduling says how it decides)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import msgspec

from domain.errors import InvalidField
from domain.events import Capacity, ClusterMode, Resources
from domain.reasons import Reason

# Kubernetes ImageLocality's thresholds: below MIN the image is cheap to pull (no bonus);
# at MAX and above (size x spread) the bonus is full.
LOCALITY_MIN_BYTES = 23 * 2**20
LOCALITY_MAX_BYTES = 1000 * 2**20

NO_INSTANCES = Reason.NO_AVAILABLE_INSTANCES


class AgentView(msgspec.Struct, frozen=True, kw_only=True):
    """The scheduler's view of one agent at this moment."""

    agent_id: str
    resource_group: str  # only sessions of this group may land here
    capacity: Capacity  # what the agent offers in total (disk is not scheduled on)
    reserved_cpu: float  # cores held by its kernels in AGENT_RESOURCE_OCCUPYING statuses
    reserved_mem: int  # bytes held by those kernels
    images: dict[str, int]  # image -> size in bytes, images the agent holds now
    live: bool  # heartbeating and not lost; a dead agent gets nothing
    # slot -> amount held by its kernels in AGENT_RESOURCE_OCCUPYING statuses (its capacity
    # offers capacity.slots)
    reserved_slots: dict[str, float] = {}


class PendingSession(msgspec.Struct, frozen=True, kw_only=True):
    """A session whose kernels are all PENDING."""

    session_id: str
    owner: str  # the per-owner session limit counts by this
    image: str
    resources: Resources  # per kernel
    cluster_size: int  # number of kernels, each asking for ``resources``
    resource_group: str  # agents of this group only
    kernel_ids: list[str]  # cluster_size distinct ids; the keys of Scheduled.placements
    enqueued_at: datetime  # FIFO order (ties: session_id)
    # "single-node": every kernel on one agent; "multi-node": wherever each kernel has room
    cluster_mode: ClusterMode = "multi-node"

    def __post_init__(self) -> None:
        if self.cluster_mode not in ("single-node", "multi-node"):
            raise InvalidField(
                "cluster_mode",
                f"must be 'single-node' or 'multi-node', got {self.cluster_mode!r}",
            )
        if self.cluster_size < 1:
            raise InvalidField("cluster_size", f"must be at least 1, got {self.cluster_size}")
        if len(self.kernel_ids) != self.cluster_size or len(set(self.kernel_ids)) != len(
            self.kernel_ids
        ):
            raise InvalidField(
                "kernel_ids",
                f"session {self.session_id} needs {self.cluster_size} distinct kernel ids"
                f" (cluster_size), got {self.kernel_ids!r}",
            )


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Predicates; None means unlimited (no per-session limit on slots yet)."""

    max_sessions_per_owner: int | None = None  # concurrent non-terminal sessions (SCHEDULED on)
    max_cpu_per_session: float | None = None  # cores, all kernels of the session together
    max_mem_per_session: int | None = None  # bytes, all kernels of the session together
    max_cluster_size: int | None = None  # kernels in one session


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    """How agents are chosen among those with room."""

    # "concentrated": fullest agent that fits (fewest agents used); "dispersed": emptiest.
    strategy: Literal["concentrated", "dispersed"] = "dispersed"
    image_locality: bool = True  # prefer agents that already hold the image
    # True: the first session of a resource group that does not fit blocks the later ones
    # (Backend.AI FIFO, no starvation of big sessions); False: skip it and continue.
    fifo_strict: bool = False
    # The largest locality bonus, in utilization units (0..1): a holder of a big, widespread
    # image wins over a non-holder unless it is this much busier (0.25 = 25 points).
    locality_weight: float = 0.25
    # The order sessions are decided in: "fifo" (enqueue order) or "drf" (the owner with the
    # smallest dominant share first, ties and each owner's own sessions by enqueue order).
    order: Literal["fifo", "drf"] = "fifo"

    def __post_init__(self) -> None:
        if self.strategy not in ("concentrated", "dispersed"):
            raise InvalidField(
                "strategy", f"must be 'concentrated' or 'dispersed', got {self.strategy!r}"
            )
        if self.order not in ("fifo", "drf"):
            raise InvalidField("order", f"must be 'fifo' or 'drf', got {self.order!r}")
        if not 0 <= self.locality_weight <= 1:
            raise InvalidField(
                "locality_weight", f"must be between 0 and 1, got {self.locality_weight}"
            )


class Scheduled(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    placements: dict[str, str]  # kernel id -> agent id, every kernel of the session


class Unschedulable(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    status_info: str  # "predicate-checks-failed: ..." or "no-available-instances: ..."


class PlanStats(msgspec.Struct, kw_only=True):
    """Work counters, filled by ``plan`` when given (for tests and benchmarks)."""

    agents_examined: int = 0  # agent entries looked at while choosing agents


def locality_bonus(size: int, holders: int, agents: int, weight: float) -> float:
    """The score bonus of an agent that holds an image (Kubernetes ImageLocality).

    bonus = weight * clamp((size * holders / agents - MIN) / (MAX - MIN), 0, 1)

    ``size``: bigger images weigh more — avoiding a 5 GB pull is worth a busier agent, a 5 MB
    pull is not (below 23 MiB the bonus is 0). ``holders / agents`` (the spread): an image on
    few agents earns a smaller bonus, so sessions do not pile onto the few agents that have it
    while the rest sit idle. The bonus is added to the strategy score (utilization in 0..1),
    so it decides among agents of similar load and loses once the holders are ``bonus`` busier
    (dispersed) or once they are full.
    """
    if size <= 0 or holders <= 0 or agents <= 0 or weight <= 0:
        return 0.0
    spread = size * holders / agents
    return weight * min(
        1.0, max(0.0, (spread - LOCALITY_MIN_BYTES) / (LOCALITY_MAX_BYTES - LOCALITY_MIN_BYTES))
    )


def single_block(session: PendingSession) -> bool:
    """Whether the session is placed as one block (a one-kernel session is the same either
    way, and keeps the one-kernel wording)."""
    return session.cluster_mode == "single-node" and session.cluster_size > 1


def check_unique(field: str, ids: list[str]) -> None:
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        raise InvalidField(field, f"ids must be unique; repeated: {dupes}")
