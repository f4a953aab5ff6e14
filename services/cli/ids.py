"""Short ids, as Docker takes them: a session or kernel id may be given by any unique prefix
(tables print 12 characters).

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
from domain.subjects import query_subject

FULL_ID = re.compile(r"^[0-9a-f]{32}\Z")
HOSTNAME = re.compile(r"^(main|sub)[0-9]+\Z")  # a kernel named by its hostname in its session
SHOWN = 10  # candidates an ambiguous prefix lists


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
    """The one session id starting with ``given``."""
    _check_given("session", given)
    if FULL_ID.match(given):
        return given
    reply = await conn.request(
        query_subject("sessions"), {"session_id_prefix": given, "limit": SHOWN}
    )
    ids = [row["session_id"] for row in reply["rows"]]
    return _one("session", given, ids, reply, unknown_session(given))


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
