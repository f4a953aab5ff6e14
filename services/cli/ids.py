"""Short ids, as Docker takes them: a session or kernel id may be given by any unique prefix
(tables print 12 characters), and a session by its name (`hoist run --name`).

A prefix is resolved through the read-model query (``hoist.query.sessions`` / ``kernels``,
filter ``*_id_prefix``).  A Hoist user's connection sends it on their own subject, which the
manager restricts to their sessions, so a prefix never resolves to one the caller cannot see.
A whole id (32 hex digits, what the manager makes) goes straight through without a query: the
request it is sent with says whether it exists.
"""

from __future__ import annotations

import re
from typing import Any

from client.connection import CliError, Connection
from domain.errors import unknown_kernel, unknown_session
from domain.limits import MAX_ID
from domain.limits import SESSION_NAME as SESSION_NAME_PATTERN
from domain.status import TERMINAL
from domain.subjects import query_subject

FULL_ID = re.compile(r"^[0-9a-f]{32}\Z")
HOSTNAME = re.compile(r"^(main|sub)[0-9]+\Z")  # a kernel named by its hostname in its session
SHOWN = 10  # candidates an ambiguous prefix lists
MAX_NAMED = 1000  # sessions of one name looked at: every ended one is a candidate too
SESSION_NAME = re.compile(SESSION_NAME_PATTERN)
ENDED = {s.value for s in TERMINAL}


class NoMatch(CliError):
    """No id the caller may see starts with the prefix."""


def _check_given(kind: str, given: str) -> None:
    """Refused before anything is asked, in the command line's words: an empty prefix (it
    would match everything) and one longer than any id."""
    if not given.strip():
        raise CliError(
            f"{kind.upper()} is empty: give a {kind} id or a unique prefix of one"
            f" (`hoist ps -a` lists them)"
        )
    if len(given) > MAX_ID:
        raise CliError(
            f"{kind.upper()} has {len(given)} characters: a {kind} id has at most {MAX_ID}"
            f" (`hoist ps -a` lists them)"
        )


async def session_id(conn: Connection, given: str) -> str:
    """The one session named ``given`` (`hoist run --name`) or whose id starts with it; a
    name and a prefix of two different sessions is ambiguous, said with both."""
    _check_given("session", given)
    if FULL_ID.match(given):
        return given
    sessions = query_subject("sessions")
    reply = await conn.request(sessions, {"session_id_prefix": given, "limit": SHOWN})
    ids = [row["session_id"] for row in reply["rows"]]
    named = await _named(conn, given) if SESSION_NAME.match(given) else None
    if named is None:
        return _one("session", given, ids, reply, unknown_session(given))
    others = [i for i in ids if i != named]
    if others:
        raise CliError(
            f"{given} is ambiguous: the name of session {named} and the start of session"
            f" {', '.join(others)}; give the id (or more of it)"
        )
    return named


async def _named(conn: Connection, name: str) -> str | None:
    """The session of that name that has not ended (names are unique among those), else the
    newest that has; None if no session the caller sees has it.  Several owners' (the client
    role sees every owner's) of one name are ambiguous."""
    reply = await conn.request(query_subject("sessions"), {"name": name, "limit": MAX_NAMED})
    rows = reply["rows"]
    live = [r for r in rows if r["status"] not in ENDED]
    if len(live) > 1:
        which = ", ".join(f"{r['session_id']} ({r['owner']})" for r in live)
        raise CliError(f"{name} names several sessions that have not ended: {which}; give the id")
    if live:
        return str(live[0]["session_id"])
    return str(rows[-1]["session_id"]) if rows else None


async def kernel_id(conn: Connection, given: str, session: str | None = None) -> str:
    """The one kernel id starting with ``given`` (in ``session`` when given); a hostname
    (``main1``, ``sub2``) of a session's kernel goes through, its session resolves it."""
    _check_given("kernel", given)
    if FULL_ID.match(given) or (session is not None and HOSTNAME.match(given)):
        return given
    request: dict[str, Any] = {"kernel_id_prefix": given, "limit": SHOWN}
    if session is not None:
        request["session_id"] = session
    reply = await conn.request(query_subject("kernels"), request)
    ids = [row["kernel_id"] for row in reply["rows"]]
    if session is not None:
        missing = (
            f"session {session} has no kernel {given}: list its kernels with"
            f" `hoist ps -a --session {session[:12]}`"
        )
    else:
        missing = unknown_kernel(given)
    return _one("kernel", given, ids, reply, missing)


def _one(kind: str, given: str, ids: list[str], reply: dict[str, Any], missing: str) -> str:
    if given in ids:  # a whole id that is also the prefix of a longer one
        return given
    if len(ids) == 1:
        return ids[0]
    if not ids:
        raise NoMatch(missing)
    more = " and more" if reply.get("truncated") else ""
    raise CliError(
        f"{kind} id {given} is ambiguous: it starts {', '.join(ids)}{more}; give more characters"
    )
