"""`hoist history SESSION` and `hoist events [--follow] [--session S]`: events straight from
JetStream (a Hoist user's own sessions' from the manager: client.session_log), a line
each (``-o json``: a JSON object a line, for jq)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import msgspec

from client import session_log
from client.connection import CliError, Connection
from client.events import describe
from domain import subjects
from domain.errors import unknown_session
from eventstore.store import Recorded, event_store
from services.cli import ids
from services.cli.connected import connected
from services.cli.output import add_output_flags, print_json_line, wants_json
from services.cli.streams import interrupt_event


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    history = sub.add_parser("history", help="every event of a session, in order")
    history.add_argument("session_id", metavar="SESSION", help="a session id or its prefix")
    add_output_flags(history, "the events")
    history.set_defaults(func=cmd_history)

    events = sub.add_parser("events", help="the event log")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    events.add_argument("--session", help="only this session's events (an id or its prefix)")
    add_output_flags(events, "the events")
    events.set_defaults(func=cmd_events)


def format_event(rec: Recorded, quarantined: Mapping[int, str] | None = None) -> str:
    """One line of history."""
    e = describe(rec, quarantined)
    when = rec.time.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    # The manager's Hoist-Actor names who caused its event (client, admin); anyone else's is
    # only a claim, so the line names the writer the subject proves.
    written, actor = e["writer"], e["actor"]
    by = f"by {actor}" if written in ("manager", actor) else f"by {written} (claims {actor})"
    head = f"{rec.seq:>8}  {when}  {e['aggregate']}:{e['id']}  {e['type']}  {by}"
    if e["quarantined"] is not None:
        return f"{head}  QUARANTINED: {e['quarantined']}"
    return f"{head}  {msgspec.json.encode(e['data']).decode()}"


async def _print_events(args: argparse.Namespace, session: str | None, *, follow: bool) -> None:
    stop = interrupt_event()
    as_json = wants_json(args)
    async with connected(args) as conn:
        if session is None and conn.user is not None:
            raise CliError(
                "hoist events reads the whole log, which a Hoist user may not: see one of your"
                " sessions with `hoist history SESSION` (or `hoist events --session SESSION`)"
            )
        subject_filter = None
        if session is not None:
            session = await ids.session_id(conn, session)
            subject_filter = subjects.session_events(session)
            if not follow and await session_log.last_seq(conn, session) == 0:
                raise CliError(unknown_session(session))

        quarantined = await _quarantined(conn, subject_filter)

        async def printing() -> None:
            if session is not None:  # a Hoist user's come from the manager (session_log)
                found = session_log.records(conn, session, follow=follow)
            else:
                found = event_store(conn.nc).replay(follow=follow)
            lease = f"{subjects.EVENTS}.{subjects.LEASE}."
            async for rec in found:
                if rec.subject.startswith(lease):
                    continue  # the managers' lease renewals: a heartbeat, not a fact
                if as_json:
                    print_json_line(describe(rec, quarantined))
                else:
                    print(format_event(rec, quarantined), flush=True)

        task = asyncio.create_task(printing())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _quarantined(conn: Connection, subject_filter: str | None) -> dict[int, str]:
    """seq -> reason of the quarantined records under ``subject_filter`` (the read model's
    word, for what decoding alone cannot tell); empty when the manager does not answer."""
    payload: dict[str, Any] = {"limit": 10000}
    if subject_filter:
        payload["subject"] = subject_filter
    try:
        reply = await conn.request(f"{subjects.QUERY}.quarantine", payload, wait_s=5)
    except CliError:
        return {}
    return {row["seq"]: row["reason"] for row in reply["rows"]}


async def cmd_history(args: argparse.Namespace) -> None:
    """Every event of one session, in order."""
    await _print_events(args, args.session_id, follow=False)


async def cmd_events(args: argparse.Namespace) -> None:
    await _print_events(args, args.session, follow=args.follow)
