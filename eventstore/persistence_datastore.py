"""The eventsourcing persistence module's connection to the stream: a private event loop that
runs the store's coroutines for the library's synchronous calls, and the datastore every
recorder of a Factory shares (the store, its local copy, the quarantine, the library's errors
for the store's)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
from collections.abc import Coroutine
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from eventsourcing.persistence import (
    DataError,
    OperationalError,
    PersistenceError,
    ProgrammingError,
)
from nats.errors import Error as NatsError

from domain.subjects import check_token
from eventstore.persistence_copy import LocalCopy
from eventstore.persistence_records import (
    Quarantined,
)
from eventstore.persistence_versions import Versions
from eventstore.store import (
    MAX_BATCH,
    EventStore,
    LimitError,
    Recorded,
    StoreError,
    StoreUnavailable,
)
from transport.client import Client, connect

T = TypeVar("T")
# The module's one log, wherever in it a record comes from (its name is what users filter).
log = logging.getLogger("eventstore.persistence")

CONNECT_TIMEOUT = 10.0  # default seconds to reach NATS_URL when a Factory is constructed
CALL_TIMEOUT = 60.0  # seconds a synchronous call waits for the private loop
MAX_QUARANTINED = 10_000  # poison messages listed (and logged); past that only counted
LOCAL_COPY_MB = 256  # default bound of the stream's local copy (persistence_copy)

# What an application can do about a save that failed (an eventsourcing app has no idempotency
# key to send again: its retry is the command again, on the aggregate as stored).
MAYBE_SAVED = (
    "the save may or may not have been stored: get the aggregate again (repository.get)"
    " before retrying the command"
)
NOT_SAVED = "nothing was stored: retry the save"


class _PrivateLoop:
    """An asyncio loop in a daemon thread: synchronous code submits coroutines to it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._in_flight: set[Future[Any]] = set()
        self._lock = threading.Lock()

    def _run(self) -> None:
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()  # here, where it ran: any thread may have stopped it

    def on_own_thread(self) -> bool:
        # Alive first: a thread's ident is reused once it ended.
        return self._thread.is_alive() and threading.get_ident() == self._thread.ident

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        with self._lock:
            self._in_flight.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._in_flight.discard(future)

    def cancel_in_flight(self) -> None:
        """Cancel every call and subscription still running (the factory is closing)."""
        with self._lock:
            in_flight = list(self._in_flight)
        for future in in_flight:
            future.cancel()

    def check(self) -> None:
        """Refuse a synchronous call from where waiting would stall or deadlock a loop."""
        refusal = self._refusal()
        if refusal:
            raise RuntimeError(refusal)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT) -> T:
        """Run ``coro`` on the private loop and wait for its result in this thread."""
        refusal = self._refusal()
        if refusal:
            coro.close()
            raise RuntimeError(refusal)
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except FutureTimeout:
            # Since Python 3.11 a request's own TimeoutError is this one too: only a future
            # still running means the whole call outlived ``timeout``.
            if future.done():
                raise OperationalError(
                    "a JetStream request was not answered (check that nats-server is up and that"
                    " this NATS user may use the stream: a permissions violation is in the"
                    f" server's log and is answered by no one); if this was a save, {MAYBE_SAVED}"
                ) from None
            future.cancel()
            raise OperationalError(
                f"JetStream did not answer within {timeout}s (check that nats-server is up); if"
                f" this was a save, {MAYBE_SAVED}"
            ) from None
        except CancelledError:
            raise OperationalError(
                "the persistence factory was closed while this call was running"
            ) from None

    def _refusal(self) -> str | None:
        if self.on_own_thread():
            return (
                "a synchronous eventsourcing recorder method was called on its own private "
                "event loop thread, which would deadlock; call it from another thread"
            )
        if not self._thread.is_alive():
            return "the persistence factory is closed; construct a new Application/Factory"
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return None
        return (
            "a synchronous eventsourcing recorder method was called from a running event loop,"
            " which it would block; run it in a worker thread, e.g."
            " `await asyncio.to_thread(app.save, aggregate)`"
        )

    def close(self) -> None:
        """Stop the loop and end its thread (which closes the loop); from any thread."""
        if self.on_own_thread():  # cannot wait for itself: it stops after this callback
            self.loop.stop()
        elif self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # it closed itself meanwhile
                self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()


