"""transport.responder: the one way a request is answered (inbox check, decode, handle, one
error table, reply), with the manager's error table (services.manager.responder)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
import pytest
from nats.aio.msg import Msg

from domain.errors import Forbidden, IllegalTransition, InvalidField, NotFound, NotNow
from domain.rpc import RequestError
from eventstore.store import ConcurrencyError, StoreError
from services.manager.responder import manager_responder
from services.manager.uow import SessionUnknown
from transport.responder import Responder, Route

log = logging.getLogger("tests.responder")
INBOX = "_INBOX.alice.abc123"


class Ping(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    count: int
    word: str = "ping"


@dataclass
class FakeMsg:
    """What the responder reads of a nats Msg, and the replies it sent."""

    subject: str = "hoist.test.ping"
    reply: str = INBOX
    data: bytes = b'{"count": 2}'
    replies: list[dict[str, Any]] = field(default_factory=list)

    async def respond(self, data: bytes) -> None:
        self.replies.append(msgspec.json.decode(data))


async def answered(
    responder: Responder, msg: FakeMsg, route: Route[Any], user: str | None = None
) -> dict[str, Any]:
    await responder.serve(cast(Msg, msg), route, user=user)
    [reply] = msg.replies
    return reply


async def echo(req: Ping) -> dict[str, Any]:
    return {"pong": req.count, "word": req.word}


def raising(error: Exception) -> Route[Ping]:
    async def handle(req: Ping) -> None:
        raise error

    return Route(Ping, handle)


@pytest.fixture
def responder() -> Responder:
    return manager_responder(log, "test")


async def test_a_request_is_decoded_handled_and_replied(responder: Responder) -> None:
    assert await answered(responder, FakeMsg(), Route(Ping, echo)) == {"pong": 2, "word": "ping"}


async def test_an_empty_payload_decodes_as_an_empty_object(responder: Responder) -> None:
    reply = await answered(responder, FakeMsg(data=b"  "), Route(Ping, echo))
    assert reply["error"]["code"] == "invalid-request"
    assert "missing required field `count`" in reply["error"]["message"], reply


@pytest.mark.parametrize("reply_to", ["", "hoist.api.sessions.create", "_INBOX.bob.xyz"])
async def test_no_reply_but_to_an_inbox_of_the_subjects_user(
    responder: Responder, reply_to: str
) -> None:
    msg = FakeMsg(reply=reply_to)
    await responder.serve(cast(Msg, msg), Route(Ping, echo), user="alice")
    assert msg.replies == []
    assert responder.answerable(cast(Msg, FakeMsg()), "alice")
    assert responder.answerable(cast(Msg, FakeMsg(reply="_INBOX.bob.xyz")))


@pytest.mark.parametrize(
    ("data", "names"),
    [
        (b'{"count": "two"}', "$.count"),
        (b'{"count": 1, "colour": "red"}', "colour"),
        (b"{not json", "not valid JSON"),
    ],
)
async def test_an_undecodable_request_is_invalid_naming_the_field(
    responder: Responder, data: bytes, names: str
) -> None:
    reply = await answered(responder, FakeMsg(data=data), Route(Ping, echo))
    assert reply["error"]["code"] == "invalid-request", reply
    assert names in reply["error"]["message"], reply
    assert reply["error"]["message"].startswith("hoist.test.ping request"), reply


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (RequestError("conflict", "taken"), "conflict", "taken"),
        (InvalidField("image", "empty"), "invalid-request", "image: empty"),
        (IllegalTransition("running", "pending", frozenset()), "illegal-transition", "cannot go"),
        (NotNow("kernel is running; destroy it"), "illegal-transition", "destroy it"),
        (Forbidden("user 'bob' is no admin"), "forbidden", "user 'bob' is no admin"),
        (NotFound("stream_id", "no stream"), "not-found", "stream_id: no stream"),
        (SessionUnknown("s1"), "not-found", "session_id: unknown session s1"),
        (StoreError("no quorum"), "unavailable", "no quorum; retry the request"),
        (ConcurrencyError("s.1", 4), "unavailable", "(expected last sequence 4)"),
        (TimeoutError(), "unavailable", "TimeoutError; retry the request"),
    ],
)
async def test_each_row_of_the_error_table(
    responder: Responder,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
    code: str,
    message: str,
) -> None:
    with caplog.at_level(logging.DEBUG, logger=log.name):
        reply = await answered(responder, FakeMsg(), raising(error))
    assert reply["error"]["code"] == code, reply
    assert message in reply["error"]["message"], reply
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_an_unexpected_error_is_internal_generic_and_its_traceback_logged(
    responder: Responder, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger=log.name):
        reply = await answered(responder, FakeMsg(), raising(KeyError("/var/lib/secret of alice")))
    assert reply == {
        "error": {"code": "internal", "message": "internal error; see the manager's log"}
    }
    [logged] = [r for r in caplog.records if r.name == log.name]
    assert logged.getMessage() == "test request on hoist.test.ping failed"
    assert logged.exc_info is not None and logged.exc_info[0] is KeyError
    assert "Traceback" in caplog.text and "/var/lib/secret" in caplog.text


async def test_a_process_names_itself_in_the_internal_reply() -> None:
    agent = Responder("agent", log, "agent")
    reply = await answered(agent, FakeMsg(), raising(RuntimeError("boom")))
    assert reply["error"]["message"] == "internal error; see the agent's log"
    # the transport's table alone knows nothing of the event store: a bug there is internal
    reply = await answered(agent, FakeMsg(), raising(StoreError("no quorum")))
    assert reply["error"]["code"] == "internal"


async def test_the_agents_internal_reply_says_what_failed_for_the_managers_status_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The agent's one requester is the manager, which shows an agent's failure in the kernel's
    status_info: its internal reply names the verb and the error; the traceback is logged."""
    agent = Responder("agent", log, "agent", detail=True)
    msg = FakeMsg(subject="hoist.agent.a1.create-kernel")
    with caplog.at_level(logging.ERROR, logger=log.name):
        reply = await answered(agent, msg, raising(RuntimeError("port 8888 is taken")))
    assert reply["error"] == {
        "code": "internal",
        "message": "create-kernel failed: RuntimeError: 'port 8888 is taken'",
    }
    assert "Traceback" in caplog.text
