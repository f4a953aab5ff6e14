"""Hoist users, kept as events: who may connect, and whether as an admin.

A ``User`` aggregate (subject ``hoist.events.user.<name>``, a kind only the manager writes) is
added (``UserAdded {admin, by}``) and disabled (``UserDisabled {by}``) by admin commands; a
disabled user is enabled again by adding them again (``admin`` may change then).  Adding the
same user again with the same ``admin`` records nothing.  The name is a subject token: it names
the user's NATS user, their command subjects (``hoist.api.<name>.>``) and their reply inbox
(``_INBOX.<name>.>``), and it is the ``owner`` of their sessions.  ``by`` is who sent the
command as its subject proves it: an admin user's own ``hoist.admin.<user>.>``, else ``admin``
(the admin role's ``hoist.admin.>``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eventsourcing.domain import BaseAggregate

from domain import events as ev
from domain.errors import Conflict, InvalidField
from domain.subjects import HISTORY, QUERY_NAMES, USER, check_token

KIND = USER
# NATS users the stack itself defines (transport.credentials): no Hoist user may take
# one's name (nor ``agent-<id>``, an agent's).
RESERVED = frozenset({"manager", "client", "admin"})
# Nor the tokens that follow ``hoist.api.``, ``hoist.query.`` and ``hoist.admin.`` in the
# unscoped subjects (the client and admin roles'): user ``session`` would be granted
# ``hoist.api.session.>``, every owner's, and admin user ``quota`` the admin role's quota
# commands, recorded as the role's.
UNSCOPED = frozenset(
    {
        *("session", "stream", "volume", HISTORY, *QUERY_NAMES),
        *("image", "quota", "group", "user", "kernel", "agent", "query", "verify", "manager"),
        "dotfile",
    }
)
# ``default`` names the default resource policy and resource group: a user so named would
# read as either.
NOT_A_USER = frozenset({"default"})


class User(BaseAggregate[str]):
    KIND = KIND

    if TYPE_CHECKING:  # set by the events
        admin: bool
        disabled: bool
        by: str

    @staticmethod
    def add(existing: User | None, *, name: str, admin: bool | None = None, by: str) -> User:
        """Add the user, or enable ``existing`` again (a disabled one, or change ``admin``);
        ``admin`` None: no admin if new, as before if not (enabling one again never demotes)."""
        if admin is None:
            admin = existing is not None and existing.admin
        if not isinstance(admin, bool):
            raise InvalidField("admin", f"must be true or false, got {admin!r}")
        if existing is None:
            if name.startswith("-"):  # `hoist user add -x` reads it as an option
                raise InvalidField("name", f"must not start with '-', got {name!r}")
            return User._create(ev.UserAdded, id=check_name(name), admin=admin, by=by)
        if not existing.disabled and existing.admin == admin:
            return existing  # already so: nothing new to record
        existing.trigger_event(ev.UserAdded, originator_topic=_topic(), admin=admin, by=by)
        return existing

    def disable(self, by: str) -> None:
        if self.disabled:
            raise Conflict("name", f"user {self.id!r} is already disabled")
        self.trigger_event(ev.UserDisabled, by=by)

    @property
    def enabled(self) -> bool:
        return not self.disabled

    # --- state changes (Event.apply calls WHEN) ---------------------------------------------

    def _on_added(self, e: ev.UserAdded) -> None:
        self.admin = e.admin
        self.disabled = False
        self.by = e.by

    def _on_disabled(self, e: ev.UserDisabled) -> None:
        self.disabled = True
        self.by = e.by

    WHEN = {
        ev.UserAdded: _on_added,
        ev.UserDisabled: _on_disabled,
    }


def not_enabled(name: str) -> str:
    """Why a per-user subject of ``name`` is refused when ``name`` is no enabled user."""
    return (
        f"user {name!r} is not an enabled Hoist user; an admin adds (or enables) them with"
        " hoist user add"
    )


def _topic() -> str:
    from eventsourcing.utils import get_topic

    return get_topic(User)


def check_name(name: str) -> str:
    """A user name: a subject token that is no role's or agent's NATS user."""
    check_token(name, "name")  # InvalidField naming it
    if name in RESERVED or name.startswith("agent-"):
        raise InvalidField(
            "name", f"{name!r} is a role's NATS user (manager, client, admin, agent-<id>)"
        )
    if name in NOT_A_USER:
        raise InvalidField("name", f"{name!r} names the default resource policy and group")
    if name in UNSCOPED:
        raise InvalidField(
            "name", f"{name!r} names unscoped command or query subjects (hoist.api.{name}.>)"
        )
    return name
