"""The persistence module's synchronous calls say which wait ran out: a JetStream request that
nobody answered (a user without permission on the stream gets no reply either) is not the
whole call outliving its timeout."""

from __future__ import annotations

import asyncio

import pytest
from eventsourcing.persistence import OperationalError

from eventstore.persistence_datastore import _PrivateLoop


async def _unanswered() -> None:
    raise TimeoutError  # what nats-py raises when a request gets no reply


async def _slow() -> None:
    await asyncio.sleep(30)


def test_an_unanswered_request_is_not_reported_as_the_calls_timeout() -> None:
    loop = _PrivateLoop("test-private-loop")
    try:
        with pytest.raises(OperationalError, match=r"was not answered.*permissions violation"):
            loop.run(_unanswered(), timeout=5)
        with pytest.raises(OperationalError, match=r"did not answer within 0\.2s"):
            loop.run(_slow(), timeout=0.2)
    finally:
        loop.cancel_in_flight()
        loop.close()
