"""Every domain event of Hoist: one msgspec Struct each, a stable type name and a schema version.

The type name is the struct tag (the class name, frozen once released: never derived from
module paths).  ``schema_version`` grows when a released event's fields change; the change comes
with an ``upcast_vN_vM(state) -> state`` static method on the class that turns an old payload
dict into the next version's, so old history still loads (see domain.codec).

Events mix in eventsourcing's CanMutateAggregate / CanInitAggregate, so aggregates use the
library's ``_create`` and ``trigger_event``, and the library's ``mutate`` checks and advances
the aggregate's version.  This module knows no aggregate: an event's ``apply`` hands the event
to its aggregate, whose ``WHEN`` table (event class -> the aggregate's method, built once with
the aggregate class) holds the state change, as the library's own aggregates keep theirs.
Those methods trust what commands check before recording, except what a reader must not trust
from a stored record: the kernel and transition a session event names (a poison event fails
to apply and is quarantined, see domain.admission).

Bounds: every field uses the bounds of domain.limits, so an event any reader accepts fits the
read models (DuckDB BIGINT/DOUBLE, msgspec int64) and a reply.  Tightening them did not bump
any ``schema_version``: no event Hoist ever recorded exceeds them (commands never took values
near them), and an event that would is quarantined rather than upcast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec
from eventsourcing.domain import BaseAggregate, CanInitAggregate, CanMutateAggregate

from domain.limits import (
    MAX_AGENT_IMAGES,
    MAX_CLUSTER,
    MAX_ID,
    MAX_LIST,
    MAX_MOUNTS,
    MAX_PORTS,
    MAX_REASON,
    PRINTABLE,
    AbsPath,
    Argv,
    ClusterSize,
    Cpu,
    Detail,
    DotfileContent,
    DotfileMode,
    DotfilePath,
    Env,
    ExitCode,
    Id,
    Image,
    Labels,
    Mem,
    MountPath,
    Owner,
    Port,
    Reason,
    SessionName,
    Size,
    SlotName,
    Slots,
)
from domain.status import KernelStatus

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]  # unbounded: for other modules' requests
AwareTime = Annotated[datetime, msgspec.Meta(tz=True)]
Bytes = Size
Topic = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Digest = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID * 2)]
Runtime = Id
KernelIds = Annotated[list[Id], msgspec.Meta(min_length=1, max_length=MAX_CLUSTER)]


class Resources(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """What one kernel asks for.  ``slots``: other resource slots an agent advertises (``gpu``:
    2), scheduled, reserved and freed like cpu; absent from events written before they existed
    (omit_defaults keeps those events' shape)."""

    cpu: Cpu  # cores
    mem: Mem  # bytes
    slots: Slots = {}


class Capacity(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """What one agent offers."""

    cpu: Cpu  # cores
    mem: Mem  # bytes
    disk: Bytes  # bytes for images
    slots: Slots = {}  # e.g. {"gpu": 2.0}: what ``hoist-agent --slot gpu=2`` advertises


SessionType = Literal["interactive", "batch"]
ClusterMode = Literal["single-node", "multi-node"]


class Mount(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A named volume mounted into every kernel of a session (created on first use on the
    agent, kept after the session)."""

    volume: Id
    path: MountPath
    read_only: bool = False


class KernelSpec(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """What every kernel of a session runs.  ``command`` None: the image's own entrypoint and
    cmd."""

    command: Argv | None = None
    env: Env = {}
    workdir: AbsPath | None = None
    ports: Annotated[list[Port], msgspec.Meta(max_length=MAX_PORTS)] = []
    mounts: Annotated[list[Mount], msgspec.Meta(max_length=MAX_MOUNTS)] = []


class PublishedPort(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where a kernel's container port is reachable: ``host``:``host_port``."""

    port: Port
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    host_port: Port


PublishedPorts = Annotated[list[PublishedPort], msgspec.Meta(max_length=MAX_PORTS)]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=10 * 365 * 86400)]


class HeldImage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An image present on an agent."""

    digest: Digest
    size_bytes: Size


HeldImages = Annotated[dict[Image, HeldImage], msgspec.Meta(max_length=MAX_AGENT_IMAGES)]


class _Rule(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="kind"
):
    """A prepull rule: which images its policy's agents should hold (see plan_fleet)."""


class NewestTags(_Rule, frozen=True, kw_only=True, tag="newest-tags"):
    """The newest ``count`` tags of ``repository`` (e.g. ``pytorch/pytorch``) Hoist knows."""

    repository: Image
    count: Annotated[int, msgspec.Meta(ge=1, le=100)]


class LargeRecent(_Rule, frozen=True, kw_only=True, tag="large-recent"):
    """Images of at least ``min_bytes`` that a session used in the last ``days`` days."""

    min_bytes: Bytes
    days: Annotated[float, msgspec.Meta(gt=0, le=3650)]


class ListedImages(_Rule, frozen=True, kw_only=True, tag="images"):
    """These images, in this order."""

    images: Annotated[list[Image], msgspec.Meta(min_length=1, max_length=256)]


Rule = NewestTags | LargeRecent | ListedImages


class Event(msgspec.Struct, CanMutateAggregate[str], frozen=True, kw_only=True, tag_field="type"):
    originator_id: Id  # also the subject's last token (domain.admission checks they agree)
    originator_version: Annotated[int, msgspec.Meta(ge=1, le=2**62)]
    timestamp: AwareTime

    schema_version: ClassVar[int] = 1

    def _as_dict(self) -> dict[str, Any]:  # eventsourcing uses vars(); Structs have no __dict__
        return {f: getattr(self, f) for f in self.__struct_fields__}

    def apply(self, aggregate: Any) -> None:
        """The state change is the aggregate's: its ``WHEN[type(event)](aggregate, event)``.
        (Called by the library's ``mutate``, which then sets the version and modified_on.)"""
        try:
            change = aggregate.WHEN[type(self)]
        except KeyError:
            raise TypeError(
                f"a {type(aggregate).__name__} takes no {type_name(type(self))}"
            ) from None
        change(aggregate, self)


# --- session events (subject hoist.events.session.<session id>) ----------------------------


class SessionEnqueued(
    Event, CanInitAggregate[str], frozen=True, kw_only=True, tag="SessionEnqueued"
):
    """A user asked for a session: its kernels exist, PENDING, until the scheduler places them."""

    originator_topic: Topic
    owner: Owner
    image: Image
    resources: Resources  # per kernel
    cluster_size: ClusterSize
    resource_group: Id
    kernel_ids: KernelIds
    status_info: Reason
    request_id: Id | None = None  # the client's idempotency key
    session_type: SessionType = "interactive"
    cluster_mode: ClusterMode = "multi-node"
    spec: KernelSpec = KernelSpec()
    # Added later with defaults (an older event has neither): `hoist run --name`, `--label`.
    name: SessionName | None = None
    labels: Labels = {}

    # v2: what the kernels run (``spec``), ``session_type`` and ``cluster_mode``.  A v1 session's
    # kernels ran ``sleep infinity`` on any agent: the upcast says so.
    schema_version: ClassVar[int] = 2

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> dict[str, Any]:
        return {**state, "spec": {"command": ["sleep", "infinity"]}}

    def __post_init__(self) -> None:
        if len(self.kernel_ids) != self.cluster_size or len(set(self.kernel_ids)) != len(
            self.kernel_ids
        ):
            raise ValueError(
                f"kernel_ids must be {self.cluster_size} distinct ids (cluster_size),"
                f" got {self.kernel_ids!r}"
            )


class SessionSchedulingFailed(Event, frozen=True, kw_only=True, tag="SessionSchedulingFailed"):
    """A scheduling attempt found no place; the kernels stay PENDING with the reason, e.g.
    ``no-available-instances`` or ``predicate-checks-failed: <which>``."""

    status_info: Reason


HookPhase = Literal["enqueue", "schedule", "end"]


class HookSkipped(Event, frozen=True, kw_only=True, tag="HookSkipped"):
    """A lifecycle hook (a plugin, services.manager.hooks) raised or outlived its time limit
    at ``phase`` of the session: the manager went on without it.  Changes no status."""

    hook: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID, pattern=PRINTABLE)]
    phase: HookPhase
    reason: Reason


