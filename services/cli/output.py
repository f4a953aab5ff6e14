"""How `hoist` prints data: ``-o table|json|wide`` (``--json`` the same as ``-o json``) on every
command that prints some, tables on a Console that never folds piped rows, and the human forms
of durations and sizes tables show (``-o json`` keeps the raw values)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

FORMATS = ("table", "json", "wide")


def add_output_flags(p: argparse.ArgumentParser, what: str = "the data") -> None:
    """``-o/--output table|json|wide`` and its alias ``--json``: one dest, ``output``."""
    p.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default="table",
        help=f"how to print {what}: table (default), json (every field, raw values), wide"
        " (tables: every column, whole ids)",
    )
    p.add_argument(
        "--json", dest="output", action="store_const", const="json", help="the same as -o json"
    )


def wants_json(args: argparse.Namespace) -> bool:
    return getattr(args, "output", "table") == "json"


def printable(text: str) -> str:
    """``text`` with its control characters shown as escapes (``\x1b``): an error quotes what
    the user typed, which must not drive their terminal."""
    return "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in text)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str), flush=True)


def print_json_line(value: Any) -> None:
    """One JSON value per line (a stream of events: `jq` reads it as it comes)."""
    print(json.dumps(value, default=str), flush=True)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits 1 itself; `main` ends every command the same quiet way instead.
        self.quiet = True
        raise BrokenPipeError


def console(stderr: bool = False) -> Console:
    """Piped output is read by scripts and grep: rows are never folded to 80 columns."""
    out = sys.stderr if stderr else sys.stdout
    return _Console(highlight=False, width=None if out.isatty() else 400, stderr=stderr)


def human_duration(seconds: float) -> str:
    """``5.1781`` -> ``5.2s``, ``123`` -> ``2m03s``, ``3900`` -> ``1h05m``, ``90000`` ->
    ``25h00m``: what a person reads at a glance, precise to about 2 %."""
    if seconds < 0:
        return f"-{human_duration(-seconds)}"
    if seconds < 59.95:
        return f"{seconds:.1f}s"
    whole = int(seconds + 0.5)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    minutes = (whole + 30) // 60
    return f"{minutes // 60}h{minutes % 60:02d}m"


def human_bytes(n: float) -> str:
    """Binary units, as the flags take sizes (``-r mem=512m`` is 512 MiB)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # unreachable: the loop returns at TiB
