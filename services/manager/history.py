"""``hoist.query.<user>.history``: a session's events for the Hoist user who owns it
(domain.contracts.history).  Users may not read the log itself (their NATS users have no
grant on the event stream: every session's command and env are in it), so the manager, which
knows each session's owner, reads it for them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from domain import subjects
from domain.contracts.history import (
    MAX_BYTES,
    MAX_EVENTS,
    HistoryEvent,
    HistoryPage,
    SessionHistory,
)
from domain.user_scope import UserScope
from eventstore.store import EventStore, Recorded
from services.manager.responder import manager_responder
from transport.client import Client
from transport.responder import Route
from transport.tasks import Tasks

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often a waiting request looks for a new event of its session
MAX_WAITING = 8  # requests one user may have waiting at once; more are answered at once


class History:
    def __init__(
        self,
        nc: Client,
        store: EventStore,
        owner_of: Callable[[str], str | None],
        user_enabled: Callable[[str], bool],
        user_admin: Callable[[str], bool],
    ) -> None:
        self.nc = nc
        self.store = store
        self.owner_of = owner_of
        self.user_enabled = user_enabled
        self.user_admin = user_admin
        self._waiting: Counter[str] = Counter()  # user -> their requests waiting now
        self._sub: Subscription | None = None
        self._tasks = Tasks()
        self._responder = manager_responder(log, "history")

    async def start(self) -> None:
        subject = f"{subjects.QUERY}.*.{subjects.HISTORY}"
        self._sub = await self.nc.subscribe(subject, queue="hoist-history", cb=self._on_msg)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        await self._tasks.stop()

    async def _on_msg(self, msg: Msg) -> None:
        user = msg.subject.split(".")[2]
        if self._responder.answerable(msg, user):  # answered only on the user's own inboxes
            route = Route(SessionHistory, lambda req: self.page(user, req))
            self._tasks.spawn(self._responder.serve(msg, route, user=user), msg.subject)

    async def page(self, user: str, req: SessionHistory) -> HistoryPage:
        scope = UserScope.of(user, enabled=self.user_enabled(user), admin=self.user_admin(user))
        scope.session(req.session_id, self.owner_of(req.session_id))
        subject = subjects.session_events(req.session_id)
        # Each waiting request polls the log: one user's many cannot make it do more.
        wait_s = req.wait_s if self._waiting[user] < MAX_WAITING else 0.0
        deadline = time.monotonic() + wait_s
        self._waiting[user] += 1
        try:
            while True:
                records = await self.store.read_subject(subject, after_seq=req.after_seq)
                if records or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(POLL_S)
        finally:
            self._waiting[user] -= 1
            if not self._waiting[user]:
                del self._waiting[user]
        events: list[HistoryEvent] = []
        size = 0
        for rec in records[:MAX_EVENTS]:
            event = _event(rec)
            size += len(event.data) + 200
            if events and size > MAX_BYTES:
                break
            events.append(event)
        last = records[-1].seq if records else await self.store.last_seq(subject)
        return HistoryPage(events=events, last_seq=last, more=len(events) < len(records))


def _event(rec: Recorded) -> HistoryEvent:
    return HistoryEvent(
        seq=rec.seq,
        subject=rec.subject,
        time=rec.time.isoformat(),
        headers=dict(rec.headers),
        data=rec.data.decode("utf-8", errors="replace"),
    )
