"""The manager's message bus: one table from message type to handlers, built in one bootstrap
(services.manager.main), so what happens after a fact or a request is read in one place.

Events are the domain's (what the log says happened, published by the fleet as it folds the
log and by the unit of work once it stored them) and the few notes below that are no fact of
the log; their handlers only schedule work (wake a loop, kick a session's worker) and never
await, so publishing is synchronous and costs nothing when nobody listens.  Commands are the
domain.contracts requests; each has one handler, which answers the reply.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

M = TypeVar("M")

EventHandler = Callable[[Any], object]
CommandHandler = Callable[[Any], Awaitable[object]]


@dataclass(frozen=True, init=False)
class On(Generic[M]):
    """One row of the events table: ``On(Event, *handlers)``, each handler typed for ``Event``
    (mypy checks them where the table is written)."""

    event: type[M]
    handlers: tuple[Callable[[M], object], ...]

    def __init__(self, event: type[M], *handlers: Callable[[M], object]) -> None:
        object.__setattr__(self, "event", event)
        object.__setattr__(self, "handlers", handlers)


@dataclass(frozen=True)
class Serve(Generic[M]):
    """One row of the commands table: the command's type and its one handler, typed for it."""

    command: type[M]
    handler: Callable[[M], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class RoomFreed:
    """A kernel stopped occupying an agent or an owner's quota: a pending session may fit."""


@dataclass(frozen=True, slots=True)
class LookAgain:
    """The session's worker must look at it again: someone else wrote it (the view reloaded
    it from the log), or agent resource sync found a create that never reached its agent."""

    session_id: str


class MessageBus:
    """``bus = MessageBus()``; the parts are built with ``bus.publish``; then ``bus.wire(...)``
    once, with the whole table of ``On`` and ``Serve`` rows (publishing before that reaches
    nobody)."""

    def __init__(self) -> None:
        self._events: dict[type, tuple[EventHandler, ...]] = {}
        self._commands: dict[type, CommandHandler] = {}
        self._by_type: dict[type, tuple[EventHandler, ...]] = {}
        self._wired = False

    def wire(self, events: Iterable[On[Any]], commands: Iterable[Serve[Any]]) -> None:
        if self._wired:
            raise RuntimeError("the bus is wired once, in the bootstrap")
        for row in events:
            if row.event in self._events:
                raise ValueError(f"{row.event.__name__} has two rows: give it one")
            self._events[row.event] = row.handlers
        for command in commands:
            if command.command in self._commands:
                raise ValueError(f"{command.command.__name__} has two handlers: give it one")
            self._commands[command.command] = command.handler
        self._by_type.clear()
        self._wired = True

    def publish(self, event: object) -> None:
        """Call every handler of ``event``'s type and of its base types; a failing handler is
        logged and the others still run."""
        cls = type(event)
        handlers = self._by_type.get(cls)
        if handlers is None:
            handlers = self._by_type[cls] = tuple(
                h for base in cls.__mro__ for h in self._events.get(base, ())
            )
        for handler in handlers:
            try:
                handler(event)
            except Exception:
                log.exception("handler %s of %s", getattr(handler, "__qualname__", handler), cls)

    def command_types(self) -> list[type]:
        return list(self._commands)

    async def handle(self, command: object) -> object:
        """The reply of ``command``'s handler."""
        return await self._commands[type(command)](command)
