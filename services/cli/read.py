"""The read commands of `hoist` (ps, sessions, agents, images, occupancy, pulls): one
``hoist.query.*`` request each (served beside the projections), printed as a table or JSON.

Replies are ``{"seq", "rows": [{column: value}], "truncated"}``.  A table shows the columns a
person scans first, ids cut to 12 characters, durations and sizes in human form; ``-o wide``
every column and whole ids; ``-o json`` (``--json``) the reply as it came, raw values.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from client.connection import CliError, Connection
from domain import subjects
from domain.image_ref import familiar
from domain.limits import LABEL_KEY, LABEL_VALUE
from domain.status import TERMINAL, KernelStatus
from services.cli.output import (
    add_output_flags,
    human_bytes,
    human_duration,
    print_json,
    wants_json,
)

# command -> (query name, columns shown in the table, in order; missing ones are skipped)
COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ps": (
        "kernels",
        (
            "kernel_id",
            "session_id",
            "session_name",
            "hostname",
            "owner",
            "image",
            "agent_id",
            "status",
            "status_info",
            "exit_code",
            "ran_s",
            "ports",
            "cpu",
            "mem",
            "status_changed_at",
        ),
    ),
    "sessions": (
        "sessions",
        (
            "session_id",
            "name",
            "owner",
            "image",
            "session_type",
            "cluster_size",
            "status",
            "status_info",
            "labels",
            "created_at",
        ),
    ),
    "agents": (
        "agents",
        (
            "agent_id",
            "resource_group",
            "runtime",
            "alive",
            "status_info",
            "cpu",
            "free_cpu",
            "mem",
            "free_mem",
            "free_disk",
            "slots",
            "kernels",
            "last_heartbeat_at",
        ),
    ),
    "images": (
        "images",
        (
            "agent_id",
            "image",
            "size_bytes",
            "pulled_at",
            "last_used_at",
            "kernels_using",
            "preloaded",
        ),
    ),
    "occupancy": ("occupancy", ("owner", "agent_id", "kernels", "cpu", "mem")),
    "pulls": (
        "pulls",
        ("agent_id", "image", "task_id", "outcome", "bytes", "duration_s", "started_at", "reason"),
    ),
}
# Shown only when some row has a value: most kernels publish no port and have not ended.
# Shown when some row has one.
_SPARSE_COLUMNS = ("exit_code", "ran_s", "ports", "slots", "session_name", "name", "labels")
_ID_COLUMNS = ("kernel_id", "session_id", "task_id")  # shortened in tables, whole in --json
_BYTE_COLUMNS = ("mem", "free_mem", "disk", "free_disk", "size_bytes", "bytes")
_SECONDS_COLUMNS = ("ran_s", "duration_s")
# `hoist ps` without -a: kernels that have not ended.
LIVE = [s.value for s in KernelStatus if s not in TERMINAL]


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    read: Callable[[argparse.Namespace], Awaitable[int | None]],
) -> None:
    """Add the read commands; ``read`` runs them (the CLI owns connections and roles).
    `hoist query MODEL` and `hoist sql SQL` come from services.audit_cli."""

    def table_command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        add_output_flags(p, "the rows")
        p.add_argument("--limit", type=int, help="at most this many rows (default 1000)")
        p.set_defaults(func=read, read=name)
        return p

    ps = table_command("ps", "live kernels and their status (-a: ended ones too)")
    ps.add_argument("--all", "-a", action="store_true", help="ended kernels too")
    ps.add_argument("--session", help="only this session's kernels (an id or its prefix)")
    ps.add_argument("--owner")
    ps.add_argument("--status", action="append", help="e.g. PULLING (repeatable)")
    ps.add_argument("--label", "-l", action="append", metavar="K=V", help=_LABEL_HELP)
    sessions = table_command("sessions", "sessions and their status")
    sessions.add_argument("--owner")
    sessions.add_argument("--status", action="append")
    sessions.add_argument(
        "--all", "-a", action="store_true", help="ended sessions too (as without it: ps's habit)"
    )
    sessions.add_argument("--label", "-l", action="append", metavar="K=V", help=_LABEL_HELP)
    agents = table_command("agents", "agents: capacity, free room, liveness")
    agents.add_argument("--resource-group")
    images = table_command("images", "images held by each agent")
    images.add_argument("--agent", help="only this agent's images")
    occupancy = table_command("occupancy", "resources occupied by owner or by agent")
    occupancy.add_argument("--by", choices=("owner", "agent"), default="owner")
    pulls = table_command("pulls", "image pulls: started, finished, outcome")
    pulls.add_argument("--agent")
    pulls.add_argument("--outcome", choices=("pulling", "pulled", "failed", "abandoned"))


def _label_filters(items: list[str] | None) -> list[str] | None:
    """``-l`` filters as given (``K=V`` or ``K``), each checked as a label is: one that no
    label could match is a mistake said, not an empty table."""
    for item in items or ():
        key, eq, value = item.partition("=")
        if not re.match(LABEL_KEY, key) or (eq and not re.match(LABEL_VALUE, value)):
            raise CliError(
                f"-l {item}: give K=V or K (a label's key: 1-63 letters, digits, '_', '.', '/'"
                " or '-'; its value: at most 63 letters, digits, '_', '.' or '-')"
            )
    return items


_LABEL_HELP = "only those with this label (K=V, or K: any value; repeat: all of them)"


def request_of(args: argparse.Namespace) -> dict[str, Any]:
    """The query's filters from the command's options (unset ones left out)."""
    options = {
        "session_id": getattr(args, "session", None),
        "owner": getattr(args, "owner", None),
        "status": getattr(args, "status", None),
        "resource_group": getattr(args, "resource_group", None),
        "agent_id": getattr(args, "agent", None),
        "outcome": getattr(args, "outcome", None),
        "labels": _label_filters(getattr(args, "label", None)),
        "limit": args.limit,
    }
    if args.read == "occupancy":
        options["by"] = args.by
    if args.read == "ps" and not args.all and options["status"] is None:
        options["status"] = LIVE
    return {k: v for k, v in options.items() if v is not None}


async def run_read(conn: Connection, args: argparse.Namespace, console: Console) -> None:
    query, columns = COMMANDS[args.read]
    reply = await conn.request(f"{subjects.QUERY}.{query}", request_of(args))
    agent = getattr(args, "agent", None)
    if not reply.get("rows") and agent and not await _agent_known(conn, agent):
        # An error (exit 1), not an empty answer: a script asking about a typo learns it.
        raise CliError(f"no agent {agent!r} is known: `hoist agents` lists them")
    if wants_json(args):
        print_json(reply)
        return
    rows = reply.get("rows", [])
    wide = args.output == "wide"
    if wide:  # the table's columns first, then the rest as the reply has them
        extra = [k for r in rows for k in r if k not in columns]
        columns = (*columns, *dict.fromkeys(extra))
        if not console.is_terminal:  # piped: every column in full on one line per row
            console.width = 10_000
    shown = (
        [
            c
            for c in columns
            if any(c in r and (c not in _SPARSE_COLUMNS or r[c] not in (None, {})) for r in rows)
        ]
        or sorted({k for r in rows for k in r})
        or [c for c in columns if c not in _SPARSE_COLUMNS]  # no row: the header says what
    )
    console.print(_table(shown, [[r.get(c) for c in shown] for r in rows], whole_ids=wide))
    _footer(console, reply, len(rows))


async def _agent_known(conn: Connection, agent_id: str) -> bool:
    """Whether the read models know ``agent_id`` (an empty ``--agent`` filter says why)."""
    query, _ = COMMANDS["agents"]
    try:
        reply = await conn.request(f"{subjects.QUERY}.{query}", {"agent_id": agent_id, "limit": 1})
    except CliError:
        return True  # not known to be unknown: the rows said what there is
    return bool(reply.get("rows"))


def _table(columns: list[str], rows: list[list[Any]], whole_ids: bool = False) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for c in columns:
        table.add_column(_header(c), overflow="fold", no_wrap=whole_ids and c in _ID_COLUMNS)
    for row in rows:
        # Text, not str: rich would read "[...]" in a value (an owner, a reason) as markup.
        table.add_row(*(Text(_cell(c, v, whole_ids)) for c, v in zip(columns, row, strict=True)))
    return table


def truncation_note(reply: dict[str, Any]) -> str:
    """What a footer says of a cut reply: more rows matched than ``limit`` (raise it), or the
    rows did not fit one NATS message (the reply's ``hint``: ask for fewer)."""
    if not reply.get("truncated"):
        return ""
    if reply.get("hint"):
        return " (truncated to fit one reply: ask for fewer rows with --limit)"
    return " (truncated: raise --limit)"


def _footer(console: Console, reply: dict[str, Any], count: int) -> None:
    more = truncation_note(reply)
    console.print(f"[dim]{count} row(s) as of event {reply.get('seq', '?')}{more}[/dim]")


def _header(column: str) -> str:
    """A column's header: its field's name without the unit its cells now say (``ran_s`` ->
    ``ran``, ``size_bytes`` -> ``size``); ``-o json`` keeps the field names."""
    if column in _SECONDS_COLUMNS:
        return column.removesuffix("_s")
    return column.removesuffix("_bytes") if column in _BYTE_COLUMNS else column


def _cell(column: str, value: Any, whole_ids: bool = False) -> str:
    if value is None:
        return "-"
    if column in _ID_COLUMNS and isinstance(value, str) and not whole_ids:
        return value[:12]
    if column == "image" and isinstance(value, str):
        return familiar(value)  # stored canonical; shown as docker images shows it
    if column in _SECONDS_COLUMNS and isinstance(value, int | float):
        return human_duration(value)
    if column in _BYTE_COLUMNS and isinstance(value, int | float):
        return human_bytes(value)
    if isinstance(value, str) and len(value) > 19 and value[4:5] == "-" and value[10:11] == "T":
        try:
            return datetime.fromisoformat(value).astimezone().strftime("%Y-%m-%d %H:%M:%S")
        except ValueError:
            return value
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):  # labels: as they were given
        return ",".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
    return str(value)
