"""Table cells print values as they are: text in square brackets is no markup."""

from __future__ import annotations

from rich.console import Console

from services.cli.read import _header, _table


def test_brackets_in_a_cell_are_printed_as_they_are() -> None:
    console = Console(width=200, record=True, highlight=False)
    reason = "failed-to-start: capabilities: [[gpu]] [bold]x[/bold]"
    console.print(_table(["status_info", "owner"], [[reason, "[red]ann"]]))
    out = console.export_text()
    assert reason in out
    assert "[red]ann" in out


def test_durations_and_sizes_read_at_a_glance() -> None:
    from services.cli.output import human_duration
    from services.cli.read import _cell

    assert [human_duration(s) for s in (0.04, 5.1781, 59.9, 123, 3599.4, 3900, 90000)] == [
        "0.0s", "5.2s", "59.9s", "2m03s", "59m59s", "1h05m", "25h00m",
    ]  # fmt: skip
    assert _cell("duration_s", 5.1781) == "5.2s" and _cell("ran_s", 123.4) == "2m03s"
    assert _cell("bytes", 12.3 * 1024**2) == "12.3 MiB"


def test_headers_drop_the_unit_their_cells_say() -> None:
    assert [_header(c) for c in ("ran_s", "duration_s", "size_bytes", "free_mem", "owner")] == [
        "ran",
        "duration",
        "size",
        "free_mem",
        "owner",
    ]
