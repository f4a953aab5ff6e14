"""Hoist users on the manager: the admin's commands ``hoist.admin.user.add``, ``.disable``,
``.list`` (domain.contracts.users).  Each records an event on ``hoist.events.user.<name>``; the
user's NATS user (what lets them connect) is written into the stack's auth config by whoever
runs the stack's nats-server (``hoist user add`` on a local stack, services.stack.natsauth),
not by the manager, which may run elsewhere."""

from __future__ import annotations

import copy
from typing import Any

from domain.contracts.users import AddUser, DisableUser, ListUsers, user_view
from domain.errors import InvalidField
from domain.rpc import RequestError
from domain.subjects import USER
from domain.user import User
from eventstore.repository import Repository
from services.manager.fleet import Fleet
from services.manager.requester import requester


class Users:
    def __init__(self, fleet: Fleet, repository: Repository) -> None:
        self.fleet = fleet
        self.repository = repository

    async def add(self, req: AddUser) -> dict[str, Any]:
        existing = self.fleet.users.get(req.name)
        try:
            user = User.add(
                None if existing is None else copy.deepcopy(existing),
                name=req.name,
                admin=req.admin,
                by=requester("admin"),
            )
        except InvalidField as e:
            raise RequestError("invalid-request", str(e)) from None
        recorded = bool(user.pending_events)
        if recorded:
            await self._save(user)
        # ``before``: so a client says added, enabled again or changed, not "added" for all
        before = None if existing is None else user_view(existing)
        return {"user": user_view(user), "recorded": recorded, "before": before}

    async def disable(self, req: DisableUser) -> dict[str, Any]:
        existing = self.fleet.users.get(req.name)
        if existing is None:
            raise RequestError(
                "not-found", f"name: no user {req.name!r}; `hoist user list` shows them"
            )
        user = await self.fleet.change_admin(
            existing, USER, "user", lambda u: u.disable(by=requester("admin"))
        )
        return {"user": user_view(user), "recorded": True}

    async def list(self, req: ListUsers) -> dict[str, Any]:
        return {"users": [user_view(u) for _, u in sorted(self.fleet.users.items())]}

    async def _save(self, user: User) -> None:
        await self.fleet.save_admin(user, USER, "user")
