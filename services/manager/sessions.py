"""The session commands' handlers: ``hoist.api.session.create``, ``.get``, ``.destroy`` and the
superadmin's ``hoist.admin.kernel.cancel`` (domain.contracts.sessions says what each takes and
answers; services.manager.server serves them).  Each gets the session, calls its aggregate and
saves through the unit of work.  A create is refused before anything is appended when its
resource group is unknown (``invalid-request``: no admin defined it and no agent ever joined it,
domain.resource_group.check_known), its owner may not use its resource group (``forbidden``,
domain.resource_group), it could never fit its owner's resource policy (``invalid-request``,
domain.quota), or the live agents of its group could not hold it even when idle
(``invalid-request`` naming the largest agent, domain.scheduling.never_holds; a known group
with no live agent yet is waited for).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from domain.contracts.sessions import (
    CancelKernel,
    CreateSession,
    DestroySession,
    GetSession,
    SessionCreated,
    SessionView,
    created_view,
    session_id_for,
    session_view,
)
from domain.errors import Conflict, Forbidden, InvalidField, NotFound, unknown_kernel
from domain.hooks import session_info
from domain.image_ref import canonical_or_same
from domain.quota import effective, never_fits
from domain.resource_group import check_known, may_use, refusal
from domain.session import Session
from services.manager.bus import LookAgain
from services.manager.fleet import Fleet
from services.manager.hooks import Hooks, noted
from services.manager.requester import requester
from services.manager.uow import SessionUnknown, UnitOfWork


class SessionCommands:
    """The handlers of the session commands: get, call the aggregate, save (the unit of work)."""

    def __init__(self, fleet: Fleet, uow: UnitOfWork, hooks: Hooks | None = None) -> None:
        self.fleet = fleet
        self.uow = uow
        self.hooks = hooks or Hooks()
        # Held from a named create's check to its append: two creates of one name in this
        # manager cannot both find it free.
        self._naming = asyncio.Lock()

    async def create(self, req: CreateSession) -> SessionCreated:
        if req.request_id is not None:
            sid = session_id_for(req.owner, req.request_id)
        else:
            sid = uuid.uuid4().hex
        new = Session.enqueue(
            owner=req.owner,
            image=req.image,
            resources=req.kernel_resources(),
            resource_group=req.resource_group,
            cluster_size=req.cluster_size,
            request_id=req.request_id,
            session_id=sid,
            session_type=req.session_type,
            cluster_mode=req.cluster_mode,
            spec=req.spec(),
            name=req.name,
            labels=req.labels,
        )
        groups = self.fleet.resource_groups
        check_known(new.resource_group, groups, self.fleet.agent_groups())
        if not may_use(req.owner, new.resource_group, groups):  # may this owner use the group?
            raise Forbidden(
                refusal(req.owner, new.resource_group, groups, self.fleet.agent_groups())
            )
        policy = effective(req.owner, self.fleet.resource_policies)
        never = policy and never_fits(policy.quota, new.resources, req.cluster_size)
        if policy is not None and never:
            field, why = never
            raise InvalidField(
                field, f"{why} (resource policy {policy.id!r}): this session could never start"
            )
        # The live agents of its group could never hold it, even idle: refused now rather than
        # PENDING for ever.  A group with no live agent yet (a stack starting) waits for them.
        never = self.fleet.never_holds(
            new.resources, req.cluster_size, new.cluster_mode, new.resource_group
        )
        if never is not None:
            field, why = never
            # A resource no agent offers is not asked for "less" (domain.scheduling's wording)
            if why.endswith(f" offers {field.removeprefix('resources.')}"):
                advice = f"leave {field} out, or use a resource group whose agents offer it"
            else:
                advice = "ask for less, or use a resource group with bigger agents"
            raise InvalidField(
                field,
                f"{why}: this session could never start; {advice} (hoist agents lists them)",
            )
        if sid not in self.fleet.sessions:  # not a retry of a create that was stored
            refused, skipped = await self.hooks.enqueue(session_info(new))
            if refused is not None:
                raise Forbidden(refused)
            noted("enqueue", skipped)(new)  # in the create's own append
        # Not the store's idempotency key: a retried append would come back with the
        # original's sequences while we hold other kernel ids. The derived session id and
        # "subject must be empty" make the retry a conflict instead, and we get what the first
        # attempt stored.
        async with self._naming if req.name is not None else contextlib.nullcontext():
            if req.name is not None and sid not in self.fleet.sessions:
                self._name_free(req.owner, req.name)
            stored = await self.uow.add(new, actor=requester("client"))
        if stored is not new:
            _same_request(stored, req)
        await self.fleet.wait_settled(sid, req.max_wait)
        return created_view(await self._committed(sid), created=stored is new)

    def _name_free(self, owner: str, name: str) -> None:
        """Conflict naming the session that holds ``name`` among the owner's that have not
        ended (a name is free again once its session ends)."""
        holders = self.fleet.session_names.get((owner, name))
        if holders:
            holder = ", ".join(sorted(holders))
            raise Conflict(
                "name",
                f"{name!r} is the name of session {holder}, which has not ended: destroy it"
                f" (hoist destroy {name}) or choose another name",
            )

    async def get(self, req: GetSession) -> SessionView:
        return await self._view(req.session_id)

    async def destroy(self, req: DestroySession) -> SessionView:
        async with self.uow.session(req.session_id, actor=requester("client")) as session:
            session.destroy(req.forced)
        self.uow.publish(LookAgain(req.session_id))  # asked again: its worker looks again too
        return await self._view(req.session_id)

    async def cancel_kernel(self, req: CancelKernel) -> SessionView:
        sid = self.fleet.kernel_session.get(req.kernel_id)
        if sid is None:
            raise NotFound("kernel_id", unknown_kernel(req.kernel_id))
        async with self.uow.session(sid, actor=requester("admin")) as session:
            session.force_cancel(req.kernel_id, req.reason)
        self.uow.publish(LookAgain(sid))
        return await self._view(sid)

    async def _view(self, session_id: str) -> SessionView:
        return session_view(await self._committed(session_id))

    async def _committed(self, session_id: str) -> Session:
        """What the log holds of the session (never a change still being saved)."""
        session = await self.fleet.committed(session_id)
        if session is None:
            raise SessionUnknown(session_id)
        return session


def _same_request(session: Session, req: CreateSession) -> None:
    asked: dict[str, Any] = {
        "image": canonical_or_same(req.image),  # a retry may name it another way
        "resources": req.kernel_resources(),
        "cluster_size": req.cluster_size,
        "resource_group": req.resource_group,
        "session_type": req.session_type,
        "cluster_mode": req.cluster_mode,
        "spec": req.spec(),
        "name": req.name,
        "labels": req.labels,
    }
    have: dict[str, Any] = {
        "image": session.image,
        "resources": session.resources,
        "cluster_size": len(session.kernels),
        "resource_group": session.resource_group,
        "session_type": session.session_type,
        "cluster_mode": session.cluster_mode,
        "spec": session.spec,
        "name": session.name,
        "labels": session.labels,
    }
    differs = [name for name in asked if asked[name] != have[name]]
    if differs:
        raise Conflict(
            "request_id",
            f"{req.request_id!r} already created session {session.id} with other"
            f" {', '.join(differs)}; use a new request_id for a new session",
        )
