"""A session's events, from wherever this connection may read them: the log itself for the
client and admin roles, the manager (``hoist.query.<user>.history``) for a Hoist user, whose
NATS user may not read the log (domain.contracts.history)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from client.connection import Connection
from domain import subjects
from domain.contracts.history import MAX_WAIT_S
from eventstore.store import Recorded, event_store


async def last_seq(conn: Connection, session_id: str) -> int:
    """The seq of the session's last event; 0 when there is no such session (for a user: no
    such session of theirs)."""
    if conn.user is None:
        return await event_store(conn.nc).last_seq(subjects.session_events(session_id))
    page = await _page(conn, session_id, after_seq=0, wait_s=0)
    return int(page["last_seq"])


async def records(
    conn: Connection, session_id: str, *, follow: bool = False
) -> AsyncIterator[Recorded]:
    """The session's events in order; ``follow``: then each new one, until cancelled."""
    if conn.user is None:
        store = event_store(conn.nc)
        async for rec in store.replay(
            subject_filter=subjects.session_events(session_id), follow=follow
        ):
            yield rec
        return
    after = 0
    while True:
        page = await _page(conn, session_id, after_seq=after, wait_s=MAX_WAIT_S if follow else 0)
        for event in page["events"]:
            rec = _recorded(event)
            after = rec.seq
            yield rec
        if not follow and not page.get("more"):
            return


async def _page(conn: Connection, session_id: str, *, after_seq: int, wait_s: float) -> Any:
    assert conn.user is not None
    payload = {"session_id": session_id, "after_seq": after_seq, "wait_s": wait_s}
    # hoist.query.history: the connection sends it on the user's own subject
    subject = f"{subjects.QUERY}.{subjects.HISTORY}"
    return await conn.request(subject, payload, wait_s=wait_s + 10)


def _recorded(event: dict[str, Any]) -> Recorded:
    return Recorded(
        seq=event["seq"],
        subject=event["subject"],
        headers=event["headers"],
        data=event["data"].encode(),
        time=datetime.fromisoformat(event["time"]),
    )
