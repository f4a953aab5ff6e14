"""Hoist users: the admin's commands (served by services.manager.users).

- ``hoist.admin.user.add {name, admin}`` records UserAdded (a new user, or a disabled one
  enabled again, or ``admin`` changed; ``admin`` left out: false for a new user, unchanged for
  one added before) and answers ``{"user": {...}, "recorded": bool}`` (false:
  the user is already enabled with that ``admin``, nothing appended);
- ``hoist.admin.user.disable {name}`` records UserDisabled: ``{"user": {...}, "recorded":
  true}``; ``not-found`` when no user has that name, ``conflict`` when already disabled;
- ``hoist.admin.user.list {}`` -> ``{"users": [...]}``, every user ever added (disabled ones
  too), sorted by name.
A user is ``{"name", "admin", "enabled", "by"}`` (``by``: who added or disabled them last).
``name`` is a subject token that is no role's NATS user (domain.user).
"""

from __future__ import annotations

from typing import Any

import msgspec

from domain.contracts.common import NoRequest
from domain.limits import Id
from domain.user import User


class AddUser(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Id  # hoist.events.user.<name>
    admin: bool | None = None  # None: a new user is no admin, an existing one keeps theirs


class DisableUser(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Id


class ListUsers(NoRequest, frozen=True, kw_only=True):
    """``{}`` -> ``{"users": [...]}``."""


def user_view(user: User) -> dict[str, Any]:
    return {"name": user.id, "admin": user.admin, "enabled": user.enabled, "by": user.by}