class SessionScheduled(Event, frozen=True, kw_only=True, tag="SessionScheduled"):
    """Every kernel was placed on an agent (its capacity is reserved from now on)."""

    # kernel id -> agent id
    placements: Annotated[dict[Id, Id], msgspec.Meta(min_length=1, max_length=MAX_CLUSTER)]
    status_info: Reason


class KernelEvent(Event, frozen=True, kw_only=True):
    """One kernel moved to ``status`` (the class's target status)."""

    kernel_id: Id
    status_info: Reason

    status: ClassVar[KernelStatus]


class KernelPreparing(KernelEvent, frozen=True, kw_only=True, tag="KernelPreparing"):
    """The manager asked the agent to check-and-pull the image."""

    status: ClassVar[KernelStatus] = KernelStatus.PREPARING


class KernelPulling(KernelEvent, frozen=True, kw_only=True, tag="KernelPulling"):
    """The agent lacks the image and pulls it in the background as ``task_id``."""

    task_id: Id

    status: ClassVar[KernelStatus] = KernelStatus.PULLING


class KernelPrepared(KernelEvent, frozen=True, kw_only=True, tag="KernelPrepared"):
    """The image is on the agent: the kernel can be created."""

    status: ClassVar[KernelStatus] = KernelStatus.PREPARED