class JetStreamDatastore:
    """One stream, one NATS connection and the private loop that owns it."""

    def __init__(
        self,
        url: str,
        stream: str,
        connect_timeout: float = CONNECT_TIMEOUT,
        local_copy_bytes: int = LOCAL_COPY_MB << 20,
    ) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self.stream = check_token(stream, "NATS_STREAM")
        self.prefix = f"es.{stream}"
        self.events_filter = f"{self.prefix}.events.>"
        self._loop = _PrivateLoop(name=f"eventsourcing-jetstream-{stream}")
        self._nc: Client | None = None
        self._subscription_store: EventStore | None = None
        self._subscription_lock = asyncio.Lock()
        self._quarantined: dict[int, Quarantined] = {}  # seq -> why; also "logged already"
        self.quarantined_count = 0  # distinct poison messages met, listed or not
        self._quarantine_lock = threading.Lock()  # read from callers' threads
        self._closed = False
        try:
            self.store: EventStore = self.run(self._open())
            # Which records are valid by version, for the reads that go to the server.
            self.versions = Versions(self.store, self.quarantine)
            self.copy = LocalCopy(self.store, self.prefix, self.quarantine, local_copy_bytes)
            if self.run(self.copy.start()):
                self._loop.submit(self.copy.follow())  # ends with close(): cancel_in_flight
        except BaseException:
            self.close()
            raise

    async def _open(self) -> EventStore:
        # no_echo: the server does not send this connection's appends back to its own
        # subscriptions, the local copy's signal among them: the ack says it all, and each
        # echo cost about as much again as the append (measured).
        self._nc = await self._connect(no_echo=True)
        store = EventStore(self._nc, self.stream, [f"{self.prefix}.>"])
        try:
            await store.ensure_stream()
        except StoreError as e:  # the stream is not as the module needs it
            raise ProgrammingError(str(e)) from e
        return store

    async def _connect(self, **options: Any) -> Client:
        try:
            # nats-py keeps retrying a first connect for minutes: bound it, then say why.
            return await asyncio.wait_for(
                connect(
                    self.url,
                    name=f"eventsourcing-{self.stream}",
                    connect_timeout=2,
                    error_cb=self._on_nats_error,
                    **options,
                ),
                self.connect_timeout,
            )
        except Exception as e:
            raise OperationalError(
                f"cannot connect to NATS_URL={self.url} within {self.connect_timeout}s ({e!r}):"
                " start nats-server or fix NATS_URL"
            ) from e

    async def subscription_store(self) -> EventStore:
        """The store subscriptions follow: on a second connection, opened on first use, whose
        signals include this process's own appends (the first one's do not: no_echo)."""
        async with self._subscription_lock:
            if self._subscription_store is None:
                nc = await self._connect()
                self._subscription_store = EventStore(nc, self.stream, [f"{self.prefix}.>"])
            return self._subscription_store

    async def _on_nats_error(self, error: Exception) -> None:
        log.warning("NATS connection of stream %s: %r", self.stream, error)

    def run(self, coro: Coroutine[Any, Any, T], *, saving: bool = False) -> T:
        """``coro`` on the private loop; the store's and NATS's errors as the library's
        (``saving``: ``coro`` appends, so the error says whether anything may be stored)."""
        try:
            return self._loop.run(coro)
        except Exception as e:
            mapped = self.library_error(e, saving=saving)
            if mapped is e:
                raise
            raise mapped from e

    def library_error(self, e: Exception, *, saving: bool = False) -> Exception:
        """The library's exception for ``e`` (``e`` itself if it is one, or no store error)."""
        if isinstance(e, PersistenceError):
            return e
        if isinstance(e, LimitError):
            return DataError(self._over_limit(e))
        if isinstance(e, StoreUnavailable):
            if not saving:
                return OperationalError(f"{e.reason}; retry")
            return OperationalError(f"{e.reason}; {MAYBE_SAVED if e.stored else NOT_SAVED}")
        if isinstance(e, StoreError):  # a refusal: nothing stored
            return OperationalError(str(e))
        if isinstance(e, NatsError):  # the connection failed (maybe while an append was sent)
            advice = MAYBE_SAVED if saving else "retry"
            return OperationalError(f"NATS connection of stream {self.stream}: {e!r}; {advice}")
        return e

    def _over_limit(self, e: LimitError) -> str:
        if e.limit == "messages":
            return (
                f"one save holds at most {MAX_BATCH} records (its events, and a process"
                f" application's tracking record: one atomic JetStream batch): {e}"
            )
        if e.limit == "subject":
            token = self.store.max_subject_bytes - len(self.subject("events", "s"))
            return (
                f"{e}. An originator id (and a tracking record's application name) is its"
                f" subject's last token, in base64: on stream {self.stream} a str id takes at"
                f" most {token * 3 // 4} UTF-8 bytes (a UUID always fits)"
            )
        return f"{e} (an event's state and topic, and the module's headers)"

    def check(self) -> None:
        self._loop.check()

    def quarantine(self, record: Recorded, reason: str) -> None:
        """Note a poison message; logged the first time only (readers meet it on every read)."""
        with self._quarantine_lock:
            if record.seq in self._quarantined:
                return
            self.quarantined_count += 1
            if len(self._quarantined) >= MAX_QUARANTINED:
                if self.quarantined_count == MAX_QUARANTINED + 1:
                    log.warning(
                        "stream %s: over %d poison messages; no longer listing them",
                        self.stream,
                        MAX_QUARANTINED,
                    )
                return
            self._quarantined[record.seq] = Quarantined(record.seq, record.subject, reason)
        log.warning(
            "stream %s: message %d on %s is no eventsourcing record (%s): skipped",
            self.stream,
            record.seq,
            record.subject[:200],
            reason,
        )

    @property
    def quarantined(self) -> list[Quarantined]:
        with self._quarantine_lock:
            return sorted(self._quarantined.values(), key=lambda q: q.seq)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return self._loop.submit(coro)

    def subject(self, kind: str, token: str) -> str:
        return f"{self.prefix}.{kind}.{token}"

    def close(self) -> None:
        """Close the connections and end the private loop; quiet and safe from any thread, from
        an Application's ``__del__`` (a GC, at interpreter exit) too."""
        if self._closed or sys.is_finalizing():
            # At interpreter exit (an application never closed: its __del__) the loop's daemon
            # thread may be gone mid-run, so nothing can be waited for: the process ends, and
            # its sockets with it. Every append waited for its ack: nothing is lost.
            return
        self._closed = True
        # Calls still running (a reader thread, a subscription) would hold the connection
        # open: end them first. Every append waited for its ack, so nothing is left to flush.
        self._loop.cancel_in_flight()
        second = self._subscription_store.nc if self._subscription_store else None
        connections = [nc for nc in (self._nc, second) if nc is not None and not nc.is_closed]
        self._nc = self._subscription_store = None
        if self._loop.on_own_thread():  # a GC on the loop's thread: it closes them, then stops
            self._loop.loop.create_task(self._close(connections, then_stop=True))
            return
        if self._loop.loop.is_running():
            with contextlib.suppress(Exception):  # closing anyway; the server may be gone
                self._loop.run(self._close(connections), timeout=10)
        self._loop.close()

    async def _close(self, connections: list[Client], then_stop: bool = False) -> None:
        for nc in connections:
            with contextlib.suppress(Exception):
                await nc.close()
        if then_stop:
            self._loop.close()
