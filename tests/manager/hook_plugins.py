"""Lifecycle hooks for tests/manager/test_hooks.py, named with ManagerConfig.hooks as
`hoist manager --hook MODULE:ATTR` names them."""

from __future__ import annotations

import asyncio
import time

from domain.hooks import SessionInfo


class Recorder:
    """Refuses mallory; remembers what it was told (class-level: the manager makes its own)."""

    scheduled: list[SessionInfo] = []
    ended: list[SessionInfo] = []

    def on_enqueue(self, session: SessionInfo) -> str | None:
        return "mallory may not run sessions here" if session.owner == "mallory" else None

    async def on_schedule(self, session: SessionInfo) -> None:
        Recorder.scheduled.append(session)

    def on_end(self, session: SessionInfo) -> None:
        Recorder.ended.append(session)


class Raising:
    def on_enqueue(self, session: SessionInfo) -> str | None:
        raise RuntimeError("boom")

    async def on_end(self, session: SessionInfo) -> None:
        raise ValueError("no end for you")


class Hanging:
    async def on_enqueue(self, session: SessionInfo) -> str | None:
        await asyncio.sleep(3600)
        return None

    def on_schedule(self, session: SessionInfo) -> None:
        time.sleep(3600)  # a plain hook that never returns: its daemon thread holds, no more


class Answering:
    def on_enqueue(self, session: SessionInfo) -> object:
        return 42  # neither a text (a refusal) nor None