class KernelCreating(KernelEvent, frozen=True, kw_only=True, tag="KernelCreating"):
    """The manager asked the agent to create the container."""

    status: ClassVar[KernelStatus] = KernelStatus.CREATING


class KernelCreated(KernelEvent, frozen=True, kw_only=True, tag="KernelCreated"):
    """The container runs; ``ports``: where its exposed ports are reachable."""

    container_id: Id
    ports: PublishedPorts = []

    # v2: ``ports`` (absent from v1, which published none).
    schema_version: ClassVar[int] = 2

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> dict[str, Any]:
        return state

    status: ClassVar[KernelStatus] = KernelStatus.RUNNING


class KernelCreationFailed(KernelEvent, frozen=True, kw_only=True, tag="KernelCreationFailed"):
    """The container could not be started (status_info ``failed-to-start``)."""

    detail: Detail = ""  # the error, for a human

    status: ClassVar[KernelStatus] = KernelStatus.ERROR


class KernelCancelled(KernelEvent, frozen=True, kw_only=True, tag="KernelCancelled"):
    """Given up before it ran: user cancel, pull failure, superadmin force-cancel."""

    detail: Detail = ""

    status: ClassVar[KernelStatus] = KernelStatus.CANCELLED


class KernelTerminating(KernelEvent, frozen=True, kw_only=True, tag="KernelTerminating"):
    """Asked to stop."""

    detail: Detail = ""

    status: ClassVar[KernelStatus] = KernelStatus.TERMINATING


class KernelTerminated(KernelEvent, frozen=True, kw_only=True, tag="KernelTerminated"):
    """The container is gone (stopped, exited, or its agent was lost).  When its process ended
    on its own: ``exit_code`` and ``ran_s``, the seconds it ran (status_info ``succeeded``,
    ``exited: code 3``, ``oom-killed``, ``killed: signal 9``)."""

    detail: Detail = ""
    exit_code: ExitCode | None = None
    ran_s: Seconds | None = None

    # v2: ``exit_code`` and ``ran_s`` (v1 recorded neither).
    schema_version: ClassVar[int] = 2

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> dict[str, Any]:
        return state

    status: ClassVar[KernelStatus] = KernelStatus.TERMINATED


# --- agent facts (subject hoist.events.agent.<agent id>) -----------------------------------


class AgentRegistered(
    Event, CanInitAggregate[str], frozen=True, kw_only=True, tag="AgentRegistered"
):
    """An agent joined for the first time, with what it offers and the images it already has."""

    originator_topic: Topic
    resource_group: Id
    capacity: Capacity
    runtime: Runtime  # "docker", "dummy"
    images: HeldImages = {}

    # v2: ``capacity.slots`` (an older reader refuses the unknown field, so it is a new schema).
    schema_version: ClassVar[int] = 2

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> dict[str, Any]:
        return state


