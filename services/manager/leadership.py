"""Which manager leads: a lease in the event stream (NOTES "Fencing on JetStream").

The lease is the last message on ``hoist.events.lease.manager``: a ManagerLeaseTaken with a
per-message TTL (``Nats-TTL``), so it disappears when its holder stops renewing it.  A manager
takes a free lease by appending with expected last subject sequence 0 (empty: lapsed or never
taken), or its own (same ``holder``: itself before a restart) by compare-and-set on the
sequence it read; the leader renews it every quarter TTL by compare-and-set on the sequence
it holds.  A refused renewal is looked into (``_recheck``): the lease's last record still
ours keeps the lead, one no manager wrote is renewed over, anyone else's means it follows.

The leader fences its scheduling batches, and the writes its loops decide on time or on its
own memory (an agent lost, a session's lifetime or idle time over, a pull stalled, an agent's
drift corrected): a ManagerFence in the same atomic batch, expecting the term subject
(``hoist.events.lease.manager-term``) at the record of its take
(``Nats-Expected-Last-Subject-Sequence-Subject``; ``fence()``); the check moves onto a
message of the batch that checks nothing itself where there is one (``Write.check_only``: a
scheduling batch's second event of a session), so no fence record is stored then.  A take,
unlike a renewal, appends a ManagerTermBegan there in the same atomic batch as the lease, so
a paused ex-leader's write is refused whole once another manager took the lease, and the
leader's own renewals, every quarter TTL, refuse none of its batches in flight (when fences
expected the lease's sequence, each renewal refused them: at 20,000 live, 48 batches a
burst, each reloaded and planned again).  The reactors' writes are not fenced: each is the
next step of its session from what the log holds (the session subject's own check), which the
new leader would take the same way.  The leader also stops leading on its own when it could
not renew for a lease TTL (its lease may have lapsed meanwhile).  A stream made before leases
existed takes no TTL: there the manager leads unleased, as one manager did.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from domain import events as ev
from domain.admission import UNKNOWN_HOLDER, lease_holder
from domain.codec import encode
from domain.subjects import (
    MANAGER_FENCE_ID,
    MANAGER_LEASE_ID,
    MANAGER_TERM_ID,
    manager_fence,
    manager_lease,
    manager_term,
)
from eventstore.store import (
    MSG_TTL,
    ConcurrencyError,
    EventStore,
    Message,
    StoreError,
    Write,
)
from transport.tasks import Tasks

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 5.0


class NotLeading(StoreError):
    """A leader's write asked of a manager that does not lead: nothing was written."""


