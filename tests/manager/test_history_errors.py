"""The history responder answers every request it takes, an unexpected failure included: a
request left unanswered would hold its client until the client's own timeout. What failed goes to
the manager's log, never to the user: an exception's text can show internals."""

from __future__ import annotations

import logging

import pytest

from eventstore.store import EventStore
from services.manager.history import History
from tests.manager.harness import request
from transport.client import Client


async def test_an_unexpected_error_is_answered_internal_at_once(
    nc: Client, store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(user: str) -> bool:
        raise RuntimeError(f"no users table at /var/lib/secret for {user}")

    history = History(nc, store, lambda sid: "alice", broken, lambda user: False)
    await history.start()
    try:
        # Unanswered, the request raises TimeoutError after 10 s.
        with caplog.at_level(logging.ERROR, logger="services.manager.history"):
            reply = await request(nc, "hoist.query.alice.history", {"session_id": "s1"}, within=10)
        assert reply["error"] == {
            "code": "internal",
            "message": "internal error; see the manager's log",
        }, reply
        [logged] = [r for r in caplog.records if r.name == "services.manager.history"]
        assert logged.getMessage() == "history request on hoist.query.alice.history failed"
        assert logged.exc_info is not None and logged.exc_info[0] is RuntimeError
        assert "/var/lib/secret" in caplog.text and "Traceback" in caplog.text
        # The responder keeps serving: a request after the failure is answered too.
        again = await request(nc, "hoist.query.alice.history", {"session_id": "s1"}, within=10)
        assert again["error"]["code"] == "internal", again
    finally:
        await history.stop()