class AgentReregistered(Event, frozen=True, kw_only=True, tag="AgentReregistered"):
    """A known agent started again: its report replaces capacity and image inventory, and the
    pulls of its previous process are gone with it."""

    resource_group: Id
    capacity: Capacity
    runtime: Runtime
    images: HeldImages = {}

    # v2: ``capacity.slots``, as AgentRegistered.
    schema_version: ClassVar[int] = 2

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> dict[str, Any]:
        return state


class ImagePullStarted(Event, frozen=True, kw_only=True, tag="ImagePullStarted"):
    image: Image
    task_id: Id


class ImagePulled(Event, frozen=True, kw_only=True, tag="ImagePulled"):
    """A pull finished; the agent now holds ``image``."""

    image: Image
    task_id: Id
    digest: Digest
    size_bytes: Size
    duration_s: Annotated[float, msgspec.Meta(ge=0, le=10 * 365 * 86400)]

    # v2: duration in seconds (float) instead of v1's integer milliseconds, the unit of every
    # other duration in Hoist (pull timeouts, stall limits, progress rates).
    schema_version: ClassVar[int] = 2

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> dict[str, Any]:
        state = dict(state)
        if "duration_ms" not in state:
            raise ValueError("Object missing required field `duration_ms`")
        state["duration_s"] = state.pop("duration_ms") / 1000
        return state


class ImagePullFailed(Event, frozen=True, kw_only=True, tag="ImagePullFailed", omit_defaults=True):
    """A pull ended without the image.  ``cancelled``: the agent stopped it because no kernel
    waited for it any more (pull-cancel), not a registry's or the network's failure; absent
    (False) from the events of a failure, and from those written before it existed."""

    image: Image
    task_id: Id
    reason: Reason
    cancelled: bool = False


class ImageRemoved(Event, frozen=True, kw_only=True, tag="ImageRemoved"):
    image: Image
    # e.g. "unload-requested: job J", "gc: disk 91% > 85%, least recently used (...)"
    reason: Reason


class KernelExited(Event, frozen=True, kw_only=True, tag="KernelExited"):
    """A kernel's process ended on this agent (its container stays, with its logs, until it is
    removed).  The agent's own fact: the manager turns it into the kernel's KernelTerminated
    when the kernel is RUNNING there."""

    kernel_id: Id
    session_id: Id
    exit_code: ExitCode
    oom_killed: bool = False
    ran_s: Seconds
    reason: Reason  # "exited: code 3", "oom-killed", "killed: signal 9" (reasons.exit_reason)


class ImagePreloaded(Event, frozen=True, kw_only=True, tag="ImagePreloaded"):
    """The agent holds ``image`` because it was asked to ahead of any kernel: by a preload job
    (``pinned``: image GC never removes it until it is unloaded) or a prepull policy (not
    pinned by this fact: the policy pins it only while it still wants it).  Recorded once the
    image is present (after its ImagePulled, or at once when it already was)."""

    image: Image
    reason: Reason  # "preload: job <id>", "prepull-policy: <names>"
    pinned: bool


# --- agent liveness (subject hoist.events.liveness.<agent id>, the manager's only) ----------


class AgentLost(Event, frozen=True, kw_only=True, tag="AgentLost"):
    """The manager stopped hearing from the agent (e.g. ``heartbeat-timeout``).

    Recorded on the agent's liveness subject, which only the manager may write.  Earlier
    Hoist recorded it on the agent's own subject, where an agent could forge it: such an event
    is now quarantined like any forgery (the liveness watcher marks a silent agent lost again
    after a restart anyway)."""

    status_info: Reason

    def mutate(self, aggregate: Any) -> Any:
        # The first loss creates the liveness aggregate, without an originator_topic field
        # (adding one would change the event's schema for no reader's benefit): the class is
        # the one registered with ``started_by(AgentLost)``.
        return _mutate_or_start(self, aggregate)


def _mutate_or_start(event: Event, aggregate: Any) -> Any:
    """``event`` applied to ``aggregate``; with None, it starts the aggregate class registered
    with ``started_by(type(event))`` (events that name no originator_topic)."""
    if aggregate is None:
        aggregate_class = started(type(event))
        aggregate = aggregate_class.__new__(aggregate_class)
        aggregate.__base_init__(event.originator_id, event.originator_version, event.timestamp)
        event.apply(aggregate)
        return aggregate
    return CanMutateAggregate.mutate(event, aggregate)


