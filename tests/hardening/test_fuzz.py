"""Hypothesis over every documented request subject (commands, queries, admin) against a real
`hoist up` stack with dummy agents, as the client, admin and agent NATS roles: every request
gets exactly one reply, every invalid one an error that is never ``internal``, the event stream
does not move, and afterwards the read models still follow."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from domain import subjects
from tests.hardening.fuzzing import ROLE_SUBJECTS, TEMPLATES, FuzzStack, bad_requests, check_bad
from transport.client import Client

EXAMPLES = 2500
CREATE = f"{subjects.API}.session.create"


# After a request was taken, time for what it would (wrongly) do to show: an answer or an
# append takes milliseconds, but a loaded host (2 cores, 3-4 test workers) can stall a process
# for longer than 0.3 s; nothing shows the absence of an answer sooner than a pause.
LAND_S = 1.0


async def _answered(nc: Client, *subject: str) -> None:
    """Ask each subject from an inbox (a create that is refused at once: it appends nothing);
    return once every one answered."""
    for s in subject:
        reply = await nc.request(s, b"{}", timeout=10)
        assert reply.data, s


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzStack]:
    with FuzzStack(tmp_path_factory.mktemp("fuzz") / "hoist") as stack:
        yield stack


def test_every_template_is_a_valid_request_that_appends_nothing(fuzz: FuzzStack) -> None:
    # The fuzz changes one field of these: each must be valid as it stands, so the bad value
    # is what gets refused.  (The create template is valid and appends: the last test sends it.)
    before = fuzz.events()
    for subject, template in TEMPLATES.items():
        if subject == CREATE:
            continue
        role = "admin" if subject.startswith(subjects.ADMIN) else "client"
        reply = fuzz.ask(role, subject, json.dumps(template).encode())
        assert reply.get("error", {}).get("code") in (None, "not-found"), (subject, reply)
    assert fuzz.events() == before


def test_nats_refuses_what_a_role_may_not_send(fuzz: FuzzStack) -> None:
    refusals = [
        (role, subject)
        for role, allowed in ROLE_SUBJECTS.items()
        for subject in TEMPLATES
        if subject not in allowed
    ]
    assert {r for r, _ in refusals} == {"client", "agent"}

    async def all_refused() -> list[str]:
        return list(await asyncio.gather(*(fuzz.refused(r, s) for r, s in refusals)))

    # No responder sees the message, and nats-server sends no "no responders" for it either.
    assert set(fuzz.run(all_refused())) == {"timeout"}


def test_replies_go_to_inboxes_only(fuzz: FuzzStack) -> None:
    # A reply subject is the requester's to choose; the manager may write session, liveness
    # and agent-RPC subjects, so an answer aimed there would land in the log or at an agent.
    before = fuzz.held()
    client = fuzz.conns["client"]
    targets = [
        "hoist.events.session.forged",
        "hoist.events.liveness.agent-1",
        "hoist.agent.agent-1.unload",
    ]
    requests = [
        (f"{subjects.QUERY}.kernels", b"{}"),
        (CREATE, json.dumps({**TEMPLATES[CREATE], "request_id": "aimed"}).encode()),
    ]

    async def aim() -> None:
        for target in targets:
            for subject, payload in requests:
                await client.publish(subject, payload, reply=target)
        await client.flush()
        # The same subjects asked from an inbox: once these are answered, the aimed requests
        # were taken (each subscription delivers in order); then time for a (wrong) answer
        # of theirs, under way by then, to land.
        await _answered(client, f"{subjects.QUERY}.kernels", CREATE)
        await asyncio.sleep(LAND_S)

    fuzz.run(aim())
    # The client's requests come through its account's import: the manager sees nats-server's
    # _R_ stand-in for the reply, not the aimed subject, and may serve the create (the client's
    # own command); its answer goes back to the readers' account, where nothing stores it nor
    # serves agent RPC. So the log holds no reply, only what the aimed create itself records
    # (its session's events, and its placement's: the agent's and its reservation's).
    sessions = fuzz.ask("client", f"{subjects.QUERY}.sessions", b"{}")
    aimed = [r["session_id"] for r in sessions["rows"] if r.get("request_id") == "aimed"]
    assert len(aimed) <= 1, sessions
    held = fuzz.held()
    grown = {subject for subject, n in held.items() if n > before.get(subject, 0)}
    placed = (f"{subjects.EVENTS}.agent.", f"{subjects.EVENTS}.{subjects.RESERVATION}.")
    its_own = {subjects.session_events(sid) for sid in aimed}
    assert all(s in its_own or (aimed and s.startswith(placed)) for s in grown), held
    assert not any(target in held for target in targets), held


def test_a_message_without_an_inbox_is_no_command(fuzz: FuzzStack) -> None:
    # The server answers a JetStream request on whatever reply subject it names, unchecked:
    # an agent stores a create command as "progress", a client asks for it by direct get with
    # the reply aimed at the create subject; it arrives there with no reply of its own.
    before = fuzz.events()
    create = json.dumps({**TEMPLATES[CREATE], "request_id": "reflected"}).encode()
    stored = f"{subjects.PROGRESS}.agent-1.reflected"

    async def reflect() -> None:
        await fuzz.conns["agent"].request(stored, create, timeout=5)  # stored and acked
        await fuzz.conns["client"].publish(CREATE, create)  # and plainly, without a reply
        await fuzz.conns["client"].publish(
            f"$JS.API.DIRECT.GET.{subjects.PROGRESS_STREAM}",
            json.dumps({"last_by_subj": stored}).encode(),
            reply=CREATE,
        )
        # Asked again from an inbox: once answered, the reflection is out; then the create
        # subject from an inbox: once answered, the manager took what came there before.
        await fuzz.conns["client"].request(
            f"$JS.API.DIRECT.GET.{subjects.PROGRESS_STREAM}",
            json.dumps({"last_by_subj": stored}).encode(),
            timeout=10,
        )
        await _answered(fuzz.conns["client"], CREATE)
        await asyncio.sleep(LAND_S)

    fuzz.run(reflect())
    assert fuzz.events() == before
    sessions = fuzz.ask("client", f"{subjects.QUERY}.sessions", b"{}")
    assert all(r.get("request_id") != "reflected" for r in sessions["rows"]), sessions


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(request=bad_requests())
def test_bad_requests_get_one_error_reply_and_append_nothing(
    fuzz: FuzzStack, request: tuple[str, str, bytes, str]
) -> None:
    check_bad(fuzz, check_stream=True)(request)


def test_after_the_fuzz_the_read_models_still_follow(fuzz: FuzzStack) -> None:
    # Runs after the fuzz (tests run in file order, on the module's stack).
    assert fuzz.stats.replies >= EXAMPLES, fuzz.stats
    assert "internal" not in fuzz.stats.codes
    create = {**TEMPLATES[CREATE], "request_id": "after-fuzz"}
    session = fuzz.ask("client", CREATE, json.dumps(create).encode())
    assert "error" not in session, session
    seq = fuzz.last_seq()
    query = {"session_id": session["session_id"], "min_seq": seq, "timeout": 15}
    reply = fuzz.ask("client", f"{subjects.QUERY}.sessions", json.dumps(query).encode())
    assert reply["seq"] >= seq and [r["session_id"] for r in reply["rows"]] == [
        session["session_id"]
    ], reply
