"""Lifecycle hooks on a real nats-server with dummy agents: a hook refuses a create before
anything is recorded, hears the schedule and the end; one that raises, hangs or answers
nonsense is skipped, the session's log says so, and the manager goes on serving."""

from __future__ import annotations

import time

import pytest

from domain import events as ev
from domain import subjects
from domain.codec import decode
from domain.subjects import SESSION_CREATE, SESSION_DESTROY, session_events
from eventstore.store import EventStore
from services.manager.hooks import Hooks
from tests.agent.agent_harness import wait_for
from tests.manager.harness import agents, create, create_payload, manager, request, until
from tests.manager.hook_plugins import Recorder
from transport.client import Client

PLUGINS = "tests.manager.hook_plugins"
SESSIONS = f"{subjects.EVENTS}.session.>"
HOOKS = tuple(f"{PLUGINS}:{name}" for name in ("Recorder", "Raising", "Hanging", "Answering"))


async def _notes(store: EventStore, sid: str) -> list[tuple[str, str, str]]:
    records = await store.read_subject(session_events(sid))
    found = [decode(r.data, r.headers) for r in records]
    return [(e.hook, e.phase, e.reason) for e in found if isinstance(e, ev.HookSkipped)]


async def test_hooks_refuse_hear_and_are_skipped_when_they_fail(
    nc: Client, store: EventStore
) -> None:
    Recorder.scheduled.clear()
    Recorder.ended.clear()
    async with agents(nc, store, ["a1"]), manager(nc, hooks=HOOKS, hook_timeout_s=0.3) as m:
        assert [h.name for h in m.hooks.hooks][-4:] == [
            "Recorder",
            "Raising",
            "Hanging",
            "Answering",
        ]

        # A refusal: the user reads the hook's reason, and nothing is recorded.
        before = await store.last_seq(SESSIONS)
        refused = await request(nc, SESSION_CREATE, create_payload(owner="mallory"))
        assert refused["error"]["code"] == "forbidden", refused
        assert refused["error"]["message"] == (
            "refused by hook Recorder: mallory may not run sessions here"
        )
        assert await store.last_seq(SESSIONS) == before

        # Accepted despite the failing hooks, each skipped in time and noted in the log.
        started = time.monotonic()
        sid = (await create(nc, owner="alice", labels={"team": "ml"}))["session_id"]
        assert time.monotonic() - started < 5  # the hanging one held it 0.3 s, no more
        await until(nc, sid, lambda s: s["status"] == "RUNNING", what="runs")
        await wait_for(lambda: any(s.session_id == sid for s in Recorder.scheduled), 5, "told")
        told = next(s for s in Recorder.scheduled if s.session_id == sid)
        assert told.agents == ["a1"] and told.labels == {"team": "ml"}

        assert await request(nc, SESSION_DESTROY, {"session_id": sid}) is not None
        await until(nc, sid, what="ended")
        await wait_for(lambda: any(s.session_id == sid for s in Recorder.ended), 5, "told end")
        assert [s.status for s in Recorder.ended if s.session_id == sid] == ["TERMINATED"]

        async def noted() -> bool:
            return len(await _notes(store, sid)) == 5

        await wait_for(noted, 5, "five notes")
        assert sorted(await _notes(store, sid)) == [
            ("Answering", "enqueue", "answered int, not a text or None"),
            ("Hanging", "enqueue", "no answer within 0.3s"),
            ("Hanging", "schedule", "no answer within 0.3s"),
            ("Raising", "end", "raised ValueError: no end for you"),
            ("Raising", "enqueue", "raised RuntimeError: boom"),
        ]
        # The manager goes on: another create is answered at once.
        assert (await create(nc, owner="bob"))["status"] in {"PENDING", "SCHEDULED", "RUNNING"}


async def test_the_shipped_example_refuses_registries_outside_the_list(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "allowed-registries" in [h.name for h in Hooks.load().hooks]  # an entry point
    async with agents(nc, store, ["a1"]), manager(nc):
        # Idle until configured.
        assert "error" not in await request(nc, SESSION_CREATE, create_payload())
        monkeypatch.setenv("HOIST_ALLOWED_REGISTRIES", "registry.example.com:5000")
        refused = await request(nc, SESSION_CREATE, create_payload(image="busybox:1"))
        assert refused["error"]["message"] == (
            "refused by hook allowed-registries: image docker.io/library/busybox:1 is from"
            " registry docker.io, which is not allowed here; use an image from"
            " registry.example.com:5000"
        ), refused
        allowed = create_payload(image="registry.example.com:5000/team/tool:2")
        assert "error" not in await request(nc, SESSION_CREATE, allowed)


def test_a_hook_that_cannot_be_loaded_is_left_out_and_a_bad_time_limit_refused() -> None:
    hooks = Hooks.load([f"{PLUGINS}:Missing", "no.such.module:X", f"{PLUGINS}:Recorder"])
    assert [h.name for h in hooks.hooks][-1:] == ["Recorder"]
    assert "Missing" not in [h.name for h in hooks.hooks]
    with pytest.raises(ValueError, match="hook_timeout_s must be > 0"):
        Hooks(timeout_s=0)