# --- reservations (subject hoist.events.reservation.<agent id>, managers' only) ------------


class CapacityReserved(Event, frozen=True, kw_only=True, tag="CapacityReserved"):
    """A manager reserved room on the agent for kernels of one session: appended in the same
    atomic batch as the session's SessionScheduled, expecting the subject's last sequence, so
    two managers deciding on the same room get one success and one conflict."""

    session_id: Id
    kernel_ids: KernelIds
    resources: Resources  # per kernel

    def mutate(self, aggregate: Any) -> Any:
        return _mutate_or_start(self, aggregate)  # the first reservation starts the aggregate


class CapacityReleased(Event, frozen=True, kw_only=True, tag="CapacityReleased"):
    """The kernels' room on the agent is free again (they ended, or were never started)."""

    session_id: Id
    kernel_ids: KernelIds
    status_info: Reason  # e.g. "kernel-ended: main1 TERMINATED"


# --- managers' lease (subject hoist.events.lease.<id>): messages with a TTL, no history ----


class ManagerLeaseTaken(Event, frozen=True, kw_only=True, tag="ManagerLeaseTaken"):
    """A manager took or renewed the leadership lease; the message expires after ``ttl_s``
    (Nats-TTL), and then the lease is free.  Readers admit it and fold it into nothing."""

    holder: Id
    ttl_s: Annotated[float, msgspec.Meta(gt=0, le=3600)]


class ManagerLeaseReleased(Event, frozen=True, kw_only=True, tag="ManagerLeaseReleased"):
    """The holder gave the lease up (it stops, or steps down): another manager may take it at
    once, by compare-and-set on this message, instead of waiting for the TTL."""

    holder: Id


class ManagerTermBegan(Event, frozen=True, kw_only=True, tag="ManagerTermBegan"):
    """A manager took the lease (not a renewal): appended with the take in one atomic batch,
    on the term subject, which nothing else writes.  The leader's fences expect this record,
    so a renewal does not refuse the leader's batches in flight, and any other manager's take
    refuses them.  It does not expire: one record per change of leader."""

    holder: Id


class ManagerFence(Event, frozen=True, kw_only=True, tag="ManagerFence"):
    """Rides in a leader's atomic batch, expecting the term subject at ``term_seq`` (the
    record of its take): the batch is refused whole once another manager took the lease.
    Expires like the lease."""

    # v2: the term subject's sequence; v1 expected the lease subject, which every renewal moved.
    schema_version: ClassVar[int] = 2

    holder: Id
    term_seq: Annotated[int, msgspec.Meta(ge=1, le=2**62)]

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> dict[str, Any]:
        rest = {k: v for k, v in state.items() if k != "lease_seq"}
        return {**rest, "term_seq": state.get("lease_seq", 1)}


# --- prepull policies (subject hoist.events.prepull-policy.<name>) -------------------------


class PrepullPolicySet(
    Event, CanInitAggregate[str], frozen=True, kw_only=True, tag="PrepullPolicySet"
):
    """A prepull policy was created or replaced (also after a removal): its rules for the
    agents of ``resource_groups`` (empty: every group).  One event for create and change, so a
    policy's history reads as the list of its versions."""

    originator_topic: Topic
    resource_groups: Annotated[list[Id], msgspec.Meta(max_length=MAX_LIST)]
    rules: Annotated[list[Rule], msgspec.Meta(max_length=MAX_LIST)]
    priority: Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]  # higher first
    reason: Reason  # e.g. "set-by-admin"

    def mutate(self, aggregate: Any) -> Any:
        if aggregate is None:
            return CanInitAggregate.mutate(self, aggregate)
        return CanMutateAggregate.mutate(self, aggregate)


class PrepullPolicyRemoved(Event, frozen=True, kw_only=True, tag="PrepullPolicyRemoved"):
    """The policy no longer applies: its images lose their pins (image GC may take them)."""

    reason: Reason


# --- resource policies (subject hoist.events.resource-policy.<owner or "default">) ---------

