"""One reader of the log's tail for every follower of a store that caught up.

A manager that runs its read models on its own loop (``--read-models-in-process``) follows the
whole log twice: its fleet folds every event, and its read models project every event. Each
follow read every page itself and had its own signal subscription, so each appended event cost
the server and the manager two signals, two reads' worth of replies and about two read
requests. Followers of one store that have caught up now share one follow (``SharedTail``): it
reads each page once and hands it to all of them.  (The read models' child process follows
alone: its reads wait out its commits' pause, projections.runner.)

A follower takes the shared pages from the sequence it is at; if the tail is ahead of it, it
reads the gap on its own first. A follower that falls behind by more than ``MAX_RECORDS``
records (a read model pausing for its commits) is dropped, takes what it was handed, and goes
back to reading on its own; once caught up again it shares again. So a slow follower costs
the others nothing, and no follower ever misses a page: what it does not get from the tail it
reads itself. If the tail's read fails, every follower is dropped the same way and meets the
failure in its own read. The followers get the same page objects: none may change them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

MAX_RECORDS = 20_000  # handed to a follower and not yet taken, at most: then it reads alone

Page = list[Any]  # the store's Recorded, each with its .seq (the store imports this module)


class Log(Protocol):
    """What the tail reads: the store's replay_pages."""

    def replay_pages(
        self,
        *,
        from_seq: int = 1,
        until_seq: int | None = None,
        subject_filter: str | None = None,
        follow: bool = False,
        share: bool = True,
    ) -> AsyncGenerator[Page, None]: ...


@dataclass(eq=False)
class _Follower:
    run: _Run
    pages: deque[Page] = field(default_factory=deque)
    records: int = 0
    dropped: bool = False  # no more pages come: take what is left, then read alone
    wake: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class _Run:
    """One follow of the tail, from ``next_seq`` on, while it has followers."""

    next_seq: int
    followers: set[_Follower] = field(default_factory=set)
    task: asyncio.Task[None] | None = None


class SharedTail:
    def __init__(self, store: Log, page: int) -> None:
        self.store = store
        # Pages waiting for a follower are handed over as one of up to ``page`` records (the
        # store's page): a follower that took its time gets big pages, as if it read alone, not
        # the small ones the tail read (a read model commits per batch; small ones kept it behind).
        self.merge_up_to = page
        self._run: _Run | None = None

    @property
    def followers(self) -> int:
        """How many followers take the shared pages now."""
        return 0 if self._run is None else len(self._run.followers)

    async def pages(self, seq: int) -> AsyncGenerator[Page, None]:
        """The log's pages from ``seq`` on (never empty), until this follower is dropped."""
        follower = self._attach(seq)
        try:
            start = follower.run.next_seq
            if seq < start:
                # The tail is ahead of us: the gap is ours to read, all of it. A read that comes
                # up short (a replica behind, or the gap not appended yet when the tail began
                # past the head) must not end it: followed, it ends past start - 1.
                gap = self.store.replay_pages(from_seq=seq, until_seq=start - 1, follow=True)
                async with contextlib.aclosing(gap):
                    async for page in gap:
                        yield page
                seq = start
            task = asyncio.current_task()
            while True:
                while not follower.pages:
                    if follower.dropped:
                        return
                    if task is not None and task.cancelling():
                        raise asyncio.CancelledError  # one nats-py swallowed (see replay_pages)
                    follower.wake.clear()
                    await follower.wake.wait()
                page = follower.pages.popleft()
                if follower.pages and len(page) + len(follower.pages[0]) <= self.merge_up_to:
                    page = list(page)  # a copy: the tail's pages are every follower's
                    while follower.pages and len(page) + len(follower.pages[0]) <= self.merge_up_to:
                        page.extend(follower.pages.popleft())
                follower.records -= len(page)
                if page[-1].seq < seq:
                    continue  # the tail was behind us
                if page[0].seq < seq:
                    page = [r for r in page if r.seq >= seq]
                seq = page[-1].seq + 1
                yield page
        finally:
            self._detach(follower)

    def _attach(self, seq: int) -> _Follower:
        run = self._run
        if run is None:
            run = self._run = _Run(next_seq=seq)
            run.task = asyncio.ensure_future(self._follow(run))
            # Even cancelled before it began, its end lets the followers read alone.
            run.task.add_done_callback(lambda _: self._ended(run))
        follower = _Follower(run)
        run.followers.add(follower)
        return follower

    def _detach(self, follower: _Follower) -> None:
        run = follower.run
        run.followers.discard(follower)
        if not run.followers and run is self._run:
            self._run = None
            if run.task is not None:
                run.task.cancel()

    async def _follow(self, run: _Run) -> None:
        pages = self.store.replay_pages(from_seq=run.next_seq, follow=True, share=False)
        try:
            async with contextlib.aclosing(pages):
                async for page in pages:
                    run.next_seq = page[-1].seq + 1
                    for follower in list(run.followers):
                        if follower.records + len(page) > MAX_RECORDS:
                            follower.dropped = True  # it reads alone from what it took
                            run.followers.discard(follower)
                        else:
                            follower.pages.append(page)
                            follower.records += len(page)
                        follower.wake.set()
        except Exception as e:  # each follower meets it again in its own read
            log.info("the shared follow of the log ended (%s): its followers read alone", e)

    def _ended(self, run: _Run) -> None:
        if run is self._run:
            self._run = None
        for follower in run.followers:
            follower.dropped = True
            follower.wake.set()
        run.followers.clear()
