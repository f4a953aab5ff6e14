"""The one way a Hoist process answers NATS requests: inbox check → decode the request into its
msgspec type → call the handler → map what it raised through one error table → reply.

Every failure is answered ``{"error": {"code", "message"}}`` (domain.rpc.ErrorReply) and means
nothing changed.  Handlers raise domain errors or the wire RequestError; the error table says
which code each becomes.  Anything else is a bug: it is answered ``internal`` with a generic
text and logged with its traceback, since an exception's text may show any internals (a path, a
query, another user's name) to whoever asked.

A server that decodes by a type serves each message with its ``Route`` (request type,
handler); one that decodes by more (the agent: a verb's type, then canonical image names)
hands ``Responder.reply`` its own call.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from nats.aio.msg import Msg

from domain.errors import (
    Conflict,
    Forbidden,
    IllegalTransition,
    InvalidField,
    NotFound,
    NotNow,
)
from domain.limits import quote
from domain.rpc import ErrorReply, RequestError, decode, encode_reply
from domain.subjects import REQUEST_INFO, is_import_reply, is_inbox, is_inbox_of

Req = TypeVar("Req")

# One row: the exceptions it catches, and the wire error each becomes.
ErrorRow = tuple[tuple[type[BaseException], ...], Callable[[Any], RequestError]]

ERRORS: tuple[ErrorRow, ...] = (
    ((RequestError,), lambda e: e),
    ((InvalidField,), lambda e: RequestError("invalid-request", str(e))),
    ((IllegalTransition, NotNow), lambda e: RequestError("illegal-transition", str(e))),
    ((Forbidden,), lambda e: RequestError("forbidden", str(e))),
    ((NotFound,), lambda e: RequestError("not-found", str(e))),
    ((Conflict,), lambda e: RequestError("conflict", str(e))),
)


def requester(msg: Msg) -> str | None:
    """The NATS user who sent ``msg`` through an account's service import, as nats-server
    recorded it in the ``Nats-Request-Info`` header (it replaces any the sender set)."""
    raw = (msg.headers or {}).get(REQUEST_INFO)
    if not raw:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    user = info.get("user") if isinstance(info, dict) else None
    return user if isinstance(user, str) else None


@dataclass(frozen=True)
class Route(Generic[Req]):
    """One verb: the type its request decodes to, and the handler that answers it."""

    request: type[Req]
    handle: Callable[[Req], Awaitable[object]]


class Responder:
    """Answers requests for the process ``process`` (named in the generic internal reply),
    logging unexpected failures to ``log`` as "<kind> request on <subject> failed"; ``errors``
    is the error table, first matching row wins (a process adds the rows of the layers above
    the transport, e.g. the event store's, in front of ``ERRORS``).

    ``detail``: the internal reply also says what failed (the verb, the exception's type and
    text), for a server whose only requester is trusted and shows it on: the agent, whose
    failures the manager turns into a kernel's status_info."""

    def __init__(
        self,
        process: str,
        log: logging.Logger,
        kind: str,
        errors: Sequence[ErrorRow] = ERRORS,
        *,
        detail: bool = False,
    ) -> None:
        self.log = log
        self.kind = kind
        self.errors = tuple(errors)
        self.detail = detail
        self.internal = f"internal error; see the {process}'s log"

    def answerable(self, msg: Msg, user: str | None = None) -> bool:
        """Whether ``msg`` may be answered where it asks: a reply subject is the requester's to
        choose, so only inboxes (or nats-server's stand-in for the reply of a request from
        another account, which leads back there); on a user's own subject (``user``), only that
        user's (through an import: only a request nats-server says ``user`` sent)."""
        if user is None and (is_inbox(msg.reply) or is_import_reply(msg.reply)):
            return True
        if user is not None and is_inbox_of(msg.reply, user):
            return True
        if user is not None and is_import_reply(msg.reply) and requester(msg) == user:
            return True  # from the readers' account: nats-server names who asked
        self.log.debug("ignored a request on %s: its reply %s is no inbox", msg.subject, msg.reply)
        return False

    async def serve(self, msg: Msg, route: Route[Any], *, user: str | None = None) -> None:
        """Answer ``msg`` with ``route``: its payload decoded (an empty one as ``{}``), handled,
        and replied, or the error reply; nothing is answered on a reply subject that is no
        inbox (of ``user``, on a user's own subject)."""
        if self.answerable(msg, user):
            await self.reply(msg, lambda: route.handle(self.decode(msg, route.request)))

    @staticmethod
    def decode(msg: Msg, request: type[Req]) -> Req:
        """``msg``'s payload as ``request``, or RequestError("invalid-request") naming the field
        (an empty payload, or only blanks, is ``{}``)."""
        return decode(msg.data if msg.data.strip() else b"{}", request, what=msg.subject)

    async def reply(self, msg: Msg, call: Callable[[], Awaitable[object]]) -> None:
        """Reply to ``msg`` with what ``call`` returns, or the error reply for what it raises:
        for a server that must decode by more than a type (the inbox checked already)."""
        await msg.respond(encode_reply(await self.answer(msg.subject, call)))

    async def answer(self, subject: str, call: Callable[[], Awaitable[object]]) -> object:
        try:
            return await call()
        except Exception as e:
            return self.error_reply(e, subject)

    def error_reply(self, error: Exception, subject: str) -> ErrorReply:
        """The wire error of ``error`` by the table; ``internal``, logged, for anything else."""
        for types, wire in self.errors:
            if isinstance(error, types):
                return wire(error).reply()
        self.log.error("%s request on %s failed", self.kind, subject, exc_info=error)
        if self.detail:
            verb = subject.rsplit(".", 1)[-1]
            what = f"{verb} failed: {type(error).__name__}: {quote(str(error))}"
            return RequestError("internal", what).reply()
        return RequestError("internal", self.internal).reply()
