"""Every domain event of Hoist: one msgspec Struct each, a stable type name and a schema version.

The type name is the struct tag (the class name, frozen once released: never derived from
module paths).  ``schema_version`` grows when a released event's fields change; the change comes
with an ``upcast_vN_vM(state) -> state`` static method on the class that turns an old payload
dict into the next version's, so old history still loads (see domain.codec).

Events mix in eventsourcing's CanMutateAggregate / CanInitAggregate, so aggregates use the
library's ``_create`` and ``trigger_event``; ``apply`` folds an event into its aggregate and
trusts what commands check before recording, except what a reader must not trust from a
stored record: the kernel and transition a session event names (a poison event fails to apply
and is quarantined, see domain.admission).

Bounds: every field uses the bounds of domain.limits, so an event any reader accepts fits the
read models (DuckDB BIGINT/DOUBLE, msgspec int64) and a reply.  Tightening them did not bump
any ``schema_version``: no event Hoist ever recorded exceeds them (commands never took values
near them), and an event that would is quarantined rather than upcast.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import msgspec
from eventsourcing.domain import BaseAggregate, CanInitAggregate, CanMutateAggregate

from domain.limits import (
    MAX_AGENT_IMAGES,
    MAX_CLUSTER,
    MAX_ID,
    MAX_LIST,
    ClusterSize,
    Cpu,
    Detail,
    Id,
    Image,
    Mem,
    Owner,
    Reason,
    Size,
)
from domain.status import Kernel, KernelStatus, check_transition

if TYPE_CHECKING:
    from domain.agent import Agent
    from domain.liveness import AgentLiveness
    from domain.prepull import PrepullPolicy
    from domain.session import Session

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]  # unbounded: for other modules' requests
AwareTime = Annotated[datetime, msgspec.Meta(tz=True)]
Bytes = Size
Topic = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Digest = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID * 2)]
Runtime = Id
KernelIds = Annotated[list[Id], msgspec.Meta(min_length=1, max_length=MAX_CLUSTER)]


class Resources(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one kernel asks for."""

    cpu: Cpu  # cores
    mem: Mem  # bytes


