"""Resource policies (Backend.AI's keypair resource policy): per-owner quotas, kept as events.

A ``ResourcePolicy`` aggregate (subject ``hoist.events.resource-policy.<name>``) is set
(created or replaced) and removed by admin commands.  ``name`` is an owner, or ``default``.
An owner's effective policy is their own if set (and not removed), else ``default``, else none
(unlimited).  Policy names are subject tokens (letters, digits, '_' and '-'), while an owner is
any printable text today: an owner whose name is not a token can have no policy of their own
and always gets ``default``.  The name ``default`` is the default policy, so an owner named
``default`` gets it too.

What counts against a quota is exactly what the owner's kernels hold in USER_RESOURCE_OCCUPYING
statuses (domain.status): a PULLING kernel holds nothing (a download uses no cpu or memory of
the owner's), so a user at quota can have a session pulling while another runs.
``max_sessions`` counts sessions from SCHEDULED until they end, PULLING included: a pull holds
nothing, but it is a session, so it bounds how far pulls ending can take usage past the quota.
The scheduler checks the quota when it places a session (``quota_failures``); once a pull ends,
the kernel is charged again and goes on to start even if that puts its owner over the quota, as
every pulled kernel does: the quota only keeps new sessions PENDING until the owner's usage is
below it again.  A session that could never fit its owner's quota (``never_fits``) is refused at
create.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from eventsourcing.domain import BaseAggregate

from domain import events as ev
from domain.errors import Conflict, InvalidField, require_text
from domain.events import Resources
from domain.subjects import check_token

DEFAULT = "default"  # the policy of every owner without one of their own
KIND = "resource-policy"


class Quota(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one owner may hold at once; None (or a slot not named) is unlimited."""

    max_cpu: float | None = None
    max_mem: int | None = None
    max_slots: dict[str, float] = {}
    max_sessions: int | None = None
    max_kernels_per_session: int | None = None
    max_lifetime_s: float | None = None
    idle_timeout_s: float | None = None


_FIELDS = tuple(Quota.__struct_fields__)


@dataclass
class Usage:
    """What one owner's kernels hold in USER_RESOURCE_OCCUPYING statuses, and in how many
    sessions."""

    cpu: float = 0.0
    mem: int = 0
    slots: dict[str, float] = field(default_factory=dict)
    sessions: int = 0

    def add(self, cpu: float, mem: int, slots: Mapping[str, float], sessions: int) -> None:
        """Add (negative amounts: take away); rounded so sums of 0.1 cores leave no 1e-14."""
        self.cpu = max(0.0, round(self.cpu + cpu, 9))
        self.mem = max(0, self.mem + mem)
        for name, amount in slots.items():
            held = round(self.slots.get(name, 0.0) + amount, 9)
            if held > 0:
                self.slots[name] = held
            else:
                self.slots.pop(name, None)
        self.sessions = max(0, self.sessions + sessions)

    def copy(self) -> Usage:
        return Usage(self.cpu, self.mem, dict(self.slots), self.sessions)

    @property
    def empty(self) -> bool:
        return not (self.cpu or self.mem or self.slots or self.sessions)


class ResourcePolicy(BaseAggregate[str]):
    KIND = KIND

    if TYPE_CHECKING:  # set by the events
        quota: Quota
        removed: bool
        reason: str

    @staticmethod
    def set(
        existing: ResourcePolicy | None,
        *,
        name: str,
        quota: Quota,
        reason: str = "set-by-admin",
    ) -> ResourcePolicy:
        """Create the policy, or replace the limits of ``existing`` (also a removed one)."""
        fields = {**checked(quota), "reason": require_text(reason, "reason")}
        if existing is None:
            return ResourcePolicy._create(
                ev.ResourcePolicySet, id=check_token(name, "name"), **fields
            )
        if not existing.removed and existing.quota == quota_of(fields):
            return existing  # the same policy again: nothing new to record
        existing.trigger_event(ev.ResourcePolicySet, originator_topic=_topic(), **fields)
        return existing

    def remove(self, reason: str = "removed-by-admin") -> None:
        require_text(reason, "reason")
        if self.removed:
            raise Conflict("name", f"resource policy {self.id!r} is already removed")
        self.trigger_event(ev.ResourcePolicyRemoved, reason=reason)

    # --- state changes (Event.apply calls WHEN) ---------------------------------------------

    def _on_set(self, e: ev.ResourcePolicySet) -> None:
        self.quota = quota_of({f: getattr(e, f) for f in _FIELDS})
        self.removed = False
        self.reason = e.reason

    def _on_removed(self, e: ev.ResourcePolicyRemoved) -> None:
        self.removed = True
        self.reason = e.reason

    WHEN = {
        ev.ResourcePolicySet: _on_set,
        ev.ResourcePolicyRemoved: _on_removed,
    }


def _topic() -> str:
    from eventsourcing.utils import get_topic

    return get_topic(ResourcePolicy)


def quota_of(values: Mapping[str, Any]) -> Quota:
    return Quota(**{f: values[f] for f in _FIELDS if f in values})


class QuotaLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A quota's fields with ResourcePolicySet's bounds: what the wire checks (SetQuota)."""

    max_cpu: ev.QuotaCpu | None = None
    max_mem: ev.Bytes | None = None
    max_slots: ev.QuotaSlots = {}
    max_sessions: ev.Count | None = None
    max_kernels_per_session: ev.Count | None = None
    max_lifetime_s: ev.LimitSeconds | None = None
    idle_timeout_s: ev.LimitSeconds | None = None


def checked(quota: Quota) -> dict[str, Any]:
    """The quota's fields as ResourcePolicySet takes them, or InvalidField naming the bad one."""
    values = msgspec.structs.asdict(quota)
    for name, value in values.items():
        try:
            msgspec.convert({name: value}, QuotaLimits)
        except msgspec.ValidationError as e:
            raise InvalidField(name, str(e)) from None
    values["max_slots"] = {k: float(v) for k, v in sorted(values["max_slots"].items())}
    if values["max_cpu"] is not None:
        values["max_cpu"] = float(values["max_cpu"])
    for name in ("max_lifetime_s", "idle_timeout_s"):
        if values[name] is not None:
            values[name] = float(values[name])
    return values


def effective(owner: str, policies: Mapping[str, ResourcePolicy]) -> ResourcePolicy | None:
    """The owner's own live policy, else the live ``default``, else None (unlimited)."""
    own = policies.get(owner)
    if own is not None and not own.removed:
        return own
    default = policies.get(DEFAULT)
    if default is not None and not default.removed:
        return default
    return None


# --- the checks --------------------------------------------------------------------------------


def totals(resources: Resources, kernels: int) -> tuple[float, int, dict[str, float]]:
    """What a session of ``kernels`` kernels of ``resources`` holds once all are charged."""
    return (
        resources.cpu * kernels,
        resources.mem * kernels,
        {k: v * kernels for k, v in resources.slots.items() if v > 0},
    )


def never_fits(quota: Quota, resources: Resources, kernels: int) -> tuple[str, str] | None:
    """(field, why) when a session could never fit ``quota`` even with nothing else held."""
    cpu, mem, slots = totals(resources, kernels)
    if quota.max_kernels_per_session is not None and kernels > quota.max_kernels_per_session:
        return "cluster_size", (
            f"{kernels} kernels asked, the owner's max_kernels_per_session is"
            f" {quota.max_kernels_per_session}"
        )
    if quota.max_cpu is not None and cpu > quota.max_cpu + 1e-9:
        return "resources.cpu", (
            f"{_num(cpu)} cpu asked in all, the owner's cpu quota is {_num(quota.max_cpu)}"
        )
    if quota.max_mem is not None and mem > quota.max_mem:
        return "resources.mem", (
            f"{fmt_mem(mem)} asked in all, the owner's mem quota is {fmt_mem(quota.max_mem)}"
        )
    for name, amount in sorted(slots.items()):
        most = quota.max_slots.get(name)
        if most is not None and amount > most + 1e-9:
            return f"resources.{name}", (
                f"{fmt_amount(amount)} {name} asked in all, the owner's {name} quota is"
                f" {fmt_amount(most)}"
            )
    if quota.max_sessions == 0:
        return "owner", "the owner's sessions quota is 0"
    return None


def quota_failures(quota: Quota, used: Usage, resources: Resources, kernels: int) -> list[str]:
    """Each limit of ``quota`` the session would exceed now, with its numbers, e.g.
    ``user cpu quota (3.0 of 4.0 used, asks 2.0)``."""
    out = []
    cpu, mem, slots = totals(resources, kernels)
    if quota.max_sessions is not None and used.sessions + 1 > quota.max_sessions:
        out.append(f"user sessions quota ({used.sessions} of {quota.max_sessions} used, asks 1)")
    if quota.max_kernels_per_session is not None and kernels > quota.max_kernels_per_session:
        out.append(
            f"user kernels quota ({kernels} kernels asked, limit"
            f" {quota.max_kernels_per_session} per session)"
        )
    if quota.max_cpu is not None and used.cpu + cpu > quota.max_cpu + 1e-9:
        out.append(
            f"user cpu quota ({_num(used.cpu)} of {_num(quota.max_cpu)} used, asks {_num(cpu)})"
        )
    if quota.max_mem is not None and used.mem + mem > quota.max_mem:
        out.append(
            f"user mem quota ({fmt_mem(used.mem)} of {fmt_mem(quota.max_mem)} used,"
            f" asks {fmt_mem(mem)})"
        )
    for name, amount in sorted(slots.items()):
        most = quota.max_slots.get(name)
        held = used.slots.get(name, 0.0)
        if most is not None and held + amount > most + 1e-9:
            out.append(
                f"user {name} quota ({fmt_amount(held)} of {fmt_amount(most)} used,"
                f" asks {fmt_amount(amount)})"
            )
    return out


def _num(x: float) -> str:
    return str(float(round(x, 6)))


def fmt_amount(x: float) -> str:
    """An amount (cores, slots) without float noise: 0.1 + 0.2 reads 0.3."""
    return f"{round(x, 6):g}"


def fmt_mem(n: int) -> str:
    for unit, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= unit:
            return f"{round(n / unit, 2):g} {name}"
    return f"{n} B"


def check_name(name: str) -> str:
    """A policy name: an owner that is a subject token, or ``default``."""
    return check_token(name, "name")  # InvalidField naming it
