"""What a reader of the log accepts: one rule for every reader (manager, projections, replay,
verify, the repository, agents).

``admit`` takes a stored record's subject, headers and data and returns the event, or raises
``Inadmissible`` with a short readable reason: the event does not decode (unknown type, bad
JSON, a field out of domain.limits' bounds), or it is not bound to its subject: each subject
family holds only the event types its writer produces, and the event's originator must be the
subject's id.  ``fold`` applies an admitted event to its aggregate, or raises ``Inadmissible``
when it cannot apply (an unknown kernel, an illegal transition, a version gap).  Readers
quarantine what either refuses, skip it, and go on.

NATS permissions refuse at the server what they can (an agent may publish only its own
``hoist.events.agent.<id>``); this rule catches the rest: what an agent writes on its own
subject about someone else, and anything on a subject no writer should use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eventsourcing.domain import CanInitAggregate

from domain import events as ev
from domain import liveness as _liveness  # noqa: F401  registers what AgentLost starts
from domain import reservation as _reservation  # noqa: F401  registers CapacityReserved's
from domain.codec import REFLECTED_HEADER, TYPE_HEADER, decode
from domain.errors import DomainError, EventDecodeError
from domain.limits import MAX_REASON, clip
from domain.subjects import (
    DOTFILES,
    EVENTS,
    LEASE,
    LIVENESS,
    PREPULL_POLICY,
    RESERVATION,
    RESOURCE_GROUP,
    RESOURCE_POLICY,
    USER,
)

SESSION_EVENTS: frozenset[type[ev.Event]] = frozenset(
    {
        ev.SessionEnqueued,
        ev.SessionSchedulingFailed,
        ev.HookSkipped,
        ev.SessionScheduled,
        *ev.KERNEL_EVENTS,
    }
)
# What an agent appends about itself (agent.facts), and nothing else.
AGENT_EVENTS: frozenset[type[ev.Event]] = frozenset(
    {
        ev.AgentRegistered,
        ev.AgentReregistered,
        ev.ImagePullStarted,
        ev.ImagePulled,
        ev.ImagePullFailed,
        ev.ImageRemoved,
        ev.ImagePreloaded,
        ev.KernelExited,
    }
)
LIVENESS_EVENTS: frozenset[type[ev.Event]] = frozenset({ev.AgentLost})
POLICY_EVENTS: frozenset[type[ev.Event]] = frozenset({ev.PrepullPolicySet, ev.PrepullPolicyRemoved})
RESOURCE_POLICY_EVENTS: frozenset[type[ev.Event]] = frozenset(
    {ev.ResourcePolicySet, ev.ResourcePolicyRemoved}
)
RESOURCE_GROUP_EVENTS: frozenset[type[ev.Event]] = frozenset(
    {ev.ResourceGroupSet, ev.ResourceGroupRemoved}
)
USER_EVENTS: frozenset[type[ev.Event]] = frozenset({ev.UserAdded, ev.UserDisabled})
DOTFILE_EVENTS: frozenset[type[ev.Event]] = frozenset({ev.DotfileSet, ev.DotfileRemoved})
RESERVATION_EVENTS: frozenset[type[ev.Event]] = frozenset(
    {ev.CapacityReserved, ev.CapacityReleased}
)
LEASE_EVENTS: frozenset[type[ev.Event]] = frozenset(
    {ev.ManagerLeaseTaken, ev.ManagerLeaseReleased, ev.ManagerTermBegan, ev.ManagerFence}
)

# Subject kind (hoist.events.<kind>.<id>) -> the event types it may hold.
BINDINGS: dict[str, frozenset[type[ev.Event]]] = {
    "session": SESSION_EVENTS,
    "agent": AGENT_EVENTS,
    LIVENESS: LIVENESS_EVENTS,
    PREPULL_POLICY: POLICY_EVENTS,
    RESOURCE_POLICY: RESOURCE_POLICY_EVENTS,
    RESOURCE_GROUP: RESOURCE_GROUP_EVENTS,
    USER: USER_EVENTS,
    DOTFILES: DOTFILE_EVENTS,
    RESERVATION: RESERVATION_EVENTS,
    LEASE: LEASE_EVENTS,
}
# The event that starts each aggregate (its first event must be one of these).
_FIRST: dict[str, tuple[type[ev.Event], ...]] = {
    "session": (ev.SessionEnqueued,),
    "agent": (ev.AgentRegistered,),
    LIVENESS: (ev.AgentLost,),
    PREPULL_POLICY: (ev.PrepullPolicySet,),
    RESOURCE_POLICY: (ev.ResourcePolicySet,),
    RESOURCE_GROUP: (ev.ResourceGroupSet,),
    USER: (ev.UserAdded,),
    DOTFILES: (ev.DotfileSet,),
    RESERVATION: (ev.CapacityReserved,),
}
# Kinds whose start event may come again (a policy or group is set again, also after a
# removal; a disabled user is added again; every dotfile set starts again).
_SET_AGAIN = frozenset({PREPULL_POLICY, RESOURCE_POLICY, RESOURCE_GROUP, USER, DOTFILES})
# Kinds whose messages are no aggregate's history: each stands alone (most expire), so no
# order is checked and folding one changes nothing.
STANDALONE = frozenset({LEASE})
_PREFIX = f"{EVENTS}."


def standalone(subject: str) -> bool:
    """Whether ``subject``'s messages stand alone (no history to keep; they expire)."""
    return subject.removeprefix(_PREFIX).partition(".")[0] in STANDALONE