class Capacity(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one agent offers."""

    cpu: Cpu  # cores
    mem: Mem  # bytes
    disk: Bytes  # bytes for images


class HeldImage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An image present on an agent."""

    digest: Digest
    size_bytes: Size


HeldImages = Annotated[dict[Image, HeldImage], msgspec.Meta(max_length=MAX_AGENT_IMAGES)]


class _Rule(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="kind"
):
    """A prepull rule: which images its policy's agents should hold (domain.prepull)."""


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

    def __post_init__(self) -> None:
        if len(self.kernel_ids) != self.cluster_size or len(set(self.kernel_ids)) != len(
            self.kernel_ids
        ):
            raise ValueError(
                f"kernel_ids must be {self.cluster_size} distinct ids (cluster_size),"
                f" got {self.kernel_ids!r}"
            )

    def apply(self, aggregate: Session) -> None:
        aggregate.owner = self.owner
        aggregate.image = self.image
        aggregate.resources = self.resources
        aggregate.resource_group = self.resource_group
        aggregate.request_id = self.request_id
        aggregate.kernels = {}
        for kernel_id in self.kernel_ids:
            kernel = Kernel(kernel_id=kernel_id)
            kernel.move_to(KernelStatus.PENDING, self.status_info, self.timestamp)
            aggregate.kernels[kernel_id] = kernel


class SessionSchedulingFailed(Event, frozen=True, kw_only=True, tag="SessionSchedulingFailed"):
    """A scheduling attempt found no place; the kernels stay PENDING with the reason, e.g.
    ``no-available-instances`` or ``predicate-checks-failed: <which>``."""

    status_info: Reason

    def apply(self, aggregate: Session) -> None:
        for kernel in aggregate.kernels.values():
            kernel.move_to(KernelStatus.PENDING, self.status_info, self.timestamp)


class SessionScheduled(Event, frozen=True, kw_only=True, tag="SessionScheduled"):
    """Every kernel was placed on an agent (its capacity is reserved from now on)."""

    # kernel id -> agent id
    placements: Annotated[dict[Id, Id], msgspec.Meta(min_length=1, max_length=MAX_CLUSTER)]
    status_info: Reason

    def apply(self, aggregate: Session) -> None:
        # Check every kernel before changing any: a poison event must leave the session as it
        # was (the reader quarantines it and goes on).
        for kernel_id in self.placements:
            if kernel_id not in aggregate.kernels:
                raise KeyError(f"session {aggregate.id} has no kernel {kernel_id}")
            check_transition(aggregate.kernels[kernel_id].status, KernelStatus.SCHEDULED, kernel_id)
        for kernel_id, agent_id in self.placements.items():
            kernel = aggregate.kernels[kernel_id]
            kernel.agent_id = agent_id
            kernel.move_to(KernelStatus.SCHEDULED, self.status_info, self.timestamp)


class KernelEvent(Event, frozen=True, kw_only=True):
    """One kernel moved to ``status`` (the class's target status)."""

    kernel_id: Id
    status_info: Reason

    status: ClassVar[KernelStatus]

    def apply(self, aggregate: Session) -> None:
        kernel = aggregate.kernels.get(self.kernel_id)
        if kernel is None:
            raise KeyError(f"session {aggregate.id} has no kernel {self.kernel_id}")
        # Commands check this too; checked again here so a stored illegal move is refused.
        check_transition(kernel.status, self.status, self.kernel_id)
        kernel.move_to(self.status, self.status_info, self.timestamp)
        self.apply_details(kernel)

    def apply_details(self, kernel: Kernel) -> None:
        """Fields beyond the status change."""


class KernelPreparing(KernelEvent, frozen=True, kw_only=True, tag="KernelPreparing"):
    """The manager asked the agent to check-and-pull the image."""

    status: ClassVar[KernelStatus] = KernelStatus.PREPARING


class KernelPulling(KernelEvent, frozen=True, kw_only=True, tag="KernelPulling"):
    """The agent lacks the image and pulls it in the background as ``task_id``."""

    task_id: Id

    status: ClassVar[KernelStatus] = KernelStatus.PULLING

    def apply_details(self, kernel: Kernel) -> None:
        kernel.pull_task_id = self.task_id


class KernelPrepared(KernelEvent, frozen=True, kw_only=True, tag="KernelPrepared"):
    """The image is on the agent: the kernel can be created."""

    status: ClassVar[KernelStatus] = KernelStatus.PREPARED


class KernelCreating(KernelEvent, frozen=True, kw_only=True, tag="KernelCreating"):
    """The manager asked the agent to create the container."""

    status: ClassVar[KernelStatus] = KernelStatus.CREATING


class KernelCreated(KernelEvent, frozen=True, kw_only=True, tag="KernelCreated"):
    """The container runs."""

    container_id: Id

    status: ClassVar[KernelStatus] = KernelStatus.RUNNING

    def apply_details(self, kernel: Kernel) -> None:
        kernel.container_id = self.container_id


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
    """The container is gone (stopped, exited, or its agent was lost)."""

    detail: Detail = ""

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

    def apply(self, aggregate: Agent) -> None:
        aggregate.pulls = {}
        aggregate.status_info = "registered"
        aggregate.preloaded = {}
        _apply_registration(aggregate, self)


class AgentReregistered(Event, frozen=True, kw_only=True, tag="AgentReregistered"):
    """A known agent started again: its report replaces capacity and image inventory, and the
    pulls of its previous process are gone with it."""

    resource_group: Id
    capacity: Capacity
    runtime: Runtime
    images: HeldImages = {}

    def apply(self, aggregate: Agent) -> None:
        aggregate.pulls = {}
        aggregate.status_info = "reregistered"
        _apply_registration(aggregate, self)


def _apply_registration(aggregate: Agent, event: AgentRegistered | AgentReregistered) -> None:
    aggregate.resource_group = event.resource_group
    aggregate.capacity = event.capacity
    aggregate.runtime = event.runtime
    aggregate.images = dict(event.images)
    # A preload mark outlives a restart for as long as the image is still there.
    aggregate.preloaded = {
        image: pinned
        for image, pinned in getattr(aggregate, "preloaded", {}).items()
        if image in aggregate.images
    }


class ImagePullStarted(Event, frozen=True, kw_only=True, tag="ImagePullStarted"):
    image: Image
    task_id: Id

    def apply(self, aggregate: Agent) -> None:
        aggregate.pulls[self.image] = self.task_id


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

    def apply(self, aggregate: Agent) -> None:
        aggregate.pulls.pop(self.image, None)
        aggregate.images[self.image] = HeldImage(digest=self.digest, size_bytes=self.size_bytes)


class ImagePullFailed(Event, frozen=True, kw_only=True, tag="ImagePullFailed"):
    image: Image
    task_id: Id
    reason: Reason

    def apply(self, aggregate: Agent) -> None:
        aggregate.pulls.pop(self.image, None)


class ImageRemoved(Event, frozen=True, kw_only=True, tag="ImageRemoved"):
    image: Image
    # e.g. "unload-requested: job J", "gc: disk 91% > 85%, least recently used (...)"
    reason: Reason

    def apply(self, aggregate: Agent) -> None:
        aggregate.images.pop(self.image, None)
        aggregate.preloaded.pop(self.image, None)


class ImagePreloaded(Event, frozen=True, kw_only=True, tag="ImagePreloaded"):
    """The agent holds ``image`` because it was asked to ahead of any kernel: by a preload job
    (``pinned``: image GC never removes it until it is unloaded) or a prepull policy (not
    pinned by this fact: the policy pins it only while it still wants it).  Recorded once the
    image is present (after its ImagePulled, or at once when it already was)."""

    image: Image
    reason: Reason  # "preload: job <id>", "prepull-policy: <names>"
    pinned: bool

    def apply(self, aggregate: Agent) -> None:
        aggregate.preloaded[self.image] = self.pinned or aggregate.preloaded.get(self.image, False)


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
        # (adding one would change the event's schema for no reader's benefit).
        if aggregate is None:
            from domain.liveness import AgentLiveness  # it imports this module

            aggregate = AgentLiveness.__new__(AgentLiveness)
            aggregate.__base_init__(self.originator_id, self.originator_version, self.timestamp)
            self.apply(aggregate)
            return aggregate
        return CanMutateAggregate.mutate(self, aggregate)

    def apply(self, aggregate: AgentLiveness) -> None:
        aggregate.losses = getattr(aggregate, "losses", 0) + 1
        aggregate.status_info = self.status_info
        aggregate.lost_at = self.timestamp


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

    def apply(self, aggregate: PrepullPolicy) -> None:
        aggregate.resource_groups = list(self.resource_groups)
        aggregate.rules = list(self.rules)
        aggregate.priority = self.priority
        aggregate.removed = False
        aggregate.reason = self.reason


class PrepullPolicyRemoved(Event, frozen=True, kw_only=True, tag="PrepullPolicyRemoved"):
    """The policy no longer applies: its images lose their pins (image GC may take them)."""

    reason: Reason

    def apply(self, aggregate: PrepullPolicy) -> None:
        aggregate.removed = True
        aggregate.reason = self.reason


AnyEvent = (
    SessionEnqueued
    | SessionSchedulingFailed
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
    | PrepullPolicySet
    | PrepullPolicyRemoved
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

EVENT_TYPES: dict[str, type[Event]] = {
    cls.__struct_config__.tag: cls  # type: ignore[misc]
    for cls in AnyEvent.__args__
}


def type_name(event_class: type[Event]) -> str:
    """The stable wire name of an event class."""
    return str(event_class.__struct_config__.tag)


def rebuild(events: Iterable[Event]) -> BaseAggregate[str] | None:
    """Fold an aggregate's events, in order, into the aggregate (None if there are none)."""
    aggregate: BaseAggregate[str] | None = None
    for event in events:
        aggregate = event.mutate(aggregate)
    return aggregate
