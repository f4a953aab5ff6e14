"""One image, one name (issue 15): ``python``, ``python:latest`` and
``docker.io/library/python:latest`` are one image for pulls, the agent's inventory and the
agents-images read model; a bad reference is refused at create with the grammar's reason; older
events naming images short fold onto the canonical name."""

from __future__ import annotations

import asyncio

import duckdb
import msgspec
import pytest

from domain import events as ev
from domain.agent import Agent
from domain.errors import InvalidField
from domain.image_ref import canonical, canonical_repository, familiar, repository_of
from domain.session import Session
from domain.subjects import SESSION_CREATE
from eventstore.store import EventStore
from projections import ALL
from projections.runner import Runner
from tests.manager.harness import agents, create_payload, manager, request, until
from tests.projections.conftest import rows
from transport.client import Client

PY = "docker.io/library/python:latest"
SPELLINGS = ["python", "python:latest", PY]


def test_the_grammar_decides_and_docker_normalises() -> None:
    assert {canonical(s) for s in SPELLINGS} == {PY}
    assert canonical("localhost:5000/busybox:1") == "localhost:5000/busybox:1"  # left alone
    assert canonical("localhost:5000/x") == "localhost:5000/x:latest"
    digest = "sha256:" + "a" * 64
    assert canonical(f"python@{digest}") == f"docker.io/library/python@{digest}"
    assert canonical("team/app:1") == "docker.io/team/app:1"
    assert familiar(PY) == "python:latest" and familiar("docker.io/team/app:1") == "team/app:1"
    assert canonical_repository("ml/torch") == "docker.io/ml/torch"
    with pytest.raises(InvalidField, match=r"^image: invalid reference format: repository name"):
        canonical("UPPER/Case:bad tag")
    with pytest.raises(InvalidField, match=r"^image: invalid reference format"):
        canonical("python:bad tag")
    with pytest.raises(InvalidField, match=r"rules\[0\]\.repository: must be a repository"):
        canonical_repository("ml/torch:1", "rules[0].repository")


def test_old_events_with_short_names_fold_to_the_canonical_one() -> None:
    session = Session.enqueue(
        owner="alice", image="python", resources={"cpu": 1, "mem": 2**28}, resource_group="d"
    )
    [enqueued] = session.collect_events()
    assert enqueued.image == PY  # new events are written canonical
    old = msgspec.structs.replace(enqueued, image="python")  # as written before
    assert old.mutate(None).image == PY

    agent = Agent.register(
        agent_id="a1",
        resource_group="d",
        capacity={"cpu": 1, "mem": 2**30, "disk": 2**30},
        runtime="dummy",
    )
    [registered] = agent.collect_events()
    held = ev.HeldImage(digest="sha256:x", size_bytes=5)
    old_reg = msgspec.structs.replace(registered, images={"python:latest": held})
    folded = old_reg.mutate(None)
    assert set(folded.images) == {PY}
    folded.pull_started("python", "t1")  # another spelling: the same image
    [started] = folded.collect_events()
    assert started.image == PY and folded.pulls == {PY: "t1"}
    removed = ev.ImageRemoved(
        originator_id=folded.id,
        originator_version=folded.version + 1,
        timestamp=started.timestamp,
        image="python",
        reason="gc",
    )
    removed.mutate(folded)
    assert folded.images == {}


async def test_three_spellings_are_one_pull_and_one_image_row(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"]) as running, manager(nc):
        replies = await asyncio.gather(
            *(request(nc, SESSION_CREATE, create_payload(image=s)) for s in SPELLINGS)
        )
        for reply in replies:
            assert "error" not in reply, reply
            assert reply["image"] == PY
            done = await until(nc, reply["session_id"], lambda s: s["status"] == "RUNNING")
            assert done["status"] == "RUNNING", done
        # The dummy engine names what it holds as Docker does (python:latest): one pull.
        assert running["a1"].runtime.pull_attempts == {"python:latest": 1}
    con = duckdb.connect()
    await Runner(con, store, ALL).run(follow=False)
    held = rows(con, "SELECT image FROM agent_images_view WHERE image LIKE '%python%'")
    assert [r["image"] for r in held] == [PY]


async def test_a_bad_reference_is_refused_at_create_and_nothing_is_appended(
    nc: Client, store: EventStore
) -> None:
    async with manager(nc):
        before = await store.head()
        reply = await request(nc, SESSION_CREATE, create_payload(image="UPPER/Case:bad tag"))
        assert reply["error"]["code"] == "invalid-request", reply
        assert reply["error"]["message"].startswith(
            "image: invalid reference format: repository name (Case) must be lowercase"
        )
        assert await store.head() == before


def test_repository_of_splits_the_tag_not_a_registry_port_nor_a_digest() -> None:
    assert repository_of("localhost:5000/app:1.2") == ("localhost:5000/app", "1.2")
    assert repository_of("localhost:5000/app") == ("localhost:5000/app", "latest")
    assert repository_of("docker.io/ml/torch@sha256:" + "a" * 64) == (
        "docker.io/ml/torch",
        "latest",
    )
