"""The manager's command server: every subject of domain.contracts.commands.COMMANDS over NATS
request/reply, decoded to its request struct and handed to the message bus.

Every failure answers ``{"error": {"code", "message"}}`` and changed nothing: ``invalid-request``
(the message names the field), ``not-found``, ``conflict``, ``illegal-transition``,
``forbidden``, ``unavailable`` (the event store did not take the write: retry), ``internal``;
the one responder (services.manager.responder) maps what a handler raises to them, and who may
do what on a user's subject is domain.user_scope's rule.

Per-user subjects: every ``hoist.api.<x>.<y>`` command is also served as
``hoist.api.<user>.<x>.<y>`` (when the server is given ``owner_of``), and every
``hoist.admin.<x>.<y>`` as ``hoist.admin.<user>.<x>.<y>`` for an admin user.  Only that user's
NATS user may publish there (services.stack.natsauth), so the owner comes from the
subject's ``<user>`` token, never from the payload: a payload ``owner`` that differs is refused
``forbidden`` naming ``owner`` (left out, it is filled in); a ``session_id`` of another user's
session, and a ``stream_id`` this manager did not open for that user, are ``not-found``, with
the same message as an id that does not exist.  The ``<user>`` must be an enabled Hoist user
(``user_enabled``, the fleet's folded User aggregates): one never added, or disabled, is refused
``forbidden`` and nothing is done, whatever NATS let through; ``hoist.admin.<user>.`` also
needs an admin user (``user_admin``), who may name any owner, session and stream.  Who sent a
request is the ``Hoist-Actor`` of what it records (services.manager.requester).  The unscoped
``hoist.api.<x>.<y>`` stay, for the ``client`` role of a single-user local stack (any owner),
and ``hoist.admin.<x>.<y>`` for the ``admin`` role.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from domain.contracts.commands import COMMANDS
from domain.contracts.sessions import ReadStream
from domain.errors import NotFound
from domain.rpc import decode
from domain.subjects import ADMIN, API
from domain.user_scope import UserScope
from services.manager.bus import MessageBus
from services.manager.open_streams import OpenStreams
from services.manager.requester import set_requester
from services.manager.responder import manager_responder
from transport.client import Client
from transport.connection import subscriptions_ready, unsubscribe_all
from transport.responder import Route
from transport.tasks import Tasks

log = logging.getLogger(__name__)


QUEUE = "hoist-manager"
_API = f"{API}."
_ADMIN = f"{ADMIN}."


class CommandServer:
    def __init__(
        self,
        nc: Client,
        bus: MessageBus,
        owner_of: Callable[[str], str | None] | None = None,
        user_enabled: Callable[[str], bool] | None = None,
        user_admin: Callable[[str], bool] | None = None,
        streams: OpenStreams | None = None,
        leader_only: frozenset[type] = frozenset(),
    ) -> None:
        self.nc = nc
        self.bus = bus
        served = set(bus.command_types())
        self.commands = {s: cls for s, cls in COMMANDS.items() if cls in served}
        self.owner_of = owner_of  # session id -> its owner (None: no such session)
        self.user_enabled = user_enabled  # None: every user token is taken as is
        self.user_admin = user_admin  # None: no user is an admin
        # what logs and exec opened, for whose session (the Quotas part records them)
        self.streams = streams or OpenStreams()
        self._subs: list[Subscription] = []
        # Commands whose state lives in the leading manager's memory (the streams logs and
        # exec opened, preload jobs, agent sync): served only while this manager leads.
        self.leader_only = leader_only
        self._leader_subs: list[Subscription] = []
        self._tasks = Tasks()
        self.responder = manager_responder(log, "command")

    def scoped_subjects(self) -> list[str]:
        """``hoist.api.*.<x>.<y>`` for each served ``hoist.api.<x>.<y>``, and so for
        ``hoist.admin.``."""
        if self.owner_of is None:
            return []
        return [
            f"{prefix}*.{s[len(prefix) :]}"
            for s in self.commands
            for prefix in (_API, _ADMIN)
            if s.startswith(prefix)
        ]

    async def start(self) -> None:
        """Serve every command but the leader's (``lead`` adds those)."""
        await self._subscribe(self._subs, leader=False)

    async def lead(self) -> None:
        if not self._leader_subs:
            await self._subscribe(self._leader_subs, leader=True)

    async def follow(self) -> None:
        await unsubscribe_all(self._leader_subs)
        self._leader_subs.clear()

    async def _subscribe(self, subs: list[Subscription], *, leader: bool) -> None:
        for subject in [*self.commands, *self.scoped_subjects()]:
            if (self.commands[self._unscoped(subject)[1]] in self.leader_only) != leader:
                continue
            # One queue group: with several managers, each request is served by one of them.
            subs.append(await self.nc.subscribe(subject, queue=QUEUE, cb=self._on_msg))
        await subscriptions_ready(self.nc)

    async def stop(self) -> None:
        await unsubscribe_all(self._subs + self._leader_subs)
        self._subs.clear()
        self._leader_subs.clear()
        await self._tasks.stop()

    async def _on_msg(self, msg: Msg) -> None:
        # One task per request: a create waiting for max_wait must not hold up the others.
        self._tasks.spawn(self._serve(msg), msg.subject)

    async def _serve(self, msg: Msg) -> None:
        user, subject = self._unscoped(msg.subject)
        if not self.responder.answerable(msg, user):
            return
        cls = self.commands.get(subject)
        if cls is None:
            # Not a request: a JetStream delivery keeps its stream subject (a consumer aimed
            # at a command subject; readers may create none, see natsauth). Nothing to answer.
            log.warning("ignored a message on %s: not a command", msg.subject)
            return
        if user is None:
            set_requester("admin" if subject.startswith(_ADMIN) else "client")
            await self.responder.serve(msg, Route(cls, self.bus.handle))
        else:
            set_requester(user)
            admin = subject.startswith(_ADMIN)
            await self.responder.reply(msg, lambda: self._serve_user(user, msg, cls, admin))

    def _unscoped(self, subject: str) -> tuple[str | None, str]:
        """(user, the unscoped subject) of ``hoist.api.<user>.<x>.<y>`` and
        ``hoist.admin.<user>.<x>.<y>``; (None, subject) for any other subject."""
        if self.owner_of is None or subject in self.commands:
            return None, subject
        for prefix in (_API, _ADMIN):
            if subject.startswith(prefix):
                user, _, rest = subject[len(prefix) :].partition(".")
                return user, prefix + rest
        return None, subject

    async def _serve_user(self, user: str, msg: Msg, cls: type[msgspec.Struct], admin: bool) -> Any:
        """One request on ``user``'s own subject (``admin``: an admin command's): the owner is
        ``user``, the sessions and streams it names must be ``user``'s; an admin user may name
        any owner, session and stream, as the admin role may."""
        enabled = self.user_enabled is None or self.user_enabled(user)
        scope = UserScope.of(
            user, enabled=enabled, admin=bool(self.user_admin and self.user_admin(user))
        )
        if admin:
            scope.require_admin(f"; {msg.subject} is admin's")
        if scope.admin:  # an owner filter left out is every owner's; a required owner, theirs
            data = _owner_filled(msg.data, user, cls) if _owner_required(cls) else msg.data
            return await self.bus.handle(decode(data, cls, what=msg.subject))
        req = decode(_owner_filled(msg.data, user, cls), cls, what=msg.subject)
        scope.owner(getattr(req, "owner", None), msg.subject)
        session_id = getattr(req, "session_id", None)
        assert self.owner_of is not None
        if isinstance(session_id, str):
            scope.session(session_id, self.owner_of(session_id))
        if isinstance(req, ReadStream):
            opened = self.streams.get(req.agent_id, req.stream_id)
            if not scope.sees(opened and opened.owner):
                raise NotFound(
                    "stream_id",
                    f"no stream {req.stream_id!r} on agent {req.agent_id!r}; open"
                    " one with session logs or exec",
                )
        return await self.bus.handle(req)


def _owner_required(cls: type[msgspec.Struct]) -> bool:
    return any(f.name == "owner" and f.required for f in msgspec.structs.fields(cls))


def _owner_filled(data: bytes, user: str, cls: type[msgspec.Struct]) -> bytes:
    """A request on ``user``'s subject: ``owner`` left out is ``user``."""
    if "owner" not in cls.__struct_fields__:
        return data
    try:
        payload = msgspec.json.decode(data or b"{}")
    except msgspec.DecodeError:
        return data  # decode() says what is wrong
    if not isinstance(payload, dict) or payload.get("owner") is not None:
        return data
    return msgspec.json.encode({**payload, "owner": user})
