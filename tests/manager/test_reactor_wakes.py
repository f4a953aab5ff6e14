"""What wakes a session's worker: every change to its session, except the worker's own (it
looks again anyway), so a change that lands while the worker waits for the session's lock is
never missed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from domain import events as ev
from services.manager.reactors import Reactors, _worker_of


def _cancelled(session_id: str) -> ev.KernelCancelled:
    return ev.KernelCancelled(
        originator_id=session_id,
        originator_version=3,
        timestamp=datetime.now(UTC),
        kernel_id="k1",
        status_info="user-requested",
        detail="",
    )


async def test_a_change_from_elsewhere_kicks_the_worker_and_its_own_does_not() -> None:
    reactors = Reactors(fleet=Any, uow=Any, agents=Any)  # type: ignore[arg-type]
    kicked: list[str] = []
    reactors.kick = kicked.append  # type: ignore[method-assign]

    reactors.session_changed(_cancelled("s1"))  # an API request's task: no worker of s1

    async def in_the_worker_of_s1() -> None:
        _worker_of.set("s1")
        reactors.session_changed(_cancelled("s1"))  # its own save: not kicked again
        reactors.session_changed(_cancelled("s2"))  # a change of another session it caused

    await asyncio.create_task(in_the_worker_of_s1())
    reactors.session_changed(_cancelled("s1"))  # the worker's context stayed in its task
    assert kicked == ["s1", "s2", "s1"]
