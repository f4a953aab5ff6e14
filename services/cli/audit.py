"""`hoist replay`, `hoist verify`, `hoist query`, `hoist sql`: audits and read models from the
command line.  ``register(subparsers)`` adds them to the `hoist` parser (services.cli)."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

from client import connection as cli_nats
from client.connection import CliError
from domain.subjects import QUERY_NAMES, SQL_SUBJECT, VERIFY_SUBJECT, query_subject
from eventstore.bulk import bulk_reader
from eventstore.store import event_store
from projections import ALL
from projections.runner import Runner
from services.cli.output import add_output_flags, print_json, wants_json
from services.cli.read import truncation_note
from services.cli.stack_url import stack_url
from services.stack import up as stack

VERIFY_TIMEOUT_S = 600.0


def register(subparsers: Any) -> None:
    replay = subparsers.add_parser(
        "replay", help="build every read model as of a point in the log into a DuckDB file"
    )
    replay.add_argument(
        "--until",
        required=True,
        help="a stream sequence (e.g. 1500) or a time with zone (e.g. 2025-06-01T12:00:00Z)",
    )
    replay.add_argument("--db", required=True, help="the DuckDB file to create")
    replay.set_defaults(func=cmd_replay)

    verify = subparsers.add_parser(
        "verify", help="rebuild the read models from the log and report any difference"
    )
    verify.set_defaults(func=cmd_verify)

    query = subparsers.add_parser("query", help="query a read model (rows as JSON lines)")
    query.add_argument("model", choices=sorted(QUERY_NAMES))
    query.add_argument(
        "filters", nargs="*", metavar="FIELD=VALUE", help="e.g. owner=alice status=RUNNING,PULLING"
    )
    query.add_argument("--min-seq", type=int, help="wait until the model reflects this sequence")
    query.add_argument("--limit", type=int)
    query.set_defaults(func=cmd_query)

    sql = subparsers.add_parser("sql", help="one read-only SELECT over the read models (admin)")
    sql.add_argument("sql")
    add_output_flags(sql, "the rows (table: tab-separated)")
    sql.add_argument("--limit", type=int)
    sql.add_argument(
        "--time-limit", type=float, help="seconds before the query is interrupted (default 10)"
    )
    sql.set_defaults(func=cmd_sql)


def parse_until(value: str) -> tuple[int | None, datetime | None]:
    """A stream sequence or an aware time."""
    if value.isdigit():
        return int(value), None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise CliError(
            f"--until {value!r} is neither a sequence (e.g. 1500) nor a time"
            " (e.g. 2025-06-01T12:00:00Z)"
        ) from None
    if when.tzinfo is None:
        raise CliError(f"--until {value!r} has no time zone: add one, e.g. Z or +02:00")
    return None, when


async def cmd_replay(args: argparse.Namespace) -> None:
    until_seq, until_time = parse_until(args.until)
    db = _new_file(args.db)
    url = stack_url(args, "client")
    nc = await stack.connect(url, "hoist-replay")
    try:
        con = duckdb.connect(str(db))
        try:
            runner = Runner(con, event_store(nc), ALL, bulk=bulk_reader(url))
            last = await runner.run(follow=False, until_seq=until_seq, until_time=until_time)
            counts = {
                t.name: con.execute(f"SELECT count(*) FROM {t.name}").fetchall()[0][0]
                for p in ALL
                for t in p.tables
            }
        finally:
            con.close()
    finally:
        await nc.close()
    print(f"read models as of stream sequence {last} written to {db}:")
    for name, count in counts.items():
        print(f"  {name}: {count} rows")


def _new_file(path: str) -> Path:
    db = Path(path)
    if db.exists():
        raise CliError(f"--db {db} exists: choose a new file (replay never overwrites one)")
    return db


async def cmd_verify(args: argparse.Namespace) -> None:
    reply = await _ask(args, "admin", VERIFY_SUBJECT, {}, VERIFY_TIMEOUT_S)
    if reply.get("quarantined"):
        print(
            f"{reply['quarantined']} events quarantined (skipped by every reader):"
            " hoist query quarantine"
        )
    if reply["ok"]:
        print(f"read models match a rebuild from the log (stream sequence {reply['seq']})")
        return
    for d in reply["differences"]:
        print(
            f"{d['table']}: {d['only_live']} rows only in the live model,"
            f" {d['only_rebuilt']} only in the rebuild"
        )
        for side in ("live", "rebuilt"):
            for row in d[f"examples_{side}"]:
                print(f"  {side}: {json.dumps(row)}")
    raise CliError(
        f"the read models differ from a rebuild at stream sequence {reply['seq']}: rebuild them"
        " (bump the projection's version or delete the DuckDB file and restart the manager)"
    )


async def cmd_query(args: argparse.Namespace) -> None:
    request: dict[str, Any] = {}
    for item in args.filters:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CliError(f"filter {item!r} is not FIELD=VALUE (e.g. owner=alice)")
        if value in ("true", "false"):
            request[name] = value == "true"
        else:
            request[name] = value.split(",") if "," in value else value
    if args.min_seq is not None:
        request["min_seq"] = args.min_seq
    if args.limit is not None:
        request["limit"] = args.limit
    reply = await _ask(args, "client", query_subject(args.model), request, 35.0)
    for row in reply["rows"]:
        print(json.dumps(row))
    print(f"# {len(reply['rows'])} rows at stream sequence {reply['seq']}{truncation_note(reply)}")


async def cmd_sql(args: argparse.Namespace) -> None:
    request: dict[str, Any] = {"sql": args.sql}
    if args.limit is not None:
        request["limit"] = args.limit
    if args.time_limit is not None:
        request["time_limit"] = args.time_limit
    reply = await _ask(args, "admin", SQL_SUBJECT, request, 35.0)
    if wants_json(args):
        print_json(reply)
        return
    print("\t".join(reply["columns"]))
    for row in reply["rows"]:
        print("\t".join("" if v is None else str(v) for v in row))
    print(f"# {len(reply['rows'])} rows at stream sequence {reply['seq']}{truncation_note(reply)}")


async def _ask(
    args: argparse.Namespace, role: str, subject: str, request: dict[str, Any], wait_s: float
) -> dict[str, Any]:
    reply: dict[str, Any] = await cli_nats.ask(stack_url(args, role), subject, request, wait_s)
    return reply
