"""`hoist __complete KIND [PREFIX]`: the values a shell completes, answered from the running
stack (sessions' names and short ids, agents, images, users, resource groups), one a line.

The completion scripts (services.cli.completion) call it on each TAB, so it answers within a
second or says nothing: no stack, no permission, a slow manager are all an empty answer and
exit code 0, never an error on the user's prompt.  It is not a command of the parser: it must
not show in `hoist --help`, nor in "did you mean".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from typing import Any

from client.connection import CliError, Connection
from domain.image_ref import familiar
from domain.status import TERMINAL
from domain.subjects import GROUP_LIST, USER_LIST, query_subject
from services.cli.stack_url import stack_url
from services.stack import home as stack_home

WORD = "__complete"
ANSWER_WITHIN_S = 1.0
ENDED = {s.value for s in TERMINAL}
LIMIT = 500


async def _rows(conn: Connection, query: str, **filters: Any) -> list[dict[str, Any]]:
    reply = await conn.request(
        query_subject(query), {**filters, "limit": LIMIT}, wait_s=1, read_again=False
    )
    return list(reply.get("rows", []))


async def _sessions(conn: Connection) -> list[str]:
    """Names and 12-character ids of the sessions that have not ended (what a command that
    takes a session is given), then the names of ended ones (describe, history, logs)."""
    rows = await _rows(conn, "sessions")
    live = [r for r in rows if r["status"] not in ENDED]
    ended = [r for r in rows if r["status"] in ENDED]
    return [
        *(r["name"] for r in live if r.get("name")),
        *(r["session_id"][:12] for r in live),
        *(r["name"] for r in reversed(ended) if r.get("name")),
    ]


async def _agents(conn: Connection) -> list[str]:
    return [r["agent_id"] for r in await _rows(conn, "agents")]


async def _images(conn: Connection) -> list[str]:
    return sorted({familiar(r["image"]) for r in await _rows(conn, "images")})


async def _users(conn: Connection) -> list[str]:
    reply = await conn.request(USER_LIST, {}, wait_s=1, read_again=False)
    return [u["name"] for u in reply.get("users", [])]


async def _groups(conn: Connection) -> list[str]:
    with contextlib.suppress(CliError):  # an admin's list has the defined ones too
        reply = await conn.request(GROUP_LIST, {}, wait_s=1, read_again=False)
        return [g["name"] for g in reply.get("groups", [])]
    return sorted({r["resource_group"] for r in await _rows(conn, "agents")})


# kind -> (role whose credentials ask, what answers)
KINDS: dict[str, tuple[str, Callable[[Connection], Awaitable[list[str]]]]] = {
    "sessions": ("client", _sessions),
    "agents": ("client", _agents),
    "images": ("client", _images),
    "users": ("admin", _users),
    "groups": ("admin", _groups),
}


def answer(argv: list[str]) -> int:
    """``argv``: KIND [PREFIX]; prints the candidates starting with PREFIX."""
    kind, prefix = [*argv, "", ""][:2]
    if kind not in KINDS:  # nothing to offer: never an error on the prompt
        return 0
    try:
        values = asyncio.run(asyncio.wait_for(_values(kind), ANSWER_WITHIN_S))
    except Exception:  # no stack, no permission, too slow: nothing to offer
        return 0
    for value in dict.fromkeys(values):
        if value.startswith(prefix):
            print(value)
    return 0


async def _values(kind: str) -> list[str]:
    role, ask = KINDS[kind]
    args = argparse.Namespace(
        data_dir=str(stack_home.resolve_data_dir(None)), user=os.environ.get("HOIST_USER")
    )
    conn = await Connection.open(stack_url(args, role), name="hoist-complete")
    try:
        return await ask(conn)
    finally:
        await conn.close()
