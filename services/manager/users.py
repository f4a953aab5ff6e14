"""Hoist users on the manager: the admin's commands ``hoist.admin.user.add``, ``.disable``,
``.list`` (domain.contracts.users).  Each records an event on ``hoist.events.user.<name>``; the
user's NATS user (what lets them connect) is written into the stack's auth config by whoever
runs the stack's nats-server (``hoist user add`` on a local stack, services.stack.natsauth),
not by the manager, which may run elsewhere."""

from __future__ import annotations

from typing import Any

from domain.contracts.users import AddUser, DisableUser, ListUsers, user_view
from domain.errors import NotFound
from domain.subjects import USER
from domain.user import User, check_name
from services.manager.fleet import Fleet
from services.manager.requester import requester
from services.manager.uow import UnitOfWork


class Users:
    def __init__(self, fleet: Fleet, uow: UnitOfWork) -> None:
        self.fleet = fleet
        self.uow = uow

    async def add(self, req: AddUser) -> dict[str, Any]:
        existing = self.fleet.users.get(req.name)
        user, recorded = await self.uow.admin(
            USER,
            req.name,
            lambda u: User.add(u, name=req.name, admin=req.admin, by=requester("admin")),
        )
        # ``before``: so a client says added, enabled again or changed, not "added" for all
        before = None if existing is None else user_view(existing)
        return {"user": user_view(user), "recorded": recorded, "before": before}

    async def disable(self, req: DisableUser) -> dict[str, Any]:
        check_name(req.name)  # a role's name is said to be one, not "no user"

        def disable(user: User | None) -> User:
            if user is None:
                raise NotFound("name", f"no user {req.name!r}; `hoist user list` shows them")
            user.disable(by=requester("admin"))
            return user

        user, recorded = await self.uow.admin(USER, req.name, disable)
        return {"user": user_view(user), "recorded": recorded}

    async def list(self, req: ListUsers) -> dict[str, Any]:
        return {"users": [user_view(u) for _, u in sorted(self.fleet.users.items())]}