class Inadmissible(DomainError):
    """A stored record no reader accepts: ``reason`` says why, ``event_type`` is its header's
    type name (may be empty or unknown)."""

    def __init__(self, reason: str, event_type: str = "") -> None:
        self.reason = clip(reason, MAX_REASON)
        self.event_type = event_type
        super().__init__(self.reason)


def binding(subject: str) -> tuple[str, str]:
    """(kind, id) of an event subject, or Inadmissible if it is no aggregate subject."""
    kind, _, aggregate_id = subject.removeprefix(_PREFIX).partition(".")
    if not subject.startswith(_PREFIX) or kind not in BINDINGS or not aggregate_id:
        raise Inadmissible(
            f"subject {clip(subject, 200)!r} is not hoist.events.<kind>.<id> with a kind of"
            f" {', '.join(BINDINGS)}"
        )
    if "." in aggregate_id:
        raise Inadmissible(f"subject {clip(subject, 200)!r} has more than one id token")
    return kind, aggregate_id


def writer(subject: str) -> str:
    """Who can have written a record on ``subject``, as NATS permissions allow it (the
    ``Hoist-Actor`` header is only the writer's claim): ``agent:<id>`` on an agent's own
    subject, ``manager`` on the subjects only it writes, ``unknown`` elsewhere."""
    try:
        kind, aggregate_id = binding(subject)
    except Inadmissible:
        return "unknown"
    return f"agent:{aggregate_id}" if kind == "agent" else "manager"


def admit(subject: str, headers: Mapping[str, str], data: bytes) -> ev.Event:
    """The event stored on ``subject``, decoded and checked against its subject."""
    name = headers.get(TYPE_HEADER, "")
    if REFLECTED_HEADER in headers:
        raise Inadmissible(
            f"a copy of stream record {clip(headers[REFLECTED_HEADER], 200)} that nats-server"
            " stored as its answer to a JetStream request aimed here; nobody appended it",
            clip(name, 200),
        )
    kind, aggregate_id = binding(subject)
    try:
        event = decode(data, headers)
    except EventDecodeError as e:
        raise Inadmissible(str(e), clip(name, 200)) from None
    if type(event) not in BINDINGS[kind]:
        allowed = ", ".join(sorted(ev.type_name(t) for t in BINDINGS[kind]))
        raise Inadmissible(f"{name} may not be on hoist.events.{kind}.* (only {allowed})", name)
    if event.originator_id != aggregate_id:
        raise Inadmissible(
            f"{name} speaks of {kind} {event.originator_id!r} but is on the subject of"
            f" {kind} {aggregate_id!r}",
            name,
        )
    return event


def out_of_sequence(subject: str, last_version: int | None, event: ev.Event) -> str | None:
    """Why ``event`` cannot follow the admitted events of its aggregate on ``subject`` (at
    ``last_version``; None: nothing admitted yet), or None.  The rule of every reader: the
    first event starts the aggregate (at its own version, as eventsourcing does), a start does
    not come twice (a prepull or resource policy, or a resource group, may be set again), every
    later event is the next version."""
    kind, _ = binding(subject)
    if kind in STANDALONE:
        return None
    if last_version is None:
        first = _FIRST.get(kind, ())
        if isinstance(event, first):
            return None
        return (
            f"{ev.type_name(type(event))} cannot start a {kind}: its first event must be"
            f" {', '.join(ev.type_name(t) for t in first)}"
        )
    if isinstance(event, CanInitAggregate):
        _, aggregate_id = binding(subject)
        if kind not in _SET_AGAIN:
            return f"{ev.type_name(type(event))} again: {kind} {aggregate_id!r} already exists"
    if event.originator_version != last_version + 1:
        return (
            f"version gap: {ev.type_name(type(event))} is version {event.originator_version},"
            f" {clip(subject, 200)} is at {last_version}"
        )
    return None


def fold(aggregate: Any, event: ev.Event, subject: str) -> Any:
    """``event`` applied to ``aggregate`` (None before its first event) of ``subject``;
    Inadmissible if it is out of sequence or cannot apply.  A refused event leaves the
    aggregate as it was (each ``apply`` checks before it changes anything)."""
    name = ev.type_name(type(event))
    last = None if aggregate is None else aggregate.version
    why = out_of_sequence(subject, last, event)
    if why is not None:
        raise Inadmissible(why, name)
    if standalone(subject):
        return aggregate
    try:
        return event.mutate(aggregate)
    except Exception as e:  # whatever a stored event makes apply raise, it is that event's
        raise Inadmissible(f"{name} cannot apply: {type(e).__name__}: {e}", name) from None


UNKNOWN_HOLDER = "?"  # no manager's name (not a subject token)


def lease_holder(subject: str, headers: Mapping[str, str], data: bytes) -> str | None:
    """Who holds the managers' lease, as its last record says (None: released;
    ``UNKNOWN_HOLDER``: a record no manager wrote, which a manager may take over); on the term
    subject, whose take its last record is."""
    try:
        event = admit(subject, headers, data)
    except Inadmissible:
        return UNKNOWN_HOLDER
    return event.holder if isinstance(event, ev.ManagerLeaseTaken | ev.ManagerTermBegan) else None
