"""Resource groups (Backend.AI's scaling groups): which owners may create sessions in a
group, kept as events.

Agents join a group by name (``hoist agent --resource-group``), as before; a session asks for
one (``resource_group``, ``default`` unless given) and lands only on that group's agents.  An
admin may *define* a group: a ``ResourceGroup`` aggregate (subject
``hoist.events.resource-group.<name>``) set (created or replaced) and removed by admin commands,
naming the owners who may use it (``users``) or opening it to everyone (``public``).

A session's group must be known (``check_known``): ``default``, a group an admin defined or
one an agent ever joined; any other name (a misspelt one) is refused at create, naming the
nearest known ones.  A known group with no live agent is waited for, as agents come and go.

The access rule (``may_use``), checked when a session is created (a create for a group its owner
may not use is refused, and nothing is appended):

- a group no event defines is open to everyone: ``default``, and every group agents joined
  before anyone defined it, work as they always did;
- a defined group is open to its ``users`` only, or to everyone if ``public``; defined with
  neither, nobody may use it (the way to close a group);
- a *removed* group is open to everyone again, as if never defined: removing takes back the
  admin's rule, it does not retire the group's agents (to keep everyone out, set it with no
  users instead).

A change applies to creates from then on: sessions already created are neither stopped nor
held.  Users are sessions' ``owner`` strings (a Hoist user's name on their own subjects).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec
from eventsourcing.domain import BaseAggregate

from domain import events as ev
from domain.errors import Conflict, InvalidField, require_text
from domain.subjects import RESOURCE_GROUP, check_token

KIND = RESOURCE_GROUP
DEFAULT_GROUP = "default"  # a session's group unless it names one: always known


class _Users(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    users: ev.GroupUsers


class _Description(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    description: ev.Description


class ResourceGroup(BaseAggregate[str]):
    KIND = KIND

    if TYPE_CHECKING:  # set by the events
        users: list[str]
        public: bool
        description: str
        removed: bool
        reason: str

    @staticmethod
    def set(
        existing: ResourceGroup | None,
        *,
        name: str,
        users: Sequence[str] = (),
        public: bool = False,
        description: str = "",
        reason: str = "set-by-admin",
    ) -> ResourceGroup:
        """Define the group, or replace the definition of ``existing`` (also a removed one)."""
        fields = {
            **checked(users, public, description),
            "reason": require_text(reason, "reason"),
        }
        if existing is None:
            return ResourceGroup._create(ev.ResourceGroupSet, id=check_name(name), **fields)
        if (
            not existing.removed
            and existing.users == fields["users"]
            and existing.public == fields["public"]
            and existing.description == fields["description"]
        ):
            return existing  # the same definition again: nothing new to record
        existing.trigger_event(ev.ResourceGroupSet, originator_topic=_topic(), **fields)
        return existing

    def remove(self, reason: str = "removed-by-admin") -> None:
        require_text(reason, "reason")
        if self.removed:
            raise Conflict("name", f"resource group {self.id!r} is already removed")
        self.trigger_event(ev.ResourceGroupRemoved, reason=reason)

    @property
    def defined(self) -> bool:
        """Whether its rule applies (set and not removed)."""
        return not self.removed

    def admits(self, owner: str) -> bool:
        """Whether ``owner`` may create sessions in this group (a removed one: everyone)."""
        return self.removed or self.public or owner in self.users

    # --- state changes (Event.apply calls WHEN) ---------------------------------------------

    def _on_set(self, e: ev.ResourceGroupSet) -> None:
        self.users = list(e.users)
        self.public = e.public
        self.description = e.description
        self.removed = False
        self.reason = e.reason

    def _on_removed(self, e: ev.ResourceGroupRemoved) -> None:
        self.removed = True
        self.reason = e.reason

    WHEN = {
        ev.ResourceGroupSet: _on_set,
        ev.ResourceGroupRemoved: _on_removed,
    }


def _topic() -> str:
    from eventsourcing.utils import get_topic

    return get_topic(ResourceGroup)


def checked(users: Iterable[str], public: bool, description: str) -> dict[str, object]:
    """The fields as ResourceGroupSet takes them, or InvalidField naming the bad one."""
    distinct = sorted(set(users))
    try:
        msgspec.convert({"users": distinct}, _Users)
    except msgspec.ValidationError as e:
        raise InvalidField("users", str(e)) from None
    if not isinstance(public, bool):
        raise InvalidField("public", f"must be true or false, got {public!r}")
    if public and distinct:
        raise InvalidField(
            "users", "a public group is open to every user: give users or public, not both"
        )
    try:
        msgspec.convert({"description": description}, _Description)
    except msgspec.ValidationError as e:
        raise InvalidField("description", str(e)) from None
    return {"users": distinct, "public": public, "description": description}


def check_name(name: str) -> str:
    """A group name: a subject token, as agents' ``--resource-group``."""
    return check_token(name, "name")  # InvalidField naming it


# --- the access rule -------------------------------------------------------------------------


def check_known(group: str, groups: Mapping[str, ResourceGroup], joined: Iterable[str]) -> None:
    """InvalidField naming ``resource_group`` when ``group`` is none an admin defined (and did
    not remove), none an agent ever ``joined`` (live or lost) and not ``default``: a misspelt
    name, refused at create with the nearest known names rather than waiting for ever."""
    known = {DEFAULT_GROUP, *joined} | {name for name, g in groups.items() if g.defined}
    if group in known:
        return
    near = sorted(difflib.get_close_matches(group, known, n=3))
    hint = f"did you mean {' or '.join(repr(n) for n in near)}? " if near else ""
    raise InvalidField(
        "resource_group",
        f"no resource group {group!r} is known (no admin defined it and no agent joined it);"
        f" {hint}`hoist group list` shows them",
    )


def may_use(owner: str, group: str, groups: Mapping[str, ResourceGroup]) -> bool:
    """Whether ``owner`` may create a session in ``group``: a group no live definition names is
    open to everyone; a defined one to its users, or everyone if public."""
    defined = groups.get(group)
    return defined is None or defined.admits(owner)


def usable(owner: str, groups: Mapping[str, ResourceGroup], known: Iterable[str]) -> list[str]:
    """The groups among ``known`` and the defined ones that ``owner`` may use, sorted."""
    names = set(known) | {name for name, g in groups.items() if g.defined}
    return sorted(name for name in names if may_use(owner, name, groups))


def refusal(
    owner: str, group: str, groups: Mapping[str, ResourceGroup], known: Iterable[str]
) -> str:
    """Why ``owner`` may not use ``group``: the field, and the groups they may use."""
    allowed = usable(owner, groups, known)
    may = ", ".join(repr(g) for g in allowed) if allowed else "none with agents yet"
    return (
        f"resource_group: {owner!r} may not use resource group {group!r} (an admin defined who"
        f" may); groups {owner!r} may use: {may}, and any group no admin defined"
    )
