"""Lifecycle hooks (domain.hooks) on the manager: the plugins are loaded at start, each call
has a time limit, and a hook that fails never stops the manager.

Plugins come from the entry point group ``hoist.hooks`` (every installed one) and from
`hoist manager --hook MODULE:ATTR`; ATTR is an object with the hook methods, or a class made
with no arguments.  One that cannot be loaded is logged and left out.  At enqueue the hooks run
one after the other before anything is recorded, and the first refusal refuses the create;
after a schedule or an end they run in a task of their own on the leading manager, so a slow
hook delays no reaction.  A hook that raises or outlives ``timeout_s`` is skipped and the
session's log gets a HookSkipped naming it and why.  A plain (not ``async``) hook runs in a
daemon thread: one that hangs keeps its thread, never the manager's loop or its exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from domain import events as ev
from domain.hooks import SessionInfo, session_info
from domain.status import TERMINAL
from services.manager.fleet import Fleet
from services.manager.uow import UnitOfWork
from transport.tasks import Tasks

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "hoist.hooks"
DEFAULT_TIMEOUT_S = 2.0
METHODS: dict[ev.HookPhase, str] = {
    "enqueue": "on_enqueue",
    "schedule": "on_schedule",
    "end": "on_end",
}
Skipped = list[tuple[str, str]]  # (hook, why) of the hooks the manager went on without


@dataclass(frozen=True)
class Hook:
    name: str
    target: object


class HookFailed(Exception):
    """The hook raised, answered what it may not, or outlived its time limit."""


class Hooks:
    def __init__(self, hooks: Sequence[Hook] = (), timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not timeout_s > 0:
            raise ValueError(f"hook_timeout_s must be > 0 seconds, got {timeout_s!r}")
        self.hooks = list(hooks)
        self.timeout_s = timeout_s

    @classmethod
    def load(cls, specs: Sequence[str] = (), timeout_s: float = DEFAULT_TIMEOUT_S) -> Hooks:
        """The installed plugins (entry points) and those ``specs`` name (``MODULE:ATTR``)."""
        found: list[Hook] = []
        for point in entry_points(group=ENTRY_POINT_GROUP):
            try:
                found.append(Hook(point.name, _made(point.load())))
            except Exception as e:
                log.error("hook %s (entry point %s) not loaded: %r", point.name, point.value, e)
        for spec in specs:
            module, _, attr = spec.partition(":")
            try:
                found.append(
                    Hook(attr or module, _made(getattr(importlib.import_module(module), attr)))
                )
            except Exception as e:
                log.error("hook %s not loaded: %r", spec, e)
        for hook in found:
            log.info("lifecycle hook %s loaded (%s)", hook.name, type(hook.target).__name__)
        return cls(found, timeout_s)

    async def enqueue(self, info: SessionInfo) -> tuple[str | None, Skipped]:
        """The first refusal (``refused by hook NAME: TEXT``), and the hooks skipped."""
        skipped: Skipped = []
        for hook in self.hooks:
            try:
                answer = await self._call(hook, "enqueue", info)
            except HookFailed as e:
                skipped.append((hook.name, str(e)))
                continue
            if answer is not None and not isinstance(answer, str):
                skipped.append((hook.name, f"answered {type(answer).__name__}, not a text or None"))
            elif answer:
                return f"refused by hook {hook.name}: {answer}", skipped
        return None, skipped

    async def after(self, phase: ev.HookPhase, info: SessionInfo) -> Skipped:
        """Tell every hook of ``phase`` (schedule, end); the hooks skipped."""
        skipped: Skipped = []
        for hook in self.hooks:
            try:
                await self._call(hook, phase, info)
            except HookFailed as e:
                skipped.append((hook.name, str(e)))
        return skipped

    async def _call(self, hook: Hook, phase: ev.HookPhase, info: SessionInfo) -> object:
        method = getattr(hook.target, METHODS[phase], None)
        if method is None:
            return None
        try:
            if inspect.iscoroutinefunction(method):
                return await asyncio.wait_for(method(info), self.timeout_s)
            return await asyncio.wait_for(_in_thread(method, info), self.timeout_s)
        except TimeoutError:
            log.warning("hook %s at %s: no answer within %gs", hook.name, phase, self.timeout_s)
            raise HookFailed(f"no answer within {self.timeout_s:g}s") from None
        except Exception as e:
            log.warning("hook %s at %s raised %r", hook.name, phase, e)
            raise HookFailed(f"raised {type(e).__name__}: {e}") from None


class HookCalls:
    """The bus's side (its handlers are plain calls): after a schedule, and once a session's
    last kernel ended, the hooks run in a task of their own; what they skipped is noted in the
    session's log."""

    REMEMBERED = 10_000  # ended sessions remembered, so one end is told once

    def __init__(self, hooks: Hooks, fleet: Fleet, uow: UnitOfWork) -> None:
        self.hooks = hooks
        self.fleet = fleet
        self.uow = uow
        self._told_ended: OrderedDict[str, None] = OrderedDict()
        self._tasks = Tasks()

    def scheduled(self, event: ev.SessionScheduled) -> None:
        self._spawn("schedule", event.originator_id)

    def kernel_changed(self, event: ev.KernelEvent) -> None:
        sid = event.originator_id
        session = self.fleet.sessions.get(sid)
        if session is None or session.status not in TERMINAL or sid in self._told_ended:
            return
        self._told_ended[sid] = None
        if len(self._told_ended) > self.REMEMBERED:
            self._told_ended.popitem(last=False)
        self._spawn("end", sid)

    async def stop(self) -> None:
        await self._tasks.stop()

    def _spawn(self, phase: ev.HookPhase, sid: str) -> None:
        session = self.fleet.sessions.get(sid)
        if self.hooks.hooks and session is not None:
            self._tasks.spawn(self._after(phase, sid, session_info(session)), f"hooks-{phase}")

    async def _after(self, phase: ev.HookPhase, sid: str, info: SessionInfo) -> None:
        skipped = await self.hooks.after(phase, info)
        if skipped:
            await self.uow.try_change(sid, noted(phase, skipped), fenced=False)


def noted(phase: ev.HookPhase, skipped: Skipped) -> Callable[[Any], None]:
    """The decision that notes each skipped hook in the session's log."""

    def note(session: Any) -> None:
        for hook, why in skipped:
            session.hook_skipped(hook, phase, why)

    return note


def _made(target: object) -> object:
    """A class is made with no arguments; anything else is the hook itself."""
    return target() if isinstance(target, type) else target


async def _in_thread(method: Callable[[SessionInfo], object], info: SessionInfo) -> object:
    """``method(info)`` in a daemon thread: a call that never returns holds its thread only."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[object] = loop.create_future()

    def settle(result: object, error: BaseException | None) -> None:
        if done.done():  # the caller stopped waiting (its time limit)
            return
        if error is None:
            done.set_result(result)
        else:
            done.set_exception(error)

    def run() -> None:
        try:
            result, error = method(info), None
        except BaseException as e:
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the manager stopped meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="hoist-hook", daemon=True).start()
    return await done
