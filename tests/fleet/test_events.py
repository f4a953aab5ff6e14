"""The fleet's events: wire round trips, and what the Agent aggregate makes of ImagePreloaded."""

from __future__ import annotations

import pytest

from domain.agent import Agent
from domain.codec import decode, encode
from domain.errors import DomainError
from domain.prepull import PrepullPolicy

IMAGES = {
    "a:1": {"digest": "sha256:aa", "size_bytes": 10},
    "b:1": {"digest": "sha256:bb", "size_bytes": 20},
}


def _agent() -> Agent:
    return Agent.register(
        agent_id="x1",
        resource_group="default",
        capacity={"cpu": 1, "mem": 2**30, "disk": 2**30},
        runtime="dummy",
        images=IMAGES,
    )


def test_fleet_events_round_trip() -> None:
    agent = _agent()
    agent.mark_preloaded("a:1", "preload: job j1", pinned=True)
    policy = PrepullPolicy.set(
        None,
        name="torch",
        resource_groups=["gpu"],
        rules=[
            {"kind": "newest-tags", "repository": "ml/torch", "count": 2},
            {"kind": "large-recent", "min_bytes": 2**30, "days": 7},
            {"kind": "images", "images": ["a:1"]},
        ],
        priority=5,
    )
    policy.remove()
    events = [*agent.collect_events()[1:], *policy.collect_events()]
    assert [type(e).__name__ for e in events] == [
        "ImagePreloaded",
        "PrepullPolicySet",
        "PrepullPolicyRemoved",
    ]
    for event in events:
        data, headers = encode(event)
        assert headers["Hoist-Schema"] == "1"
        assert decode(data, headers) == event


def test_preload_marks_follow_the_images() -> None:
    agent = _agent()
    agent.mark_preloaded("a:1", "prepull-policy: p", pinned=False)
    agent.mark_preloaded("a:1", "prepull-policy: p", pinned=False)  # known: nothing new
    agent.mark_preloaded("a:1", "preload: job j1", pinned=True)  # a job pins it: new fact
    agent.mark_preloaded("b:1", "preload: job j1", pinned=True)
    assert agent.preloaded == {"docker.io/library/a:1": True, "docker.io/library/b:1": True}
    assert len(agent.collect_events()) == 4  # registered + three marks
    agent.image_removed("b:1", "unload-requested: by an admin")
    assert agent.preloaded == {"docker.io/library/a:1": True}
    agent.reregister(
        resource_group="default",
        capacity={"cpu": 1, "mem": 2**30, "disk": 2**30},
        runtime="dummy",
        images={"a:1": IMAGES["a:1"]},
    )
    assert agent.preloaded == {
        "docker.io/library/a:1": True
    }  # still held after the restart: still pinned
    with pytest.raises(DomainError, match=r"holds no image 'docker\.io/library/c:1'"):
        agent.mark_preloaded("c:1", "preload: job j2", pinned=True)
