"""The demo session `hoist up` starts: once per data dir, found again in the event log.

The first demo is created with a fixed request id, so its session id is known
(domain.contracts.sessions.session_id_for) and the log says whether it was ever created; a
later `hoist up` on the same data dir starts none unless asked (``--demo``).
"""

from __future__ import annotations

from client.connection import Connection
from domain import subjects
from domain.contracts.sessions import session_id_for
from eventstore.store import EventStore

OWNER = "demo"
REQUEST_ID = "hoist-up-demo"


async def earlier_demo(conn: Connection) -> str | None:
    """The session id of the demo an earlier `hoist up` created in this data dir, if any."""
    session_id = session_id_for(OWNER, REQUEST_ID)
    store = EventStore(conn.nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
    return session_id if await store.last_seq(subjects.session_events(session_id)) else None
