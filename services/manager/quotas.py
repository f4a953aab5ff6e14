"""Resource policies on the manager: the admin's commands and the lifetime loop.

Commands (admin): ``hoist.admin.quota.set``, ``.remove``, ``.show``; what each takes and answers
is in domain.contracts.quotas.  The scheduler reads the effective policies from the fleet
(services.manager.scheduler_loop); a create that could never fit its owner's policy is refused
by services.manager.sessions.

The lifetime loop (every ``interval_s``): an interactive session RUNNING longer than its owner's
``max_lifetime_s`` is ended ``lifetime-exceeded`` (its kernels TERMINATING, then TERMINATED as a
destroy would).  It walks the fleet's index of RUNNING interactive sessions, oldest first (kept
sorted as they change, so a round sorts nothing), and stops at the first one not due under the
shortest lifetime any policy sets, so a round costs the due sessions (plus the running ones of
owners without a lifetime, which it skips by a dictionary lookup), and nothing at all while no
policy sets a lifetime.

The idle timeout, in the same loop: an interactive session nobody used through Hoist (a
session get, logs or exec on it, a read of a stream those opened: ``used``, by its owner on
their subjects or by the client and admin roles) for its owner's ``idle_timeout_s`` since it
became RUNNING, or since its last use, is ended ``idle-timeout``.  The last use is kept in
memory only: a restarted manager counts from its own start (never earlier than it became
RUNNING), so a session may stay up to one timeout longer across a restart, never end early.
The walk is the lifetime's: RUNNING sessions oldest first, stopping at the first that became
RUNNING within the shortest idle timeout any policy sets (nothing while the manager has run
less than that); a session in use is visited and skipped by a dictionary lookup.  Batch
sessions are never in the index, so never idle-ended.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from domain.contracts.quotas import (
    MyQuota,
    RemoveQuota,
    SetQuota,
    ShowQuotas,
    quota_view,
    resource_policy_view,
    usage_view,
)
from domain.contracts.sessions import ReadStream, StreamOpened
from domain.quota import ResourcePolicy, Usage, effective
from domain.session import Session
from domain.subjects import RESOURCE_POLICY
from services.manager.bus import LookAgain
from services.manager.fleet import Fleet
from services.manager.open_streams import OpenStreams
from services.manager.uow import UnitOfWork, removal
from transport.tasks import Tasks, every

log = logging.getLogger(__name__)


class Quotas:
    def __init__(
        self,
        fleet: Fleet,
        uow: UnitOfWork,
        *,
        interval_s: float = 5.0,
        streams: OpenStreams | None = None,
    ) -> None:
        self.fleet = fleet
        self.uow = uow
        self.interval_s = interval_s
        self.ended = 0  # sessions ended lifetime-exceeded (for tests)
        self.idle_ended = 0  # sessions ended idle-timeout (for tests)
        self.started_at = datetime.now(UTC)  # no use is known from before: the idle clock's start
        self.last_use: dict[str, datetime] = {}  # RUNNING interactive session id -> last use
        self.streams = streams or OpenStreams()  # what logs and exec opened: a read is a use
        self._tasks = Tasks()

    def start(self) -> None:
        self._tasks.spawn(every(self.interval_s, self.end_due, "lifetime and idle check"))

    async def stop(self) -> None:
        await self._tasks.stop()

    # -- commands ------------------------------------------------------------------------

    async def set(self, req: SetQuota) -> dict[str, Any]:
        quota = req.quota()
        policy, recorded = await self.uow.admin(
            RESOURCE_POLICY, req.name, lambda p: ResourcePolicy.set(p, name=req.name, quota=quota)
        )
        return {"policy": resource_policy_view(policy), "recorded": recorded}

    async def remove(self, req: RemoveQuota) -> dict[str, Any]:
        missing = f"no resource policy {req.name!r}; `hoist quota show` shows them"
        _, recorded = await self.uow.admin(RESOURCE_POLICY, req.name, removal(missing))
        return {"policy": req.name, "recorded": recorded}

    async def show(self, req: ShowQuotas) -> dict[str, Any]:
        policies = self.fleet.resource_policies
        if req.owner is not None:
            owners = [req.owner]
        else:
            waiting = {self.fleet.sessions[sid].owner for sid in self.fleet.pending}
            owners = sorted(self.fleet.owner_usage.keys() | waiting)
        pending: dict[str, int] = {}
        for sid in self.fleet.pending:
            owner = self.fleet.sessions[sid].owner
            pending[owner] = pending.get(owner, 0) + 1
        return {
            "policies": [resource_policy_view(p) for _, p in sorted(policies.items())],
            "owners": [self._row(owner, pending.get(owner, 0)) for owner in owners],
        }

    async def mine(self, req: MyQuota) -> dict[str, Any]:
        """The owner's own row (their effective policy, usage, pending): what a user may see
        of quotas, never another user's policy."""
        pending = sum(
            1 for sid in self.fleet.pending if self.fleet.sessions[sid].owner == req.owner
        )
        return self._row(req.owner, pending)

    def _row(self, owner: str, pending: int) -> dict[str, Any]:
        policy = effective(owner, self.fleet.resource_policies)
        return {
            "owner": owner,
            "policy": None if policy is None else policy.id,
            "quota": quota_view(None if policy is None else policy.quota),
            "usage": usage_view(self.fleet.owner_usage.get(owner) or Usage()),
            "pending": pending,
        }

    # -- lifetime ------------------------------------------------------------------------

    def overdue(self, now: datetime) -> list[tuple[str, float]]:
        """(session id, its owner's lifetime) of each interactive session RUNNING too long."""
        policies = self.fleet.resource_policies
        lifetimes = [
            p.quota.max_lifetime_s
            for p in policies.values()
            if not p.removed and p.quota.max_lifetime_s is not None
        ]
        if not lifetimes or not self.fleet.running_since:
            return []
        oldest_due = now - timedelta(seconds=min(lifetimes))
        out = []
        for since, sid in self.fleet.running_order:
            if since > oldest_due:
                break  # no lifetime is short enough for this one or any later one
            session = self.fleet.sessions[sid]
            policy = effective(session.owner, policies)
            limit = None if policy is None else policy.quota.max_lifetime_s
            if limit is not None and (now - since).total_seconds() >= limit:
                out.append((sid, limit))
        return out

    async def end_due(self) -> int:
        """One round: end each overdue session, then each idle one; the number ended."""
        return await self.end_overdue() + await self.end_idle()

    async def end_overdue(self) -> int:
        """End each overdue session; the number ended."""
        ended = 0
        for sid, limit in self.overdue(datetime.now(UTC)):
            if await self.uow.try_change(
                sid, partial(Session.lifetime_exceeded, limit_s=limit), fenced=True
            ):
                ended += 1
                self.uow.publish(LookAgain(sid))  # its worker removes the containers
        self.ended += ended
        return ended

    # -- idle timeout --------------------------------------------------------------------

    def used(self, request: object, reply: object) -> None:
        """A command served ``request`` with ``reply``: a get, logs or exec of a session, or a
        read of a stream one of those opened, is a use of that session."""
        if isinstance(reply, StreamOpened):
            session = self.fleet.sessions.get(reply.session_id)
            if session is not None:
                self.streams.opened(
                    reply.agent_id, reply.stream_id, session.owner, reply.session_id
                )
        if isinstance(request, ReadStream):
            opened = self.streams.get(request.agent_id, request.stream_id)
            sid = None if opened is None else opened.session_id
        else:
            sid = getattr(request, "session_id", None)
        if isinstance(sid, str) and sid in self.fleet.running_since:
            self.last_use[sid] = datetime.now(UTC)  # before RUNNING, the clock starts there

    def idle(self, now: datetime) -> list[tuple[str, float]]:
        """(session id, its owner's idle timeout) of each interactive session unused too long."""
        policies = self.fleet.resource_policies
        timeouts = [
            p.quota.idle_timeout_s
            for p in policies.values()
            if not p.removed and p.quota.idle_timeout_s is not None
        ]
        if len(self.last_use) > len(self.fleet.running_since):  # some ended: forget them
            self.last_use = {
                s: t for s, t in self.last_use.items() if s in self.fleet.running_since
            }
        if not timeouts or not self.fleet.running_since:
            return []
        oldest_due = now - timedelta(seconds=min(timeouts))
        if self.started_at > oldest_due:
            return []  # the manager has not run as long as the shortest timeout
        out = []
        for since, sid in self.fleet.running_order:
            if since > oldest_due:
                break  # no timeout is short enough for this one or any later one
            last = max(since, self.started_at, self.last_use.get(sid, since))
            if last > oldest_due:
                continue  # used lately
            policy = effective(self.fleet.sessions[sid].owner, policies)
            limit = None if policy is None else policy.quota.idle_timeout_s
            if limit is not None and (now - last).total_seconds() >= limit:
                out.append((sid, limit))
        return out

    async def end_idle(self) -> int:
        """End each idle session; the number ended."""
        ended = 0
        for sid, limit in self.idle(datetime.now(UTC)):
            if await self.uow.try_change(
                sid, partial(Session.idle_timed_out, limit_s=limit), fenced=True
            ):
                ended += 1
                self.last_use.pop(sid, None)
                self.uow.publish(LookAgain(sid))  # its worker removes the containers
        self.idle_ended += ended
        return ended
