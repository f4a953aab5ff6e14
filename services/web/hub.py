"""What the web view shows, kept current from the manager's documented subjects for every page
that watches: the read-model queries (``hoist.query.<name>``, domain.contracts.queries), the
prepull plans (``hoist.admin.image.policy.plan``, an admin's), and the pull-progress stream.

One ``Hub`` per principal (the token's admin role, or one Hoist user): the queries are asked
again when the log moves (a core subscription on the event subjects wakes the refresh; a
Hoist user's connection, which may not subscribe there, has a faster timer instead), at most
``MIN_INTERVAL_S`` apart, and only while someone watches.  Each section is sent to the pages
only when it changed.  For pulls already under way when the hub started (a late joiner), the
last message the progress stream kept is fetched once (a direct get), so every bar is drawn
where it stands at once.  Nobody follows the progress while nobody watches, so when a page
comes back the pulls the hub last saw under way are read again the same way (one that ended
meanwhile leaves "in progress"), and a pull the pulls query says has ended while the hub still
holds it under way (its last message missed) is read again too.

A Hoist user's hub asks only what the manager serves them.  Whether the user is an admin is the
manager's to say, so each refresh asks their own queries and ``agents`` (fleet-wide: answered
for an admin user, refused ``forbidden`` for another) first; only when the manager answered it
are the other fleet-wide ones asked.  A plain user's hub never sends the admin's plan request,
which their NATS user may not publish: a permission violation is reported on the connection,
not on the request, so it would fail whichever request took it, and leave the plan request
waiting for its timeout.  The fleet-wide sections then say they are an admin's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from client.connection import CliError, Connection, ReplyError
from domain import rpc, subjects
from transport import progress as progress_stream

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.3  # between two refreshes of the queries
IDLE_REFRESH_S = 2.0  # at least this often while watched (heartbeats move no event)
USER_REFRESH_S = 1.0  # a Hoist user may not watch the event subjects: the timer alone
# A query's longest answer: a per-user one may ride out a restarting stream node (~4 s) and
# wait for the users model (2 s, services.manager.queries) before it answers.
ASK_S = 8.0
PROGRESS_FLUSH_S = 0.2  # progress messages are batched to the pages this often
MAX_PULLS_KEPT = 500  # finished pulls' last progress kept for the page (oldest dropped)

# Section -> (subject, payload): what the page shows, each from one documented query.
QUERIES: dict[str, tuple[str, dict[str, Any]]] = {
    "agents": (subjects.query_subject("agents"), {}),
    "images": (subjects.query_subject("images"), {}),
    "sessions": (subjects.query_subject("sessions"), {"limit": 1000}),
    "kernels": (subjects.query_subject("kernels"), {"limit": 2000}),
    "occupancy_owner": (subjects.query_subject("occupancy"), {"by": "owner"}),
    "occupancy_agent": (subjects.query_subject("occupancy"), {"by": "agent"}),
    "pulls": (subjects.query_subject("pulls"), {"limit": 200}),
    "policies": (subjects.query_subject("policies"), {}),
    "plans": (subjects.POLICY_PLAN, {}),
}
# Sections the manager serves a Hoist user only if they are an admin user; "agents" first, whose
# answer says whether they are (occupancy by agent: a plain user's is forced to their own
# owner, which that variant refuses).
FLEET_WIDE = ("agents", "images", "occupancy_agent", "pulls", "policies", "plans")


class Hub:
    """The live state of one principal's view; ``watch()`` yields what to send a page."""

    def __init__(self, conn: Connection, who: str, role: bool) -> None:
        self.conn = conn
        self.who = who  # "admin (token)" or a Hoist user's name: said on the page
        self.role = role  # the admin role's connection (the token), not a Hoist user's
        # What the manager lets this principal do: the role and admin users see the fleet and
        # destroy any session.  A user's is learned from each refresh (their first one runs
        # before the first page sees anything).
        self.admin = role
        self.sections: dict[str, Any] = {}
        self.progress: OrderedDict[str, dict[str, Any]] = OrderedDict()  # "agent/task" -> it
        self._watchers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._wake = asyncio.Event()
        self._fresh_progress: dict[str, dict[str, Any]] = {}
        self._fetched: set[str] = set()
        # Pulls held under way that may have moved unseen (nobody followed the progress), and
        # ended pulls already read again: see _late_progress.
        self._stale: set[str] = set()
        self._rechecked: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.ended: str | None = None  # why a Hoist user's access ended (their connection)
        self._subs: list[Subscription] = []

    # -- pages ---------------------------------------------------------------------------------

    async def watch(self) -> AsyncIterator[dict[str, Any]]:
        """A snapshot of everything, then each change; the hub runs while anyone watches."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=256)
        self._watchers.add(queue)
        try:
            if self.ended is not None:
                yield self._end_message()
                return
            if self._task is None:
                # The progress went unfollowed since the last page left: what it showed under
                # way is read again before anyone sees it.
                self._stale = {k for k, row in self.progress.items() if not row.get("done")}
                self._fetched.clear()
                self._task = asyncio.create_task(self._run(), name=f"web hub {self.who}")
                await self._refresh()  # the first page sees data, not an empty frame
            if self._end():
                yield self._end_message()
                return
            yield self.snapshot()
            while True:
                message = await queue.get()
                yield message
                if message["kind"] == "ended":
                    return  # the page says so and stops; its next request is refused
        finally:
            self._watchers.discard(queue)
            if not self._watchers and self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
                self._task = None

    def snapshot(self) -> dict[str, Any]:
        return {
            "kind": "snapshot",
            "who": self.who,
            "admin": self.admin,
            "sections": self.sections,
            "progress": list(self.progress.values()),
        }

    def _end_message(self) -> dict[str, Any]:
        return {"kind": "ended", "who": self.who, "reason": self.ended}

    def _end(self) -> bool:
        """Whether a Hoist user's connection is gone for good (the server closed it: the user
        was disabled or their password changed); if so the pages are told, once."""
        if self.ended is not None:
            return True
        nc = self.conn.nc
        if self.role or not nc.is_closed:
            return False
        why = f" ({nc.last_error})" if getattr(nc, "last_error", None) else ""
        self.ended = (
            f"the NATS server closed user {self.who!r}'s connection{why}: the user was disabled"
            " or their password changed"
        )
        log.info("web: %s", self.ended)
        for queue in list(self._watchers):
            with contextlib.suppress(asyncio.QueueEmpty):
                while queue.full():
                    queue.get_nowait()
            queue.put_nowait(self._end_message())
        return True

    def _send(self, message: dict[str, Any]) -> None:
        for queue in list(self._watchers):
            if queue.full():  # a page that stopped reading: it gets a fresh snapshot instead
                with contextlib.suppress(asyncio.QueueEmpty):
                    while True:
                        queue.get_nowait()
                queue.put_nowait(self.snapshot())
            else:
                queue.put_nowait(message)

    def poke(self) -> None:
        """Ask the queries again now (after a command this view sent)."""
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        await self._subscribe()
        flusher = asyncio.create_task(self._flush_progress())
        idle_s = IDLE_REFRESH_S if self.role else USER_REFRESH_S
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(idle_s):
                        await self._wake.wait()
                self._wake.clear()
                started = time.monotonic()
                if self._end():
                    return  # nothing more to ask: the connection is gone
                await self._refresh()
                await asyncio.sleep(max(0.0, MIN_INTERVAL_S - (time.monotonic() - started)))
        finally:
            flusher.cancel()
            for sub in self._subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            self._subs = []

    async def _subscribe(self) -> None:
        nc = self.conn.nc

        async def on_event(_msg: Msg) -> None:
            self._wake.set()

        async def on_progress(msg: Msg) -> None:
            try:
                p = rpc.decode(msg.data, rpc.PullProgress)
            except rpc.RequestError:
                return  # someone else's bug; the view goes on
            if msg.subject != f"{subjects.PROGRESS}.{p.agent_id}.{p.task_id}":
                return  # an agent publishes only its own pulls' subjects
            self._stale.discard(f"{p.agent_id}/{p.task_id}")  # heard live: newer than a re-read
            self._keep_progress(p)

        if self.role:  # a role's connection; a Hoist user's may not (natsauth)
            self._subs.append(await nc.subscribe(subjects.EVENTS_ALL, cb=on_event))
        self._subs.append(await nc.subscribe(f"{subjects.PROGRESS}.>", cb=on_progress))

    def _keep_progress(self, p: rpc.PullProgress) -> None:
        key = f"{p.agent_id}/{p.task_id}"
        row = msgspec.to_builtins(p)
        row["key"] = key
        row["at"] = time.time()
        self.progress[key] = row
        self.progress.move_to_end(key)
        while len(self.progress) > MAX_PULLS_KEPT:
            self.progress.popitem(last=False)
        self._fresh_progress[key] = row

    async def _flush_progress(self) -> None:
        while True:
            await asyncio.sleep(PROGRESS_FLUSH_S)
            if self._fresh_progress:
                rows, self._fresh_progress = list(self._fresh_progress.values()), {}
                self._send({"kind": "progress", "progress": rows})

    async def _refresh(self) -> None:
        if self._end():
            return
        if self.role:
            replies = await self._ask_all(list(QUERIES))
        else:
            replies = await self._ask_all([n for n in QUERIES if n not in FLEET_WIDE[1:]])
            probe = replies["agents"]
            if isinstance(probe, ReplyError) and probe.code == "forbidden":
                admin = False
            elif isinstance(probe, BaseException):
                admin = self.admin  # no answer (yet): as it last said
            else:
                admin = True
            if admin:
                replies.update(await self._ask_all(list(FLEET_WIDE[1:])))
            else:
                note = f"for admins only: the manager serves user {self.who!r} their own sessions"
                replies.update({name: {"admin_only": note} for name in FLEET_WIDE})
            if admin != self.admin:
                self.admin = admin
                self._send({"kind": "who", "who": self.who, "admin": admin})
        changed: dict[str, Any] = {}
        for name, reply in replies.items():
            value: Any
            if isinstance(reply, CliError):
                value = {"error": str(reply)}  # said, not hidden
            elif isinstance(reply, BaseException):
                log.warning("web: %s query failed: %s", name, reply)
                continue
            else:
                value = reply
            if self.sections.get(name) != value:
                self.sections[name] = value
                changed[name] = value
        if changed:
            self._send({"kind": "sections", "sections": changed})
        await self._late_progress()

    async def _ask_all(self, names: list[str]) -> dict[str, Any]:
        """Each query's reply, or the exception it raised, by section name."""
        replies = await asyncio.gather(
            *(self._ask(*QUERIES[name]) for name in names), return_exceptions=True
        )
        return dict(zip(names, replies, strict=True))

    async def _ask(self, subject: str, payload: dict[str, Any]) -> Any:
        # Not asked again: the next refresh asks anyway, and shows why meanwhile.
        return await self.conn.request(subject, dict(payload), wait_s=ASK_S, read_again=False)

    async def _late_progress(self) -> None:
        """The progress stream's last message of each pull under way the hub has not heard
        of yet (it started before the hub did), of each it held under way before nobody
        watched (``_stale``), and of each the pulls query says ended while the hub holds it
        under way."""
        pulls = self.sections.get("pulls")
        rows = pulls.get("rows", []) if isinstance(pulls, dict) else []
        wanted = sorted(self._stale)  # "agent/task" keys (neither part holds a "/")
        for row in rows:
            key = f"{row['agent_id']}/{row['task_id']}"
            held = self.progress.get(key)
            if row.get("outcome") == "pulling":
                if held is None and key not in self._fetched:
                    self._fetched.add(key)
                    wanted.append(key)
            elif held is not None and not held.get("done") and key not in self._rechecked:
                self._rechecked.add(key)
                self._stale.add(key)
                wanted.append(key)
        if not wanted:
            return
        js = self.conn.nc.jetstream()
        for key in dict.fromkeys(wanted):
            agent_id, _, task_id = key.partition("/")
            try:
                last = await progress_stream.latest(js, agent_id, task_id)
            except Exception as e:  # the live messages still come
                log.info("web: no last progress of pull %s: %s", key, e)
                continue
            stale = key in self._stale
            self._stale.discard(key)
            if last is not None and (stale or key not in self.progress):
                self._keep_progress(last)
            elif last is None and stale and key in self.progress:
                # Its messages expired: it ended long ago.  Said ended, not left under way.
                row = dict(self.progress[key], done=True)
                self.progress[key] = row
                self._fresh_progress[key] = row
