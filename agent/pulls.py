"""Image pulls of one agent: one pull per image however many callers want it, a bounded number
in parallel, retries on transient errors, a timeout and a stall deadline, throttled progress.

``request(image)`` is synchronous on purpose: the check "is this image already being pulled?"
and the registration of a new task happen with no await in between, so concurrent callers can
never start two pulls of one image.  The pull's facts (started / pulled / failed) go to the
``PullEvents`` the agent supplies, progress to its ``publish`` callback.

Each task knows who waits for it: kernels by id, or an anonymous caller (a preload, an admin's
pull, a manager that names no kernel).  ``release`` takes kernels off it; when the last one goes
and no anonymous caller wants it, the pull is cancelled (the runtime's pull stops) and ends
``cancelled``: recorded as ImagePullFailed with ``cancelled``, its last progress ``cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from agent.runtime.base import PulledImage, PullError, Runtime
from agent.runtime.base import PullProgress as LayerUpdate
from domain.rpc import LayerProgress, PullProgress, PullState
from transport.tasks import Tasks

log = logging.getLogger(__name__)

AuthLookup = Callable[[str], dict[str, str] | None]
Publish = Callable[[PullProgress], Awaitable[None]]


class PullEvents(Protocol):
    """Where a pull's facts are recorded (the agent's aggregate)."""

    async def pull_started(self, image: str, task_id: str) -> None: ...
    async def pulled(self, task_id: str, image: PulledImage, duration_s: float) -> None: ...
    async def pull_failed(
        self, image: str, task_id: str, reason: str, cancelled: bool = False
    ) -> None: ...


@dataclass(frozen=True)
class PullPolicy:
    max_parallel: int = 3
    timeout_s: float = 7200.0  # whole task, retries included (Backend.AI's default: 2 h)
    stall_timeout_s: float = 120.0  # no new bytes (nor layer status change) for this long
    retries: int = 3  # extra attempts after a transient error
    backoff_s: float = 2.0  # first retry delay, doubled each time ...
    backoff_max_s: float = 60.0  # ... up to this
    progress_interval_s: float = 0.1  # at most 10 progress messages a second per pull

    def __post_init__(self) -> None:
        for name in ("timeout_s", "stall_timeout_s", "progress_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if self.max_parallel < 1:
            raise ValueError(f"max_parallel must be >= 1, got {self.max_parallel!r}")
        if self.retries < 0 or self.backoff_s < 0 or self.backoff_max_s < 0:
            raise ValueError("retries, backoff_s and backoff_max_s must be >= 0")


@dataclass
class PullTask:
    task_id: str
    image: str
    state: PullState = "queued"
    reason: str | None = None
    attempts: int = 0
    layers: dict[str, LayerProgress] = field(default_factory=dict)
    # Set once ImagePullStarted is recorded (or recording failed): callers reply after it.
    recorded: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when the task is over and its outcome recorded (or recording failed).
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    last_activity: float = field(default_factory=time.monotonic)
    requested_at: float = field(default_factory=time.monotonic)  # queue time counts (metrics)
    # Who waits for it: kernels by id (a check-and-pull naming them), and whether anyone asked
    # without naming a kernel (a preload, an admin's pull): then it is never cancelled.
    kernels: set[str] = field(default_factory=set)
    anonymous: bool = False
    cancel_reason: str | None = None  # set by cancel(): the pull stops with this reason
    work: asyncio.Task[tuple[PulledImage, float]] | None = None  # the pull in its slot

    @property
    def current(self) -> int:
        return sum(layer.current for layer in self.layers.values())

    @property
    def total(self) -> int:
        return sum(layer.total for layer in self.layers.values())

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "cancelled")

    def update(self, p: LayerUpdate) -> None:
        prev = self.layers.get(p.layer)
        # A retry starts layers from 0 again: keep the bytes already reported, so the image's
        # sum never goes back (watchers draw it as a progress bar).
        current = max(p.current, prev.current if prev else 0)
        total = max(p.total, prev.total if prev else 0, current)
        layer = LayerProgress(id=p.layer, status=p.status, current=current, total=total)
        if layer != prev:
            self.layers[p.layer] = layer
            self.last_activity = time.monotonic()
            self.changed.set()


class _Abort(Exception):
    """A pull given up by the agent (timeout, stall); ``reason`` goes to ImagePullFailed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Cancelled(Exception):
    """The pull was stopped by ``PullManager.cancel`` (no kernel waits for it any more)."""


