"""The manager's message bus: one table, handlers by type (base types included), commands."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from domain import events as ev
from services.manager.bus import LookAgain, MessageBus, On, Serve


def _created() -> ev.KernelCreated:
    return ev.KernelCreated(
        originator_id="s1",
        originator_version=5,
        timestamp=datetime.now(UTC),
        kernel_id="k1",
        status_info="running",
        container_id="c1",
    )


async def test_events_reach_the_handlers_of_their_type_and_base_types_in_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []

    def broken(event: object) -> None:
        raise RuntimeError("a bug in one handler")

    bus = MessageBus()
    bus.publish(_created())  # before wiring: reaches nobody, fails nothing
    bus.wire(
        events=[
            On(ev.KernelCreated, lambda e: seen.append(f"created {e.originator_id}"), broken),
            On(ev.KernelEvent, lambda e: seen.append(f"kernel {e.kernel_id}")),
            On(LookAgain, lambda n: seen.append(f"look {n.session_id}")),
        ],
        commands=[],
    )
    with caplog.at_level(logging.ERROR, "services.manager.bus"):
        bus.publish(_created())
        bus.publish(LookAgain("s2"))
        bus.publish(object())  # no handler: nothing happens
    assert seen == ["created s1", "kernel k1", "look s2"]
    assert "a bug in one handler" in caplog.text


async def test_a_command_has_one_handler_and_the_bus_is_wired_once() -> None:
    async def answer(command: LookAgain) -> str:
        return f"answered {command.session_id}"

    bus = MessageBus()
    bus.wire(events=[], commands=[Serve(LookAgain, answer)])
    assert await bus.handle(LookAgain("s1")) == "answered s1"
    assert bus.command_types() == [LookAgain]
    with pytest.raises(RuntimeError, match="wired once"):
        bus.wire(events=[], commands=[])


def test_a_type_with_two_rows_is_refused_at_wiring() -> None:
    async def answer(command: LookAgain) -> str:
        return command.session_id

    with pytest.raises(ValueError, match="LookAgain has two handlers"):
        MessageBus().wire(events=[], commands=[Serve(LookAgain, answer), Serve(LookAgain, answer)])
    with pytest.raises(ValueError, match="LookAgain has two rows"):
        MessageBus().wire(events=[On(LookAgain, print), On(LookAgain, print)], commands=[])
