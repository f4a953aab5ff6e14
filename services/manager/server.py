"""The manager's command server: every subject of domain.contracts.commands.COMMANDS over NATS
request/reply, decoded to its request struct and handed to the message bus.

Every failure answers ``{"error": {"code", "message"}}`` and changed nothing: ``invalid-request``
(the message names the field), ``not-found``, ``conflict``, ``illegal-transition``,
``unavailable`` (the event store did not take the write: retry), ``internal``.
"""

from __future__ import annotations

import logging

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from domain.contracts.commands import COMMANDS
from domain.errors import IllegalTransition, InvalidField, NotNow
from domain.limits import quote
from domain.rpc import RequestError, decode, encode_reply
from domain.subjects import is_inbox
from services.eventstore.store import ConcurrencyError, StoreError
from services.manager.bus import MessageBus
from services.manager.uow import SessionUnknown
from services.transport.client import Client
from services.transport.connection import subscriptions_ready, unsubscribe_all
from services.transport.tasks import Tasks

log = logging.getLogger(__name__)


class CommandServer:
    def __init__(self, nc: Client, bus: MessageBus) -> None:
        self.nc = nc
        self.bus = bus
        served = set(bus.command_types())
        self.commands = {s: cls for s, cls in COMMANDS.items() if cls in served}
        self._subs: list[Subscription] = []
        self._tasks = Tasks()

    async def start(self) -> None:
        for subject in self.commands:
            self._subs.append(await self.nc.subscribe(subject, cb=self._on_msg))
        await subscriptions_ready(self.nc)

    async def stop(self) -> None:
        await unsubscribe_all(self._subs)
        self._subs.clear()
        await self._tasks.stop()

    async def _on_msg(self, msg: Msg) -> None:
        # One task per request: a create waiting for max_wait must not hold up the others.
        self._tasks.spawn(self._serve(msg), msg.subject)

    async def _serve(self, msg: Msg) -> None:
        if not is_inbox_reply(msg):
            return
        cls = self.commands.get(msg.subject)
        if cls is None:
            # Not a request: a JetStream delivery keeps its stream subject (a consumer aimed
            # at a command subject; readers may create none, see natsauth). Nothing to answer.
            log.warning("ignored a message on %s: not a command", msg.subject)
            return
        reply: object
        try:
            reply = await self.bus.handle(decode(msg.data, cls, what=msg.subject))
        except RequestError as e:
            reply = e.reply()
        except InvalidField as e:
            reply = RequestError("invalid-request", str(e)).reply()
        except (IllegalTransition, NotNow) as e:
            reply = RequestError("illegal-transition", str(e)).reply()
        except SessionUnknown as e:
            message = f"session_id: no session {e.args[0]!r}; check the id"
            reply = RequestError("not-found", message).reply()
        except (StoreError, ConcurrencyError) as e:
            reply = RequestError("unavailable", f"{e}; retry the request").reply()
        except Exception as e:
            log.exception("%s", msg.subject)
            message = f"{type(e).__name__}: {quote(str(e))}; see the manager log"
            reply = RequestError("internal", message).reply()
        await msg.respond(encode_reply(reply))


def is_inbox_reply(msg: Msg) -> bool:
    if is_inbox(msg.reply):
        return True
    log.debug("ignored a request on %s: its reply %s is no inbox", msg.subject, msg.reply)
    return False