class PullManager:
    """All pulls of one agent process."""

    HISTORY = 1000  # finished tasks remembered for pull-status

    def __init__(
        self,
        agent_id: str,
        runtime: Runtime,
        events: PullEvents,
        publish: Publish,
        policy: PullPolicy | None = None,
        auth: AuthLookup | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.runtime = runtime
        self.events = events
        self.publish = publish
        self.policy = policy or PullPolicy()
        self.auth = auth or (lambda image: None)
        self.tasks: OrderedDict[str, PullTask] = OrderedDict()  # by task id, oldest first
        self.active: dict[str, PullTask] = {}  # image -> its unfinished task
        self._slots = asyncio.Semaphore(self.policy.max_parallel)
        self._runners = Tasks()
        self.pulls_started = 0  # attempts that reached the runtime (for tests and benchmarks)

    def request(self, image: str, kernel_ids: Iterable[str] = ()) -> PullTask:
        """The unfinished task pulling ``image``, or a new one (queued until a slot is free);
        ``kernel_ids`` wait for it (none: an anonymous caller, who never releases it)."""
        task = self.active.get(image)
        if task is None or task.cancel_reason is not None:  # a cancelled one is ending: anew
            task = self._new(image)
        waiters = set(kernel_ids)
        task.kernels |= waiters
        task.anonymous = task.anonymous or not waiters
        return task

    def release(self, image: str, kernel_ids: Iterable[str], reason: str) -> PullTask | None:
        """``kernel_ids`` no longer wait for ``image``'s pull: it is cancelled when they were
        its last waiters and no anonymous caller wants it.  The image's task in flight (as it
        is now), or None."""
        task = self.active.get(image)
        if task is None:
            return None
        gone = task.kernels & set(kernel_ids)
        task.kernels -= gone
        if gone and not task.kernels and not task.anonymous:
            self.cancel(task, reason)
        return task

    def cancel(self, task: PullTask, reason: str) -> None:
        """Stop ``task`` (queued, pulling or waiting to retry): it ends ``cancelled``, the
        runtime's pull is cancelled (docker: the API stream closed; dummy: the simulation)."""
        if task.finished or task.cancel_reason is not None:
            return
        task.cancel_reason = reason
        if task.work is not None:
            task.work.cancel()

    def _new(self, image: str) -> PullTask:
        task = PullTask(task_id=uuid.uuid4().hex, image=image)
        self.active[image] = task
        self.tasks[task.task_id] = task
        while len(self.tasks) > self.HISTORY:
            oldest = next(iter(self.tasks.values()))
            if not oldest.finished:
                break
            self.tasks.popitem(last=False)
        self._runners.spawn(self._run(task), name=f"pull {image}")
        return task

    def get(self, task_id: str) -> PullTask | None:
        return self.tasks.get(task_id)

    async def close(self) -> None:
        """Cancel every pull (the agent stops; a restarted agent does not know them)."""
        await self._runners.stop()

    async def _run(self, task: PullTask) -> None:
        publisher: asyncio.Task[None] | None = None
        try:
            try:
                await self.events.pull_started(task.image, task.task_id)
            finally:
                task.recorded.set()
            publisher = asyncio.create_task(self._publish_loop(task))
            try:
                pulled, started = await self._in_slot(task)
            except _Cancelled:
                task.state, task.reason = "cancelled", task.cancel_reason
                log.info(
                    "agent %s: pull %s of %s cancelled: %s",
                    self.agent_id,
                    task.task_id,
                    task.image,
                    task.reason,
                )
            except (PullError, _Abort) as e:
                task.state, task.reason = "failed", e.reason
                log.warning(
                    "agent %s: pull %s of %s failed: %s",
                    self.agent_id,
                    task.task_id,
                    task.image,
                    e.reason,
                )
            else:
                task.state = "done"
                # The runtime's last report may miss layers already present: end at the total.
                task.layers = {
                    k: LayerProgress(id=k, status=v.status, current=v.total, total=v.total)
                    for k, v in task.layers.items()
                }
            finally:
                self._forget(task)
                task.changed.set()
            await publisher  # the final state is published before the outcome is recorded
            publisher = None
            if task.state == "done":
                await self.events.pulled(task.task_id, pulled, time.monotonic() - started)
            else:
                cancelled = task.state == "cancelled"
                reason = task.reason or "failed"
                await self.events.pull_failed(task.image, task.task_id, reason, cancelled)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Recording failed (store unreachable): the task is over for this process either way.
            log.exception("agent %s: pull task %s of %s", self.agent_id, task.task_id, task.image)
            if not task.finished:
                task.state, task.reason = "failed", "internal error: see the agent log"
        finally:
            self._forget(task)
            task.ended.set()
            if publisher is not None:
                publisher.cancel()

    async def _in_slot(self, task: PullTask) -> tuple[PulledImage, float]:
        """The pull (its attempts, once a slot is free) and when it started; _Cancelled when
        ``cancel`` stopped it.  It runs as a task of its own so that a cancel stops it wherever
        it is (queued, pulling, backing off) and nothing else of the runner."""

        async def work() -> tuple[PulledImage, float]:
            async with self._slots:
                task.state = "pulling"
                started = time.monotonic()  # the pull's duration, not its time in the queue
                return await self._attempts(task, started + self.policy.timeout_s), started

        if task.cancel_reason is not None:
            raise _Cancelled
        task.work = asyncio.create_task(work())
        try:
            return await task.work
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancel_reason is None or (current is not None and current.cancelling()):
                raise  # the agent stops (close): not this pull's cancel
            raise _Cancelled from None
        finally:
            task.work = None

    def _forget(self, task: PullTask) -> None:
        """``task`` is no longer the image's pull in flight (unless a new one already is)."""
        if self.active.get(task.image) is task:
            del self.active[task.image]

    async def _attempts(self, task: PullTask, deadline: float) -> PulledImage:
        policy = self.policy
        delay = policy.backoff_s
        while True:
            task.attempts += 1
            try:
                return await self._attempt(task, deadline)
            except PullError as e:
                if not e.retryable or task.attempts > policy.retries:
                    if e.retryable:
                        raise _Abort(f"{e.reason} (gave up after {task.attempts} attempts)") from e
                    raise
                wait = min(delay, policy.backoff_max_s)
                if time.monotonic() + wait >= deadline:
                    reason = f"timeout: not done after {policy.timeout_s:g}s ({e.reason})"
                    raise _Abort(reason) from e
                log.info(
                    "agent %s: pull of %s failed (%s), retry %d in %gs",
                    self.agent_id,
                    task.image,
                    e.reason,
                    task.attempts,
                    wait,
                )
                await asyncio.sleep(wait)
                delay *= 2

    async def _attempt(self, task: PullTask, deadline: float) -> PulledImage:
        self.pulls_started += 1
        task.last_activity = time.monotonic()
        pull = asyncio.create_task(
            self.runtime.pull(task.image, task.update, self.auth(task.image))
        )
        stall = self.policy.stall_timeout_s
        tick = min(1.0, stall / 4, self.policy.timeout_s / 4)
        try:
            while True:
                done, _ = await asyncio.wait({pull}, timeout=tick)
                if done:
                    return pull.result()
                now = time.monotonic()
                if now - task.last_activity >= stall:
                    raise _Abort(f"stalled: no progress for {stall:g}s")
                if now >= deadline:
                    raise _Abort(f"timeout: not done after {self.policy.timeout_s:g}s")
        finally:
            if not pull.done():
                pull.cancel()
                with contextlib.suppress(BaseException):
                    await pull

    async def _publish_loop(self, task: PullTask) -> None:
        """Publish the latest state at most every progress_interval_s, always the final one."""
        while True:
            await task.changed.wait()
            task.changed.clear()
            finished = task.finished
            try:
                await self.publish(self.progress(task))
            except Exception as e:  # progress is a view: never fail a pull for it
                log.warning(
                    "agent %s: progress of %s not published: %s", self.agent_id, task.task_id, e
                )
            if finished:
                return
            await asyncio.sleep(self.policy.progress_interval_s)

    def progress(self, task: PullTask) -> PullProgress:
        return PullProgress(
            agent_id=self.agent_id,
            task_id=task.task_id,
            image=task.image,
            layers=list(task.layers.values()),
            current=task.current,
            total=task.total,
            done=task.finished,
            error=task.reason if task.state in ("failed", "cancelled") else None,
            cancelled=task.state == "cancelled",
        )
