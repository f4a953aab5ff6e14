"""Bounds at the door: oversized, overdeep and wrong-typed requests get ``invalid-request``
naming the field, append nothing, and replies too large for one NATS message are cut, never
dropped.  An in-process manager (read models and queries included) on a real nats-server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from domain import limits, rpc, subjects
from domain.contracts.sessions import CreateSession
from domain.subjects import SESSION_CREATE
from eventstore.store import EventStore
from tests.agent.agent_harness import store_fixture  # noqa: F401 - the `store` fixture
from tests.manager.harness import MB, agents, create_payload, manager
from transport.client import Client

QUERY = f"{subjects.QUERY}.sessions"


@pytest.fixture
async def stack(nc: Client, store: EventStore) -> AsyncIterator[Client]:
    async with agents(nc, store, ["a1"]), manager(nc):
        yield nc


async def last_seq(nc: Client) -> int:
    return (await nc.jetstream().stream_info(subjects.EVENT_STREAM)).state.last_seq


async def refused(nc: Client, subject: str, payload: bytes, field: str) -> str:
    """Send ``payload``; assert one invalid-request naming ``field`` and no event appended."""
    before = await last_seq(nc)
    reply = json.loads((await nc.request(subject, payload, timeout=10)).data)
    assert reply["error"]["code"] == "invalid-request", reply
    message: str = reply["error"]["message"]
    assert field in message, message
    assert len(message) < 400, f"the message echoes the value: {len(message)} characters"
    assert await last_seq(nc) == before
    return message


def create(**overrides: Any) -> bytes:
    return json.dumps(create_payload(**overrides)).encode()


async def test_mem_of_2_63_is_refused_naming_the_field(stack: Client) -> None:
    payload = create(resources={"cpu": 1, "mem": 2**63})
    await refused(stack, SESSION_CREATE, payload, "$.resources.mem")
    payload = create(resources={"cpu": 1, "mem": MB}).replace(b'"cpu": 1', b'"cpu": 1e400')
    await refused(stack, SESSION_CREATE, payload, "$.resources.cpu")


async def test_a_250_kb_field_is_refused_naming_it(stack: Client) -> None:
    big = "x" * 250_000
    await refused(stack, SESSION_CREATE, create(owner=big), "$.owner")
    await refused(stack, SESSION_CREATE, create(image=big), "$.image")
    await refused(stack, QUERY, json.dumps({"owner": big}).encode(), "owner")
    # An unknown field of that size is named, but quoted short.
    message = await refused(stack, SESSION_CREATE, create(**{big: 1}), "unknown field")
    assert "... (" in message


@pytest.mark.parametrize(
    "owner",
    ["\x1b[31mred", "\x9b31mred", "evil\u202etxt.exe", "a\u200bb", "a\u2028b", "\ufeffa", "evil\n"],
)
async def test_an_owner_that_would_drive_or_fool_a_terminal_is_refused(
    stack: Client, owner: str
) -> None:
    await refused(stack, SESSION_CREATE, create(owner=owner), "$.owner")


async def test_a_patterned_field_is_refused_in_words(stack: Client) -> None:
    message = await refused(stack, SESSION_CREATE, create(owner="bad\tname"), "$.owner")
    assert "printable text (no control or invisible characters)" in message, message
    get = f"{subjects.API}.session.get"
    message = await refused(stack, get, b'{"session_id": "a b"}', "$.session_id")
    assert "letters, digits, '_' or '-'" in message, message


async def test_an_admins_cancel_reason_that_would_drive_a_terminal_is_refused(
    stack: Client,
) -> None:
    for reason in ("bad\nline\x1b[31mRED\u202e", "\n", "stuck\n"):
        payload = json.dumps({"kernel_id": "k1", "reason": reason})
        await refused(stack, subjects.KERNEL_CANCEL, payload.encode(), "$.reason")


def test_a_trailing_newline_passes_no_pattern() -> None:
    # Python's $ also matches before a final newline; the patterns end in \Z.
    for field, value in (("request_id", "r\n"), ("image", "python:3.12-slim\n")):
        with pytest.raises(rpc.RequestError, match=f"at `\\$.{field}`"):
            rpc.decode(create(**{field: value}), CreateSession)
    with pytest.raises(ValueError):
        subjects.check_token("agent-1\n", "agent id")
    assert not subjects.is_inbox("_INBOX.abc\n")


@pytest.mark.parametrize(
    ("subject", "payload", "field"),
    [
        (subjects.PRELOAD, {"images": ["busybox:1"], "agents": []}, "$.agents"),
        (subjects.UNLOAD, {"images": ["busybox:1"], "agents": []}, "$.agents"),
        (subjects.AGENT_SYNC, {"agent_ids": []}, "$.agent_ids"),
    ],
)
async def test_an_empty_list_of_agents_is_refused_not_a_silent_no_op(
    stack: Client, subject: str, payload: dict[str, Any], field: str
) -> None:
    await refused(stack, subject, json.dumps(payload).encode(), field)


async def test_a_1_mb_owner_is_refused_for_its_size(stack: Client) -> None:
    payload = create(owner="o" * 900_000)  # under NATS' max_payload, over MAX_REQUEST
    message = await refused(stack, SESSION_CREATE, payload, "bytes, more than")
    assert str(limits.MAX_REQUEST) in message


async def test_nesting_100000_deep_is_refused(stack: Client) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    # A typed field says what it expected where; a free-form one (query filters) the depth.
    owner = f'{{"owner": {deep}, "image": "i", "resources": {{"cpu": 1, "mem": 1}}}}'
    await refused(stack, SESSION_CREATE, owner.encode(), "$.owner")
    await refused(stack, QUERY, f'{{"owner": {deep}}}'.encode(), "nests deeper than 16")
    shallow_enough = "[" * 17 + "]" * 17  # past the limit, far below the recursion limit
    await refused(stack, QUERY, f'{{"owner": {shallow_enough}}}'.encode(), "nests deeper")


async def test_a_timeout_of_the_wrong_type_is_refused_not_ignored(stack: Client) -> None:
    await refused(stack, QUERY, b'{"timeout": "5"}', "timeout")
    await refused(stack, QUERY, b'{"timeout": "5", "min_seq": 1}', "timeout")
    await refused(stack, QUERY, b'{"min_seq": 18446744073709551616}', "min_seq")
    await refused(stack, QUERY, json.dumps({"owner": ["a"] * 2000}).encode(), "owner")


async def test_non_json_and_not_an_object_are_refused(stack: Client) -> None:
    await refused(stack, SESSION_CREATE, b"\xff\xfe\x00", "not valid JSON")
    await refused(stack, QUERY, b"[1, 2]", "object")
    await refused(stack, f"{subjects.ADMIN}.image.job", b'{"job_id": "a b"}', "$.job_id")


async def test_a_reply_too_large_for_one_message_is_cut_with_a_hint(stack: Client) -> None:
    sql = "SELECT i, repeat('x', 1000) AS pad FROM range(5000) t(i)"
    raw = await stack.request(
        f"{subjects.ADMIN}.query.sql", json.dumps({"sql": sql, "limit": 5000}).encode(), 20
    )
    reply = json.loads(raw.data)
    assert len(raw.data) <= limits.MAX_REPLY, len(raw.data)
    assert reply["truncated"] is True and "limit" in reply["hint"]
    assert 0 < len(reply["rows"]) < 5000
    assert [r[0] for r in reply["rows"]] == list(range(len(reply["rows"])))  # cut from the end


def test_encode_reply_cuts_the_largest_list_and_keeps_the_rest() -> None:
    reply = {"seq": 7, "rows": [{"n": i, "pad": "y" * 500} for i in range(4000)]}
    data = rpc.encode_reply(reply)
    cut = json.loads(data)
    assert len(data) <= limits.MAX_REPLY and cut["seq"] == 7 and cut["truncated"] is True
    assert [r["n"] for r in cut["rows"]] == list(range(len(cut["rows"])))
    assert json.loads(rpc.encode_reply({"seq": 1, "rows": []})) == {"seq": 1, "rows": []}
