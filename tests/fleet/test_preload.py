"""Preload jobs and unload on dummy agents: bounded parallelism, progress, results per agent,
backoff and permanent failures, refusals from the manager's view."""

from __future__ import annotations

import asyncio

from agent.runtime.base import PulledImage
from agent.runtime.dummy import PullFailure
from domain import events as ev
from domain.subjects import JOB, JOBS, PRELOAD, UNLOAD
from domain.subjects import agent_events as agent_subject
from eventstore.store import EventStore
from tests.agent.agent_harness import agent_events, wait_for
from tests.fleet.fleet_harness import admin, fleet
from tests.manager.harness import GB, MB, create, manager, request, until
from transport.client import Client

DISKS = {f"p{i}": 10 * GB for i in range(6)}


async def test_a_preload_job_pulls_with_bounded_parallelism_and_reports_progress(
    nc: Client, store: EventStore
) -> None:
    slow = {"bandwidth_bps": 40 * MB, "default_size": 12 * MB, "tick_s": 0.02}
    async with fleet(nc, store, DISKS, **slow) as agents, manager(nc):
        job = await admin(
            nc, PRELOAD, {"images": ["py:3"], "all": True, "parallelism": 2, "backoff": 0.05}
        )
        assert job["state"] == "running" and job["overall"]["agents"] == 6
        most, seen_bytes = 0, []
        while job["state"] == "running":
            await asyncio.sleep(0.05)
            job = await admin(nc, JOB, {"job_id": job["job_id"]})
            most = max(most, job["overall"]["pulling"])
            seen_bytes.append(job["overall"]["current"])
        assert most == 2  # never more agents at once than asked
        assert seen_bytes == sorted(seen_bytes) and len(set(seen_bytes)) > 3  # progress grew
        assert job["overall"] | {"agents": 6} == {
            "agents": 6, "waiting": 0, "pulling": 0, "succeeded": 6, "failed": 0,
            "current": 6 * 12 * MB, "total": 6 * 12 * MB,
        }  # fmt: skip
        for agent_id, result in job["agents"].items():
            assert result["state"] == "succeeded" and result["attempts"] == 1
            assert result["images"]["docker.io/library/py:3"]["state"] == "pulled"
            assert (
                "docker.io/library/py:3" in agents[agent_id].image_gc.preloaded
            )  # pinned against image GC
        [preloaded] = [e for e in await agent_events(store, "p0") if type(e) is ev.ImagePreloaded]
        assert preloaded.image == "docker.io/library/py:3" and preloaded.pinned
        assert preloaded.reason == f"preload: job {job['job_id']}"
        listed = await admin(nc, JOBS, {})
        assert [j["job_id"] for j in listed["jobs"]] == [job["job_id"]]


async def test_failures_are_per_agent_with_reasons_retries_and_no_retry_when_not_found(
    nc: Client, store: EventStore
) -> None:
    flaky = {"flaky:1": PullFailure("transient", "registry hiccup", times=5)}
    async with fleet(nc, store, {"f1": 10 * GB}, pull_failures=flaky, default_size=MB), manager(nc):
        job = await admin(
            nc,
            PRELOAD,
            {"images": ["flaky:1"], "agents": ["f1"], "backoff": 0.05, "wait": 20},
        )
        result = job["agents"]["f1"]
        # The agent gives up after its own 4 attempts; the job tries again and it works.
        assert result["state"] == "succeeded" and result["attempts"] == 2, result
    async with (
        fleet(nc, store, {"f2": 10 * GB}, default_size=None),
        manager(nc),
    ):
        job = await admin(nc, PRELOAD, {"images": ["ghost:1"], "agents": ["f2"], "wait": 20})
        result = job["agents"]["f2"]
        assert result["state"] == "failed" and result["attempts"] == 1
        assert result["reason"] == (
            "image docker.io/library/ghost:1: manifest for docker.io/library/ghost:1 not found:"
            " manifest unknown (after 1 attempt(s))"
        )
        bad = await request(nc, PRELOAD, {"images": ["x:1"], "agents": ["f2"], "all": True})
        assert bad["error"]["code"] == "invalid-request" and "agents" in bad["error"]["message"]
        bad = await request(nc, PRELOAD, {"images": ["x:1"], "resource_group": "nowhere"})
        assert bad["error"]["code"] == "not-found" and "resource_group" in bad["error"]["message"]


async def test_unload_is_refused_where_a_kernel_uses_or_is_about_to_use_the_image(
    nc: Client, store: EventStore
) -> None:
    slow = {"bandwidth_bps": 1 * MB, "default_size": 40 * MB, "tick_s": 0.05}
    async with fleet(nc, store, {"u1": 10 * GB}, **slow) as agents, manager(nc) as m:
        running = await create(nc, max_wait=5)
        pulling = await create(nc, image="py:3")
        await until(nc, pulling["session_id"], lambda s: s["status"] == "PULLING", 5)
        # An image left on the host, used by nothing.
        agents["u1"].runtime.images["old:1"] = PulledImage("old:1", "sha256:old", 5 * MB)
        await agents["u1"].facts.register()  # re-register: the manager's view holds old:1
        # Once the manager folded it: a re-registration it folds during the call ends the call.
        registered = await store.last_seq(agent_subject("u1"))
        await wait_for(lambda: m.fleet.last_seq >= registered, 5, "the re-registration folded")
        reply = await admin(
            nc, UNLOAD, {"images": ["base:1", "py:3", "old:1", "none:1"], "agents": ["u1"]}
        )
        [kernel] = running["kernels"]
        [waiting] = pulling["kernels"]
        assert reply == {
            "agents": {
                "u1": {
                    "base:1": {
                        "removed": False,
                        "reason": f"in-use: kernel {kernel['kernel_id']} RUNNING",
                    },
                    "py:3": {
                        "removed": False,
                        "reason": f"about-to-use: kernel {waiting['kernel_id']} PULLING",
                    },
                    "old:1": {"removed": True},
                    "none:1": {"removed": False, "reason": "not-present"},
                }
            }
        }
        removed = [e for e in await agent_events(store, "u1") if type(e) is ev.ImageRemoved]
        assert [(e.image, e.reason) for e in removed] == [
            ("docker.io/library/old:1", "unload-requested: by an admin")
        ]
        await wait_for(lambda: "old:1" not in agents["u1"].runtime.images, 5, "old:1 gone")
