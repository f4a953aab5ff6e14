"""The history responder answers every request it takes, an unexpected failure included: a
request left unanswered would hold its client until the client's own timeout."""

from __future__ import annotations

from eventstore.store import EventStore
from services.manager.history import History
from tests.manager.harness import request
from transport.client import Client


async def test_an_unexpected_error_is_answered_internal_at_once(
    nc: Client, store: EventStore
) -> None:
    def broken(user: str) -> bool:
        raise RuntimeError(f"no users table for {user}")

    history = History(nc, store, lambda sid: "alice", broken, lambda user: False)
    await history.start()
    try:
        # Unanswered, the request raises TimeoutError after 10 s.
        reply = await request(nc, "hoist.query.alice.history", {"session_id": "s1"}, within=10)
        assert reply["error"]["code"] == "internal", reply
        assert "RuntimeError" in reply["error"]["message"], reply
        assert "see the manager log" in reply["error"]["message"], reply
        # The responder keeps serving: a request after the failure is answered too.
        again = await request(nc, "hoist.query.alice.history", {"session_id": "s1"}, within=10)
        assert again["error"]["code"] == "internal", again
    finally:
        await history.stop()
