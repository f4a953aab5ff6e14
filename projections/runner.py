"""The projection runner: event stream in, DuckDB read models out, exactly once.

It reads the stream from the lowest checkpoint, folds a batch of events into every projection
in memory, and writes the batch's rows together with each projection's checkpoint (the last
stream sequence it folded) in ONE DuckDB transaction: a crash anywhere before the commit loses
the whole batch (it is read again), a crash after it loses nothing, so no event is lost or
applied twice.  While catching up the batches are big (what has arrived, up to ``max_batch``);
when live, a commit waits out a pause after the previous one (COMMIT_SHARE), and so do the
reads, so what arrives meanwhile is read and committed together.

A projection whose ``version`` differs from the stored one is rebuilt from the first event into
``<table>__build`` tables (its progress checkpointed too); when it has caught up with the
others, one transaction drops the old tables and renames the new ones, so readers see the old
model or the new one, never a half-built one.

The runner knows no particular model: it runs the ones it is given (projections.ALL in the
manager, `hoist replay` and `hoist verify`).  A record domain.admission refuses, that the
gatekeeper among them refuses (projections.base.Gatekeeper: the quarantine model, which keeps
each aggregate's last admitted version and refuses a version gap as the domain fold does), or
that a model cannot fold (a handler raises) or store (its batch's write fails on a value: the
batch is then written event by event to find it), is quarantined: logged once, given to the
gatekeeper (a row in the ``quarantine`` model), skipped; the runner goes on.  A runner without
a gatekeeper checks no versions.

One process owns the DuckDB file (DuckDB allows one writer process): the manager's read models
process (services/manager/read_models_process.py) runs the runner and the query handlers, which
read through cursors of the same connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime

import duckdb
import pyarrow as pa

from domain import codec
from domain.admission import Inadmissible, admit
from domain.events import type_name
from eventstore.bulk import BULK_MIN, BulkReader
from eventstore.quarantine import quarantined
from eventstore.store import PAGE, EventStore, Recorded
from projections.base import MODEL_REASON, Gatekeeper, Handler, Projection
from projections.table import Changes, transaction, write

log = logging.getLogger(__name__)

META = "projection_meta"
BUILD_SUFFIX = "__build"
# Events folded before the runner lets other work run: a catch-up batch of 20,000 folded in one
# go held the manager's loop for about half a second (a create's p99 at 10,000 live sessions).
FOLD_SLICE = 250
MAX_BATCH = 20_000  # most events per transaction: a catch-up batch is what arrived meanwhile
# Following, commits take at most this share of the time unless a query waits for a sequence:
# a commit costs DuckDB a few ms a table whatever it holds, so committing each trickle of
# events (a create's six appended one by one) kept a core busy at 50 sessions/s on 1,000
# agents.  After a commit that took d seconds the next waits d * (1 / share - 1), at most
# MAX_PAUSE_S (what arrives meanwhile joins it): idle, a few ms; under load, a quarter second.
COMMIT_SHARE = 0.2
MAX_PAUSE_S = 1.0
READ_EARLY_S = 0.02  # following, the read after a pause starts this long before it ends

Fault = Callable[[str], None]  # test hook: called at named points, may raise to "crash" there

# A write that fails on a value (not on the disk or the database): the batch holds a record the
# models cannot store.  domain.limits' bounds should make this impossible; it is a safety net.
_VALUE_ERRORS = (
    duckdb.ConversionException,
    duckdb.OutOfRangeException,
    duckdb.InvalidInputException,
    duckdb.ConstraintException,
    duckdb.TypeMismatchException,
    pa.ArrowException,
    OverflowError,
    TypeError,
    ValueError,
)


class Runner:
    """Keeps the read models of ``projections`` (e.g. projections.ALL) in ``con`` up to date
    with ``store``."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        store: EventStore,
        projections: Sequence[type[Projection]],
        *,
        max_batch: int = MAX_BATCH,
        bulk: BulkReader | None = None,
        bulk_min: int = BULK_MIN,  # this far behind, the bulk reader reads up to the head
        commit_share: float = COMMIT_SHARE,
        share: bool = True,  # follow through the store's shared tail (other followers read it)
        fault: Fault | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not 0 < commit_share <= 1:
            raise ValueError(f"commit_share must be in (0, 1], got {commit_share}")
        self.con = con
        self.store = store
        self.types = tuple(projections)
        self.max_batch = max_batch
        self.bulk = bulk
        self.bulk_min = bulk_min
        self.commit_share = commit_share
        self.share = share
        self.fault = fault or (lambda point: None)
        self.projections: list[Projection] = []
        self.names: dict[str, dict[str, str]] = {}  # projection -> base table -> physical table
        self.building: dict[str, list[str]] = {}  # projection -> its old tables, to drop on swap
        self.committed: dict[str, int] = {}  # projection -> seq its *visible* tables reflect
        # Wire event type name -> the handlers that take it, in projection order.
        self._dispatch: dict[str, list[tuple[Projection, Handler]]] = {}
        self._gate: Gatekeeper | None = None
        self._changed: asyncio.Event | None = None
        self._hurry = asyncio.Event()  # set when a query starts waiting: commit without pacing
        self._committed_at = 0.0  # the loop's time when the last commit ended
        self._pause_s = 0.0  # how long after it the next one waits (_pace)
        self.open()

    # -- setup ------------------------------------------------------------------------------------

    def open(self) -> None:
        """(Re)load every projection from its committed state; memory ahead of it is dropped."""
        with transaction(self.con) as cur:
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {META} (projection VARCHAR, version INTEGER,"
                " seq BIGINT, tables VARCHAR, build_version INTEGER, build_seq BIGINT)"
            )
            meta = {
                r[0]: r[1:]
                for r in cur.execute(
                    f"SELECT projection, version, seq, tables, build_version, build_seq FROM {META}"
                ).fetchall()
            }
            self.projections, self.names, self.building, self.committed = [], {}, {}, {}
            for cls in self.types:
                self.projections.append(self._open_one(cur, cls, meta.get(cls.name)))
            for p in self.projections:
                if p.name not in self.building:
                    _create_views(cur, p)
            self._dispatch = {}
            self._gate = next((p for p in self.projections if isinstance(p, Gatekeeper)), None)
            for p in self.projections:
                for event_type, handler in p.handlers.items():
                    self._dispatch.setdefault(type_name(event_type), []).append((p, handler))

    def _open_one(
        self,
        cur: duckdb.DuckDBPyConnection,
        cls: type[Projection],
        meta: tuple[int, int, str, int | None, int | None] | None,
    ) -> Projection:
        p = cls()
        bases = [t.name for t in cls.tables]
        if meta is None:
            for t in cls.tables:
                cur.execute(t.create_sql(t.name))
            cur.execute(
                f"INSERT INTO {META} VALUES (?, ?, 0, ?, NULL, NULL)",
                [cls.name, cls.version, ",".join(bases)],
            )
            names = {b: b for b in bases}
            self.committed[cls.name] = 0
        elif meta[0] == cls.version:
            names = {b: b for b in bases}
            p.seq = self.committed[cls.name] = meta[1]
        else:
            names = {b: b + BUILD_SUFFIX for b in bases}
            self.building[cls.name] = meta[2].split(",")
            self.committed[cls.name] = meta[1]  # the old model stays visible until the swap
            if meta[3] == cls.version:
                p.seq = meta[4] or 0  # resume the build where it committed
            else:
                log.info(
                    "projection %s: version %s -> %s: rebuilding", cls.name, *meta[:1], cls.version
                )
                for t in cls.tables:
                    cur.execute(f"DROP TABLE IF EXISTS {names[t.name]}")
                    cur.execute(t.create_sql(names[t.name]))
                cur.execute(
                    f"UPDATE {META} SET build_version = ?, build_seq = 0 WHERE projection = ?",
                    [cls.version, cls.name],
                )
        self.names[cls.name] = names
        p.load(cur, names)
        return p

    # -- reading state ----------------------------------------------------------------------------

    @property
    def seq(self) -> int:
        """The stream sequence every visible read model reflects (at least)."""
        return min(self.committed.values(), default=0)

    async def wait_for(self, seq: int, within: float, names: Sequence[str] = ()) -> bool:
        """Wait until the models ``names`` (all if empty) reflect ``seq``; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            reflected = min((self.committed[n] for n in names or self.committed), default=self.seq)
            if reflected >= seq:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):  # wait_for can lose a cancel on 3.11
                    await self._event().wait()
            except TimeoutError:
                return False

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        self._hurry.set()
        return self._changed

    async def _pace(self) -> None:
        """Wait out the pause after the last commit (COMMIT_SHARE), unless a query waits."""
        if self._changed is None and self._paused_for() > 0:
            self._hurry.clear()
            await self._pause_over()

    def _paused_for(self) -> float:
        return self._committed_at + self._pause_s - asyncio.get_running_loop().time()

    async def _pause_over(self, early: float = 0.0) -> None:
        """Until ``early`` s before the pause after the last commit is over, or a query waits
        for a sequence."""
        left = self._paused_for() - early
        if left <= 0 or self._changed is not None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left):  # wait_for can lose a cancel on 3.11
                await self._hurry.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    # -- the loop ---------------------------------------------------------------------------------

    async def run(
        self,
        *,
        follow: bool = True,
        until_seq: int | None = None,
        until_time: datetime | None = None,
    ) -> int:
        """Fold and commit events until caught up (or ``until_seq``/``until_time``: only events
        stored at or before it), or for ever with ``follow``.  Returns the last sequence folded.
        On an exception, memory may be ahead of the database: call ``open()`` before running
        again (``serve`` does)."""
        await self._commit_batch()  # swaps a rebuild that has nothing to catch up
        from_seq = min(p.seq for p in self.projections) + 1
        if until_seq is not None and until_seq < from_seq:
            return from_seq - 1
        # Bounded: a full queue only makes the reader wait (replay reads at our pace), and it
        # holds about two batches, so the next batch is read while this one is committed.
        queue: asyncio.Queue[list[Recorded] | BaseException | None] = asyncio.Queue(
            max(2, 2 * self.max_batch // PAGE)  # pages
        )
        reader = asyncio.create_task(self._read(queue, from_seq, until_seq, follow))
        last = from_seq - 1
        pending: list[Recorded] = []  # read, not yet folded
        done = False
        try:
            while not done or pending:
                if not pending:
                    done = _take(await queue.get(), pending)
                if follow and not done:
                    await self._pace()
                while not done and len(pending) < self.max_batch and not queue.empty():
                    done = _take(queue.get_nowait(), pending)  # what has arrived
                batch, pending = pending[: self.max_batch], pending[self.max_batch :]
                if until_time is not None and batch and batch[-1].time > until_time:
                    batch = [r for r in batch if r.time <= until_time]
                    pending, done = [], True
                if batch:
                    for at in range(0, len(batch), FOLD_SLICE):
                        self._fold(batch[at : at + FOLD_SLICE])
                        await asyncio.sleep(0)  # the manager's loop: creates go on meanwhile
                    last = batch[-1].seq
                    try:
                        await self._commit_batch()
                    except _VALUE_ERRORS as e:
                        await self._write_one_by_one(batch, e)
        finally:
            reader.cancel()
            await asyncio.wait([reader])  # it ends by itself; raises nothing of its own
        return last

    async def serve(self) -> None:
        """Follow the stream for ever; after a failure, reload from the database and go on."""
        delay = 0.5
        while True:
            try:
                await self.run(follow=True)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("projection runner failed; reloading from the last checkpoint")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                await asyncio.to_thread(self.open)

    async def _read(
        self,
        queue: asyncio.Queue[list[Recorded] | BaseException | None],
        from_seq: int,
        until_seq: int | None,
        follow: bool,
    ) -> None:
        """Move the replay's pages into ``queue``, then None (the end) or the exception that
        ended it.  Far behind, the stretch up to the stream's head is read by the bulk reader's
        child process (if the runner has one), so reading and folding run on two cores."""
        try:
            if self.bulk is not None:
                head = await self.store.head()
                if until_seq is not None:
                    head = min(head, until_seq)
                if head - from_seq + 1 >= self.bulk_min:
                    bulk = self.bulk.pages_while_it_reads(from_seq, head)
                    async with contextlib.aclosing(bulk):
                        async for page in bulk:
                            await queue.put(page)
                            from_seq = page[-1].seq + 1
                    if until_seq is not None and from_seq > until_seq:
                        await queue.put(None)
                        return
            # Following, the read after a short page (caught up) waits out the commit's
            # pause: what arrived meanwhile comes in one read, not in one per append (400
            # direct gets a second at 50 sessions/s).  A full page: more waits, read on.  The
            # read starts READ_EARLY_S before the pause ends, to join the next commit; one
            # that takes longer joins the commit after (the models are up to two pauses
            # behind, a query waiting for a sequence ends both waits).  Through the shared
            # tail (``share``) the tail reads at the appends' pace for its other followers.
            pages = self.store.replay_pages(
                from_seq=from_seq, until_seq=until_seq, follow=follow, share=self.share
            )
            async with contextlib.aclosing(pages):
                async for page in pages:
                    await queue.put(page)
                    if follow and len(page) < PAGE:
                        await self._pause_over(early=READ_EARLY_S)
            await queue.put(None)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            await queue.put(e)

    def _fold(self, batch: list[Recorded], poison: dict[int, str] | None = None) -> None:
        """Fold ``batch`` into the models behind it; ``poison``: records to quarantine
        whatever they hold (seq -> reason)."""
        projections = self.projections
        if batch[0].seq > max(p.seq for p in projections):
            for rec in batch:  # the usual case: every projection takes every event
                self._fold_one(rec, None, poison)
            for p in projections:
                p.seq = batch[-1].seq
        else:  # a rebuild runs behind the others: they skip what they have
            for rec in batch:
                seq = rec.seq
                behind = [p for p in projections if p.seq < seq]
                if behind:
                    self._fold_one(rec, behind, poison)
                    for p in behind:
                        p.seq = seq
        self.fault("folded")

    def _fold_one(
        self, rec: Recorded, behind: list[Projection] | None, poison: dict[int, str] | None
    ) -> None:
        """One record into the models (``behind``: only these; None: all).

        Admission is decided once: domain.admission.admit, then the gatekeeper's ``check``
        (whether the event follows its aggregate's admitted history).  For a record the
        gatekeeper has already passed (a model rebuilt behind it), its ``refused`` says: a
        record it refused is skipped, the versions are not decided again."""
        seq = rec.seq
        q = self._gate
        # The gatekeeper decides unless it is ahead of this record.
        deciding = q if q is not None and (behind is None or q in behind) else None
        poisoned = poison.get(seq) if poison else None
        reason: str | None = None
        try:
            event = admit(rec.subject, rec.headers, rec.data)
        except Inadmissible as e:
            reason = e.reason
        else:
            if deciding is not None:
                reason = deciding.check(rec.subject, event)
            elif q is not None and seq in q.refused:
                reason = "refused by admission (see the quarantine model)"
            if reason is None and poisoned is None:
                for p, handler in self._dispatch.get(rec.headers[codec.TYPE_HEADER], ()):
                    if behind is not None and p not in behind:
                        continue
                    try:
                        handler(event, seq)
                    except Exception as e:  # the others still take it; this model skips it
                        if reason is None:
                            why = (
                                e.reason
                                if isinstance(e, Inadmissible)
                                else f"{type(e).__name__}: {e}"
                            )
                            reason = f"{MODEL_REASON}{p.name} cannot fold it: {why}"
            # A record only a model's write refused is admitted: a rebuild takes it.
            if deciding is not None and reason is None:
                deciding.admitted(rec.subject, event)
        if reason is None:
            reason = poisoned
        if reason is None:
            return
        quarantined(seq, rec.subject, rec.headers, reason, "projection runner")
        if deciding is not None:
            deciding.add(seq, rec.subject, rec.headers, rec.time, reason)

    async def _write_one_by_one(self, batch: list[Recorded], error: BaseException) -> None:
        """A batch failed to write on a value: write it again a record at a time and
        quarantine the records whose write fails (their models' rows are never written)."""
        log.error(
            "the read models could not store events %s-%s (%s: %s): writing them one by one",
            batch[0].seq,
            batch[-1].seq,
            type(error).__name__,
            error,
        )
        await asyncio.to_thread(self.open)  # memory back to the last commit
        for rec in batch:
            if min(p.seq for p in self.projections) >= rec.seq:
                continue
            self._fold([rec])
            try:
                await self._commit_batch()
            except _VALUE_ERRORS as e:
                await asyncio.to_thread(self.open)
                why = f"{MODEL_REASON}write failed: {type(e).__name__}: {e}"
                self._fold([rec], poison={rec.seq: why})
                await self._commit_batch()  # failing again: not this record's fault; raise

    async def _commit_batch(self) -> None:
        changes = [(p, p.take_changes()) for p in self.projections]
        # A rebuilt model replaces the old one once it reflects as much as every visible one.
        visible = max(
            self.committed[p.name] if p.name in self.building else p.seq for p in self.projections
        )
        swaps = [p for p in self.projections if p.name in self.building and p.seq >= visible]
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.to_thread(self._commit, changes, swaps)
        self._committed_at = loop.time()
        took = self._committed_at - began
        self._pause_s = min(MAX_PAUSE_S, took * (1 / self.commit_share - 1))
        for p in swaps:
            del self.building[p.name]
            self.names[p.name] = {t.name: t.name for t in p.tables}
        for p in self.projections:
            if p.name not in self.building:
                self.committed[p.name] = p.seq
        self._notify()

    def _commit(
        self, changes: list[tuple[Projection, dict[str, Changes]]], swaps: list[Projection]
    ) -> None:
        with transaction(self.con) as cur:
            self.fault("begun")
            for p, tables in changes:
                names = self.names[p.name]
                for t in p.tables:
                    if tables[t.name]:
                        write(cur, t, names[t.name], tables[t.name])
                        self.fault("wrote")
            # Every checkpoint in one statement: a statement costs DuckDB about a millisecond.
            for column, ps in (
                ("build_seq", [p for p, _ in changes if p.name in self.building]),
                ("seq", [p for p, _ in changes if p.name not in self.building]),
            ):
                if ps:
                    values = ", ".join("(?, ?)" for _ in ps)
                    cur.execute(
                        f"UPDATE {META} SET {column} = v.seq FROM (VALUES {values}) v(name, seq)"
                        f" WHERE {META}.projection = v.name",
                        [x for p in ps for x in (p.name, p.seq)],
                    )
            for p in swaps:
                self._swap(cur, p)
            self.fault("checkpointed")
        self.fault("committed")

    def _swap(self, cur: duckdb.DuckDBPyConnection, p: Projection) -> None:
        """Replace the old model's tables by the rebuilt ones, in the commit's transaction."""
        for old in self.building[p.name]:
            cur.execute(f"DROP TABLE IF EXISTS {old}")
        for t in p.tables:
            cur.execute(f"ALTER TABLE {t.name}{BUILD_SUFFIX} RENAME TO {t.name}")
        cur.execute(
            f"UPDATE {META} SET version = ?, seq = ?, tables = ?, build_version = NULL,"
            " build_seq = NULL WHERE projection = ?",
            [p.version, p.seq, ",".join(t.name for t in p.tables), p.name],
        )
        _create_views(cur, p)
        log.info("projection %s: rebuilt to version %s at seq %s", p.name, p.version, p.seq)


def _create_views(cur: duckdb.DuckDBPyConnection, p: Projection) -> None:
    for name, sql in p.views.items():
        cur.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")


def _take(item: list[Recorded] | BaseException | None, pending: list[Recorded]) -> bool:
    """Add a page the reader queued to ``pending``; True at the end (None); raise what ended
    the reader."""
    if item is None:
        return True
    if isinstance(item, BaseException):
        raise item
    pending.extend(item)
    return False
