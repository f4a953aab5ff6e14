"""Resource groups: the admin's commands (served by services.manager.groups).

- ``hoist.admin.group.set {name, users=[], public=false, description=""}`` records
  ResourceGroupSet (the whole definition is replaced; ``users`` and ``public`` together are
  refused; neither: nobody may use the group) and answers ``{"group": {...}, "recorded": bool}``
  (false: the same definition again, nothing appended);
- ``hoist.admin.group.remove {name}`` records ResourceGroupRemoved (the group is open to
  everyone again, as one no admin defined): ``{"group": name, "recorded": true}``;
  ``not-found`` when no live definition has that name;
- ``hoist.admin.group.list {}`` -> ``{"groups": [...]}``: every group an admin defined (removed
  ones too) and every group some agent joined, sorted by name, each
  ``{"name", "defined", "access", "users", "public", "description", "removed", "reason",
  "agents": [{"agent_id", "cpu", "mem", "slots"}], "lost_agents", "capacity": {"cpu", "mem",
  "slots"}}``: ``access`` is ``everyone`` (undefined, removed or public), ``users`` or
  ``nobody``; ``agents`` are its live agents with what each offers, ``capacity`` their sum,
  ``lost_agents`` how many of its agents are lost.
``name`` is a group name as agents join it (``hoist agent --resource-group``: letters, digits,
``_`` and ``-``); ``users`` are session owners.  domain.resource_group says how access applies.
"""

from __future__ import annotations

from typing import Any

import msgspec

from domain import events as ev
from domain.contracts.common import NoRequest
from domain.limits import Id
from domain.resource_group import ResourceGroup


class SetGroup(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Id  # hoist.events.resource-group.<name>
    users: ev.GroupUsers = []
    public: bool = False
    description: ev.Description = ""


class RemoveGroup(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Id


class ListGroups(NoRequest, frozen=True, kw_only=True):
    """``{}`` -> ``{"groups": [...]}``."""


def access_of(group: ResourceGroup | None) -> str:
    """``everyone``, ``users`` or ``nobody``: who may create sessions in the group."""
    if group is None or group.removed or group.public:
        return "everyone"
    return "users" if group.users else "nobody"


def group_view(name: str, group: ResourceGroup | None) -> dict[str, Any]:
    """A group's definition (``group`` None: one no admin defined; a removed one keeps its
    description and reason, and no longer names users)."""
    live = group is not None and not group.removed
    return {
        "name": name,
        "defined": live,
        "access": access_of(group),
        "users": list(group.users) if live and group is not None else [],
        "public": live and group is not None and group.public,
        "description": "" if group is None else group.description,
        "removed": group is not None and group.removed,
        "reason": None if group is None else group.reason,
    }
