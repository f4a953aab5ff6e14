"""The manager's session command handlers: NATS request/reply, JSON in and out.

Subjects (domain.subjects) and payloads (domain.contracts.sessions, which says what each takes
and answers): ``hoist.api.session.create``, ``.get``, ``.destroy`` and the superadmin's
``hoist.admin.kernel.cancel``.  Every failure is ``{"error": {"code", "message"}}`` and changed
nothing.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from domain.contracts.sessions import (
    CancelKernel,
    CreateSession,
    DestroySession,
    GetSession,
    SessionView,
    session_id_for,
    session_view,
)
from domain.errors import InvalidField
from domain.limits import quote
from domain.rpc import RequestError, decode, encode_reply
from domain.session import Session
from domain.status import PRE_RUNNING, KernelStatus
from domain.subjects import KERNEL_CANCEL, SESSION_CREATE, SESSION_DESTROY, SESSION_GET, is_inbox
from services.eventstore.store import ConcurrencyError, StoreError
from services.manager.fleet import Fleet
from services.manager.reactors import Reactors
from services.transport.client import Client
from services.transport.connection import subscriptions_ready

log = logging.getLogger(__name__)

S = KernelStatus


class Api:
    def __init__(
        self, nc: Client, fleet: Fleet, reactors: Reactors, on_enqueued: Callable[[], None]
    ) -> None:
        self.nc = nc
        self.fleet = fleet
        self.reactors = reactors
        self.on_enqueued = on_enqueued
        self._subs: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers: dict[str, Callable[[bytes], Awaitable[object]]] = {
            SESSION_CREATE: self.create,
            SESSION_GET: self.get,
            SESSION_DESTROY: self.destroy,
            KERNEL_CANCEL: self.cancel_kernel,
        }

    def register(self, subject: str, handler: Callable[[bytes], Awaitable[object]]) -> None:
        """Serve one more subject with the same error replies (call before start)."""
        self._handlers[subject] = handler

    async def start(self) -> None:
        for subject in self._handlers:
            self._subs.append(await self.nc.subscribe(subject, cb=self._on_msg))
        await subscriptions_ready(self.nc)

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _on_msg(self, msg: Msg) -> None:
        # One task per request: a create waiting for max_wait must not hold up the others.
        task = asyncio.create_task(self._serve(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, msg: Msg) -> None:
        if not is_inbox(msg.reply):
            log.debug("ignored a request on %s: its reply %s is no inbox", msg.subject, msg.reply)
            return
        handler = self._handlers.get(msg.subject)
        if handler is None:
            # Not a request: a JetStream delivery keeps its stream subject (a consumer aimed
            # at a command subject; readers may create none, see natsauth). Nothing to answer.
            log.warning("ignored a message on %s: not a command", msg.subject)
            return
        reply: object
        try:
            reply = await handler(msg.data)
        except RequestError as e:
            reply = e.reply()
        except InvalidField as e:
            reply = RequestError("invalid-request", str(e)).reply()
        except (StoreError, ConcurrencyError) as e:
            reply = RequestError("unavailable", f"{e}; retry the request").reply()
        except Exception as e:
            log.exception("%s", msg.subject)
            message = f"{type(e).__name__}: {quote(str(e))}; see the manager log"
            reply = RequestError("internal", message).reply()
        await msg.respond(encode_reply(reply))

    # -- handlers ------------------------------------------------------------------------

    async def create(self, data: bytes) -> SessionView:
        req = decode(data, CreateSession, what=SESSION_CREATE)
        if req.request_id is not None:
            sid = session_id_for(req.owner, req.request_id)
        else:
            sid = uuid.uuid4().hex
        async with self.fleet.locked(sid) as existing:
            if existing is not None:
                _same_request(existing, req)
            else:
                try:
                    session = Session.enqueue(
                        owner=req.owner,
                        image=req.image,
                        resources=req.resources,
                        resource_group=req.resource_group,
                        cluster_size=req.cluster_size,
                        request_id=req.request_id,
                        session_id=sid,
                    )
                except ValueError as e:  # InvalidField, or a resource_group unfit for subjects
                    raise RequestError("invalid-request", str(e)) from None
                # Not the store's idempotency key: a retried append would come back with the
                # original's sequences while we hold other kernel ids. The derived session id
                # and "subject must be empty" make the retry a conflict instead, and we load
                # what the first attempt stored.
                if (
                    not await self.fleet.commit(session, actor="client")
                    and sid not in self.fleet.sessions
                ):
                    raise RequestError("unavailable", "the event store did not take it; retry")
        self.on_enqueued()
        await self.fleet.wait_settled(sid, req.max_wait)
        return await self._view(sid)

    async def get(self, data: bytes) -> SessionView:
        req = decode(data, GetSession, what=SESSION_GET)
        return await self._view(req.session_id)

    async def destroy(self, data: bytes) -> SessionView:
        req = decode(data, DestroySession, what=SESSION_DESTROY)
        self._session(req.session_id)

        def decide(s: Session) -> None:
            for k in s.kernels.values():
                if k.status in PRE_RUNNING:
                    s.cancel(k.kernel_id, "user-requested")
                elif k.status is S.RUNNING:
                    s.mark_terminating(k.kernel_id, "user-requested")
                if req.forced and k.status is S.TERMINATING:
                    s.mark_terminated(
                        k.kernel_id, "force-terminated", "forced: not confirmed by the agent"
                    )
                    self.reactors.force_destroy.add(k.kernel_id)

        await self._record(req.session_id, decide, actor="client")
        return await self._view(req.session_id)

    async def cancel_kernel(self, data: bytes) -> SessionView:
        req = decode(data, CancelKernel, what=KERNEL_CANCEL)
        sid = self.fleet.kernel_session.get(req.kernel_id)
        if sid is None:
            raise RequestError(
                "not-found", f"kernel_id: no kernel {req.kernel_id!r}; look it up in the session"
            )

        def decide(s: Session) -> None:
            k = s.kernels[req.kernel_id]
            if k.status not in PRE_RUNNING:
                raise RequestError(
                    "illegal-transition",
                    f"kernel_id: kernel {req.kernel_id} is {k.status} ({k.status_info}), only a"
                    " kernel not running yet can be force-cancelled; destroy the session instead",
                )
            s.cancel(req.kernel_id, f"force-cancelled: {req.reason or 'by a superadmin'}")

        await self._record(sid, decide, actor="admin")
        return await self._view(sid)

    # -- helpers -------------------------------------------------------------------------

    async def _view(self, session_id: str) -> SessionView:
        """What the log holds of the session (never a change still being saved)."""
        session = await self.fleet.committed(session_id)
        if session is None:
            raise RequestError("not-found", f"session_id: no session {session_id!r}; check the id")
        return session_view(session)

    def _session(self, session_id: str) -> Session:
        session = self.fleet.sessions.get(session_id)
        if session is None:
            raise RequestError("not-found", f"session_id: no session {session_id!r}; check the id")
        return session

    async def _record(self, session_id: str, decide: Callable[[Session], None], actor: str) -> None:
        for _ in range(5):
            async with self.fleet.locked(session_id) as session:
                assert session is not None
                decide(session)
                if not session.pending_events or await self.fleet.commit(session, actor=actor):
                    break
        else:
            raise RequestError("unavailable", "the session kept changing; retry")
        self.reactors.kick(session_id)


def _same_request(session: Session, req: CreateSession) -> None:
    asked: dict[str, Any] = {
        "image": req.image,
        "resources": req.resources,
        "cluster_size": req.cluster_size,
        "resource_group": req.resource_group,
    }
    have: dict[str, Any] = {
        "image": session.image,
        "resources": session.resources,
        "cluster_size": len(session.kernels),
        "resource_group": session.resource_group,
    }
    differs = [name for name in asked if asked[name] != have[name]]
    if differs:
        raise RequestError(
            "conflict",
            f"request_id: {req.request_id!r} already created session {session.id} with other"
            f" {', '.join(differs)}; use a new request_id for a new session",
        )