QuotaCpu = Annotated[float, msgspec.Meta(ge=0, le=2**40)]  # cores, all of an owner's kernels
QuotaAmount = Annotated[float, msgspec.Meta(ge=0, le=2**40)]
QuotaSlots = Annotated[dict[SlotName, QuotaAmount], msgspec.Meta(max_length=64)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
# A limit in seconds: never 0 (None is no limit).  Not ``Seconds`` (a duration may be 0: a
# command can end within the clock's resolution), which it once shadowed.
LimitSeconds = Annotated[float, msgspec.Meta(gt=0, le=2**40)]


class ResourcePolicySet(
    Event, CanInitAggregate[str], frozen=True, kw_only=True, tag="ResourcePolicySet"
):
    """An owner's resource policy (or the ``default`` one) was created or replaced (also after
    a removal).  Every limit is optional: None is unlimited.  What counts against it is what
    the owner's kernels hold in USER_RESOURCE_OCCUPYING statuses (a PULLING kernel holds
    nothing: a user is not charged while an image downloads); see domain.quota."""

    originator_topic: Topic
    max_cpu: QuotaCpu | None = None  # cores held at once
    max_mem: Bytes | None = None  # bytes held at once
    max_slots: QuotaSlots = {}  # slot -> amount held at once; a slot not named is unlimited
    max_sessions: Count | None = None  # sessions holding resources at once
    max_kernels_per_session: Count | None = None
    max_lifetime_s: LimitSeconds | None = None  # an interactive session RUNNING longer is ended
    # an interactive session nobody used through Hoist for longer is ended
    idle_timeout_s: LimitSeconds | None = None
    reason: Reason  # e.g. "set-by-admin"

    # v2: ``idle_timeout_s`` (absent from v1, which set no idle timeout: left out, None).
    schema_version: ClassVar[int] = 2

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> dict[str, Any]:
        return state

    def mutate(self, aggregate: Any) -> Any:
        if aggregate is None:
            return CanInitAggregate.mutate(self, aggregate)
        return CanMutateAggregate.mutate(self, aggregate)


class ResourcePolicyRemoved(Event, frozen=True, kw_only=True, tag="ResourcePolicyRemoved"):
    """The policy no longer applies: the owner falls back to ``default`` (or no limit)."""

    reason: Reason


# --- resource groups (subject hoist.events.resource-group.<group name>) -------------------

GroupUsers = Annotated[list[Owner], msgspec.Meta(max_length=MAX_LIST)]
Description = Annotated[str, msgspec.Meta(max_length=MAX_REASON, pattern=PRINTABLE)]


class ResourceGroupSet(
    Event, CanInitAggregate[str], frozen=True, kw_only=True, tag="ResourceGroupSet"
):
    """An admin defined a resource group's access, or replaced it (also after a removal): the
    owners who may create sessions in it (``users``), or everyone (``public``; then ``users``
    is empty).  A group no event defines is open to everyone; see domain.resource_group."""

    originator_topic: Topic
    users: GroupUsers = []  # sorted, distinct; empty and not public: nobody may use it
    public: bool = False
    description: Description = ""
    reason: Reason  # e.g. "set-by-admin"

    def mutate(self, aggregate: Any) -> Any:
        if aggregate is None:
            return CanInitAggregate.mutate(self, aggregate)
        return CanMutateAggregate.mutate(self, aggregate)


class ResourceGroupRemoved(Event, frozen=True, kw_only=True, tag="ResourceGroupRemoved"):
    """The group's definition no longer applies: it is open to everyone again, as a group no
    admin defined (its agents stay in it)."""

    reason: Reason


# --- users (subject hoist.events.user.<name>) ---------------------------------------------


class UserAdded(Event, CanInitAggregate[str], frozen=True, kw_only=True, tag="UserAdded"):
    """An admin added a Hoist user (the aggregate id is the name, a subject token), or added a
    disabled one again (re-enabled it, possibly changing ``admin``); see domain.user."""

    originator_topic: Topic
    admin: bool = False  # may also send hoist.admin.>
    by: Owner  # who added it: the NATS user the command came from (``admin``: the admin role)

    def mutate(self, aggregate: Any) -> Any:
        if aggregate is None:
            return CanInitAggregate.mutate(self, aggregate)
        return CanMutateAggregate.mutate(self, aggregate)


class UserDisabled(Event, frozen=True, kw_only=True, tag="UserDisabled"):
    """The user may no longer connect (their NATS user is removed); their sessions stay."""

    by: Owner


# --- dotfiles (subject hoist.events.dotfiles.<owner>) -------------------------------------


class DotfileSet(Event, CanInitAggregate[str], frozen=True, kw_only=True, tag="DotfileSet"):
    """The owner (the aggregate id) keeps ``content`` at ``path`` in their kernels' home (a new
    file, or a replaced one); see domain.dotfiles."""

    originator_topic: Topic
    path: DotfilePath
    content: DotfileContent  # base64 in the log's JSON
    mode: DotfileMode = 0o644
    by: Owner  # who set it: the user on their own subject, else the role (client, admin)

    def mutate(self, aggregate: Any) -> Any:
        if aggregate is None:
            return CanInitAggregate.mutate(self, aggregate)
        return CanMutateAggregate.mutate(self, aggregate)


class DotfileRemoved(Event, frozen=True, kw_only=True, tag="DotfileRemoved"):
    """The owner's kernels no longer get ``path`` (kernels already started keep theirs)."""

    path: DotfilePath
    by: Owner


AnyEvent = (
    SessionEnqueued
    | SessionSchedulingFailed
    | HookSkipped
    | SessionScheduled
    | KernelPreparing
    | KernelPulling
    | KernelPrepared
    | KernelCreating
    | KernelCreated
    | KernelCreationFailed
    | KernelCancelled
    | KernelTerminating
    | KernelTerminated
    | AgentRegistered
    | AgentReregistered
    | AgentLost
    | ImagePullStarted
    | ImagePulled
    | ImagePullFailed
    | ImageRemoved
    | ImagePreloaded
    | KernelExited
    | PrepullPolicySet
    | PrepullPolicyRemoved
    | ResourcePolicySet
    | ResourcePolicyRemoved
    | ResourceGroupSet
    | ResourceGroupRemoved
    | UserAdded
    | UserDisabled
    | DotfileSet
    | DotfileRemoved
    | CapacityReserved
    | CapacityReleased
    | ManagerLeaseTaken
    | ManagerLeaseReleased
    | ManagerTermBegan
    | ManagerFence
)

# Every kernel status change, in the order of the status machine.
KERNEL_EVENTS: tuple[type[KernelEvent], ...] = (
    KernelPreparing,
    KernelPulling,
    KernelPrepared,
    KernelCreating,
    KernelCreated,
    KernelCreationFailed,
    KernelCancelled,
    KernelTerminating,
    KernelTerminated,
)

EVENT_TYPES: dict[str, type[Event]] = {cls.__struct_config__.tag: cls for cls in AnyEvent.__args__}


def type_name(event_class: type[Event]) -> str:
    """The stable wire name of an event class."""
    return str(event_class.__struct_config__.tag)


A = TypeVar("A", bound=BaseAggregate[str])

# An event that starts an aggregate without naming its class (no originator_topic field:
# AgentLost) -> that class, registered by the aggregate's own module so that this module
# imports no aggregate (domain.admission imports that module, so every reader has it).
_STARTED_BY: dict[type[Event], type[BaseAggregate[str]]] = {}


def started_by(event_class: type[Event]) -> Callable[[type[A]], type[A]]:
    """Class decorator: ``event_class``, folded into no aggregate, creates the decorated one."""

    def register(aggregate_class: type[A]) -> type[A]:
        _STARTED_BY[event_class] = aggregate_class
        return aggregate_class

    return register


def started(event_class: type[Event]) -> type[BaseAggregate[str]]:
    """The aggregate class that ``event_class`` starts (registered with ``started_by``)."""
    try:
        return _STARTED_BY[event_class]
    except KeyError:
        raise LookupError(
            f"no aggregate class is registered as started by {type_name(event_class)}: the"
            " module that defines it registers it with events.started_by when imported"
        ) from None


def rebuild(events: Iterable[Event]) -> BaseAggregate[str] | None:
    """Fold an aggregate's events, in order, into the aggregate (None if there are none)."""
    aggregate: BaseAggregate[str] | None = None
    for event in events:
        aggregate = event.mutate(aggregate)
    return aggregate