class Leadership:
    def __init__(
        self,
        store: EventStore,
        holder: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        on_lead: Callable[[], Awaitable[None]],
        on_follow: Callable[[], Awaitable[None]],
        fencing: bool = True,
        step_down_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not ttl_s >= 1:  # nats-server's least per-message TTL
            raise ValueError(f"ttl_s must be >= 1 second, got {ttl_s!r}")
        self.store = store
        self.holder = holder
        self.ttl_s = ttl_s
        self.on_lead = on_lead
        self.on_follow = on_follow
        self.fencing = fencing  # off: a test's knob, to prove the reservations' OCC alone
        # A test's knob: lead at most this long, then let the lease lapse (forced flips).
        self.step_down_after_s = step_down_after_s
        self.clock = clock
        self.leading = False
        self.lease_seq = 0  # the sequence of the lease we hold
        self.term_seq = 0  # the sequence of our take's ManagerTermBegan: what fences expect
        self.unleased = False  # the stream takes no TTL: lead without a lease
        self.changes = 0  # how many times this manager took or lost the lead
        self._renewed_at = 0.0
        self._holds_still = True  # False once a renewal was refused: another holds it
        self._led_since = 0.0
        self._resting_until = 0.0
        self._tasks = Tasks()
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Try once now (a single manager leads before it serves), then keep at it."""
        if not self.store.msg_ttl:
            log.warning(
                "stream %s takes no per-message TTL (made before leases): leading without a"
                " lease; run only one manager on it",
                self.store.stream,
            )
            self.unleased = True
            await self._become(True)
            return
        await self.tick()
        self._tasks.spawn(self._run(), "manager lease")

    async def stop(self) -> None:
        """Stop; a lease we hold is released, so a standby takes over without waiting."""
        await self._tasks.stop()
        async with self._lock:
            if self.leading and not self.unleased:
                await self._become(False)
                await self._release()

    async def _release(self) -> None:
        released = self._message(ev.ManagerLeaseReleased, MANAGER_LEASE_ID)
        expected = self.lease_seq
        for _ in range(2):
            try:
                await self.store.append(
                    [Write(manager_lease(), [released], expected_last_seq=expected)],
                    urgent=True,
                )
                return
            except ConcurrencyError:
                # A renewal cancelled after it was sent may have moved it: still ours?
                last = await self.store.last(manager_lease(), urgent=True, expiring=True)
                if last is None or lease_holder(last.subject, last.headers, last.data) != (
                    self.holder
                ):
                    return
                expected = last.seq
            except StoreError as e:
                log.warning("manager lease not released (%s): it lapses on its own", e)
                return

    @property
    def assured(self) -> bool:
        """Leading on a lease renewed within three quarters of its TTL, so no other manager can
        have taken it since.  A leader paused longer (SIGSTOP, a frozen VM) wakes with
        ``leading`` still set, an old view, and timers due before its renewal runs: what its
        view cannot fence (agent syncs, which destroy what the view does not know) waits."""
        if self.unleased:
            return self.leading
        return self.leading and not self._lapsing(self.clock())

    def _lapsing(self, now: float) -> bool:
        """Our lease unrenewed for three quarters of its TTL: the leader steps down at its
        next tick, and is not assured meanwhile."""
        return now - self._renewed_at >= self.ttl_s * 0.75

    def fence(self) -> tuple[Write, ...]:
        """The writes that fence a leader's append: refused once the lease moved on (another
        manager took it, or it lapsed).  NotLeading if this manager does not lead now: what
        only the leader may write is not written unfenced (a loop's write raced its
        step-down).  Empty where nothing fences: unleased, or fencing off (a test's knob)."""
        if not self.fencing or self.unleased:
            return ()
        if not self.leading:
            raise NotLeading(f"manager {self.holder} does not lead: the leader writes this")
        fence = self._message(ev.ManagerFence, MANAGER_FENCE_ID, term_seq=self.term_seq)
        return (
            Write(
                manager_fence(),
                [fence],
                expected_last_seq=self.term_seq,
                expected_subject=manager_term(),
                check_only=True,
            ),
        )

    def _message(
        self,
        cls: Callable[..., ev.Event],  # a lease-subject event: each has a holder
        aggregate_id: str,
        *,
        expires: bool = True,
        **fields: object,
    ) -> Message:
        """One lease-subject message of this holder, expiring after the TTL unless not
        ``expires`` (a term's record)."""
        event = cls(
            originator_id=aggregate_id,
            originator_version=1,
            timestamp=ev.Event.create_timestamp(),
            holder=self.holder,
            **fields,
        )
        data, headers = encode(event)
        if expires:
            headers[MSG_TTL] = _ttl(self.ttl_s)
        return Message(data, headers)

    async def _run(self) -> None:
        while True:
            # The leader renews every quarter TTL; a standby looks more often, so it takes a
            # lapsed lease soon after it is gone (a direct get each time).
            await asyncio.sleep(self.ttl_s / 4 if self.leading else min(self.ttl_s / 4, 0.1))
            try:
                await self.tick()
            except Exception:
                log.exception("manager lease")

    async def tick(self) -> None:
        """Renew the lease we hold, or take it if it is free (or ours from before)."""
        async with self._lock:
            now = self.clock()
            if self.leading:
                if (
                    self.step_down_after_s is not None
                    and now - self._led_since >= self.step_down_after_s
                ):
                    log.warning("manager %s steps down (test knob)", self.holder)
                    self._resting_until = now + self.ttl_s / 2
                    await self._become(False)
                    await self._release()
                    return
                if await self._append(self.lease_seq):
                    await self._check_term()
                    return
                if not self._holds_still:
                    await self._recheck()
                if self._lapsing(now) or not self._holds_still:
                    await self._become(False)
                return
            if now < self._resting_until:
                return
            last = await self.store.last(manager_lease(), urgent=True, expiring=True)
            expected = 0
            if last is not None:
                holder = lease_holder(last.subject, last.headers, last.data)
                if holder not in (None, UNKNOWN_HOLDER, self.holder):
                    return  # someone else leads
                # released, ours from before a restart, or no lease any manager wrote: take it
                expected = last.seq
            if await self._append(expected, take=True):
                self._led_since = self.clock()
                await self._become(True)

    async def _recheck(self) -> None:
        """A renewal was refused: whose is the lease's last record?  Ours still (a renewal of
        ours that was cancelled after it was sent, or a replicated stream refusing one while
        another is being proposed): we hold it at that sequence.  A record no manager wrote (a
        reader can make nats-server store its answer there): renew over it.  Anyone else's,
        or none (lapsed): we no longer lead."""
        try:
            last = await self.store.last(manager_lease(), urgent=True, expiring=True)
        except StoreError as e:
            log.warning("manager lease not read after a refused renewal (%s)", e)
            self._holds_still = True  # unknown: keep leading until the lease would lapse
            return
        if last is None:
            return
        holder = lease_holder(last.subject, last.headers, last.data)
        if holder == self.holder:
            self.lease_seq, self._holds_still = last.seq, True
        elif holder == UNKNOWN_HOLDER:
            # A take, not a renewal: another manager may have led since our term began.
            log.warning("manager lease: a record no manager wrote at %d: taken over", last.seq)
            await self._append(last.seq, take=True)

    async def _check_term(self) -> None:
        """After a renewal: the term subject's last record must be our take's, or every fenced
        write is refused.  Anything else there while the lease is ours (a record a reader made
        nats-server store, or the term of a manager that led while we were paused and whose
        lease we then took over) is replaced by a new term, in one batch with the lease
        expecting the sequence we hold: refused if the lease moved meanwhile."""
        try:
            last = await self.store.last(manager_term(), urgent=True)
        except StoreError as e:
            log.warning("manager term not read (%s)", e)
            return
        if last is not None and last.seq == self.term_seq:
            return
        at = 0 if last is None else last.seq
        log.warning("manager term: its last record (%d) is not our take's: taken again", at)
        await self._append(self.lease_seq, take=True)

    async def _append(self, expected: int, *, take: bool = False) -> bool:
        """Renew the lease expecting the subject at ``expected``, or ``take`` it (a new term:
        its record in the same batch); True if ours."""
        lease = self._message(ev.ManagerLeaseTaken, MANAGER_LEASE_ID, ttl_s=self.ttl_s)
        writes = [Write(manager_lease(), [lease], expected_last_seq=expected)]
        if take:
            term = self._message(ev.ManagerTermBegan, MANAGER_TERM_ID, expires=False)
            writes.append(Write(manager_term(), [term]))
        try:
            [seq, *term_seq] = await self.store.append(writes, urgent=True)
        except ConcurrencyError:
            self._holds_still = False
            return False
        except StoreError as e:
            log.warning("manager lease not written (%s)", e)
            self._holds_still = True  # unknown: keep leading until the lease would lapse
            return False
        self.lease_seq = seq
        if term_seq:
            self.term_seq = term_seq[0]
        self._renewed_at = self.clock()
        self._holds_still = True
        return True

    async def _become(self, leading: bool) -> None:
        if leading == self.leading:
            return
        self.leading = leading
        self.changes += 1
        if leading:
            log.warning("manager %s leads (lease at %d)", self.holder, self.lease_seq)
            await self.on_lead()
        else:
            log.warning("manager %s follows", self.holder)
            await self.on_follow()


def _ttl(seconds: float) -> str:
    """A Nats-TTL value: whole seconds, or milliseconds below ten seconds (``1500ms``)."""
    return f"{max(1, round(seconds * 1000))}ms" if seconds < 10 else f"{round(seconds)}s"
