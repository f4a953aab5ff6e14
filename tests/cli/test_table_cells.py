"""Table cells print values as they are: text in square brackets is no markup."""

from __future__ import annotations

from rich.console import Console

from services.cli.read import _table


def test_brackets_in_a_cell_are_printed_as_they_are() -> None:
    console = Console(width=200, record=True, highlight=False)
    reason = "failed-to-start: capabilities: [[gpu]] [bold]x[/bold]"
    console.print(_table(["status_info", "owner"], [[reason, "[red]ann"]]))
    out = console.export_text()
    assert reason in out
    assert "[red]ann" in out
