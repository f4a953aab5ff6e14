"""Preload and unload images across the fleet, like OpenKruise's ImagePullJob.

Commands (admin): ``hoist.admin.image.preload``, ``.job``, ``.jobs`` and ``.unload``; what each
takes and answers is in domain.contracts.images.  A job pulls on at most ``parallelism`` agents
at a time, retries a failed agent with doubling backoff (never for not-found or unauthorized),
and gives an agent up after ``timeout``; an unload is refused per agent where a kernel uses the
image or is about to, or a prepull policy wants it there.

Jobs live in the manager's memory (their effects are events: ImagePullStarted, ImagePulled,
ImagePreloaded); a restarted manager forgets the job views, not the preloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from domain import events as ev
from domain import rpc
from domain.contracts.commands import ListJobs
from domain.contracts.images import (
    JobRequest,
    PreloadRequest,
    UnloadRequest,
)
from domain.contracts.images import Targets as _Targets
from domain.image_ref import canonical_all, canonical_or_same
from domain.limits import quote
from domain.reasons import Reason, info
from domain.rpc import RequestError
from domain.status import ABOUT_TO_USE, IN_USE
from domain.subjects import JOBS, PROGRESS
from services.manager.agent_rpc import AgentRefused, AgentRpc, AgentUnreachable
from services.manager.fleet import Fleet
from transport.client import Client
from transport.connection import unsubscribe_all
from transport.tasks import Tasks

log = logging.getLogger(__name__)

_R = TypeVar("_R", PreloadRequest, UnloadRequest)
_PERMANENT = ("not found", "manifest unknown", "unauthorized", "denied")
MAX_JOBS = 200  # finished job views kept

AgentState = Literal["waiting", "pulling", "succeeded", "failed"]


@dataclass
class ImagePull:
    state: Literal["waiting", "pulling", "present", "pulled", "failed"] = "waiting"
    task_id: str | None = None
    current: int = 0
    total: int = 0
    reason: str | None = None


@dataclass
class AgentPull:
    state: AgentState = "waiting"
    reason: str | None = None
    attempts: int = 0
    images: dict[str, ImagePull] = field(default_factory=dict)


@dataclass
class Job:
    job_id: str
    request: PreloadRequest
    agents: dict[str, AgentPull]
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def view(self) -> dict[str, Any]:
        counts = {s: 0 for s in ("waiting", "pulling", "succeeded", "failed")}
        current = total = 0
        for a in self.agents.values():
            counts[a.state] += 1
            for i in a.images.values():
                current += i.current
                total += i.total
        r = self.request
        return {
            "job_id": self.job_id,
            "images": r.images,
            "parallelism": r.parallelism,
            "timeout": r.timeout,
            "backoff_limit": r.backoff_limit,
            "state": "done" if self.done.is_set() else "running",
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "overall": {"agents": len(self.agents), **counts, "current": current, "total": total},
            "agents": {
                agent_id: {
                    "state": a.state,
                    **({"reason": a.reason} if a.reason else {}),
                    "attempts": a.attempts,
                    "images": {
                        image: {
                            "state": i.state,
                            **({"task_id": i.task_id} if i.task_id else {}),
                            "current": i.current,
                            "total": i.total,
                            **({"reason": i.reason} if i.reason else {}),
                        }
                        for image, i in a.images.items()
                    },
                }
                for agent_id, a in self.agents.items()
            },
        }


def target_agents(fleet: Fleet, req: _Targets) -> tuple[list[str], dict[str, str]]:
    """The live agents a request names, and the named ones that cannot take part (why)."""
    chosen = [req.agents is not None, req.resource_group is not None, req.all]
    if sum(chosen) != 1:
        raise RequestError(
            "invalid-request",
            "agents, resource_group, all: give exactly one (a list of agent ids, a resource"
            " group, or all: true)",
        )
    if req.agents is not None:
        unknown = [a for a in req.agents if a not in fleet.agents]
        if unknown:
            raise RequestError(
                "not-found", f"agents: no agent {quote(unknown)}; list them with hoist agents"
            )
        ids = list(dict.fromkeys(req.agents))
        lost = {
            a: info(Reason.AGENT_LOST, fleet.agents[a].status_info)
            for a in ids
            if not fleet.agents[a].live
        }
        return [a for a in ids if a not in lost], lost
    ids = [
        a
        for a, s in fleet.agents.items()
        if s.live and (req.all or s.agent.resource_group == req.resource_group)
    ]
    if not ids:
        raise RequestError(
            "not-found",
            f"resource_group: no live agent in {req.resource_group!r}"
            if req.resource_group
            else "all: no live agent; start one with hoist agent",
        )
    return ids, {}


class ImagesAdmin:
    def __init__(
        self,
        nc: Client,
        fleet: Fleet,
        agents: AgentRpc,
        *,
        policy_pins: Callable[[str], dict[str, str]] = lambda agent_id: {},
    ) -> None:
        self.nc = nc
        self.fleet = fleet
        self.agents = agents
        self.policy_pins = policy_pins  # agent id -> {image: policy} the policies want there
        self.jobs: dict[str, Job] = {}
        # (agent id, task id) -> the image pulls of jobs following it
        self._following: dict[tuple[str, str], list[ImagePull]] = {}
        self._ends: dict[tuple[str, str], asyncio.Future[str | None]] = {}
        self._sub: Subscription | None = None
        self._tasks = Tasks()
        self._decoder = msgspec.json.Decoder(rpc.PullProgress)

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(f"{PROGRESS}.*.*", cb=self._on_progress)

    async def stop(self) -> None:
        await unsubscribe_all([self._sub])
        self._sub = None
        await self._tasks.stop()

    # -- commands ------------------------------------------------------------------------

    async def preload(self, req: PreloadRequest) -> dict[str, Any]:
        job = self.start_job(_canonical(req))
        if req.wait > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(req.wait):  # wait_for can lose a cancel on 3.11
                    await job.done.wait()
        return job.view()

    def start_job(self, req: PreloadRequest) -> Job:
        ids, lost = target_agents(self.fleet, req)
        job = Job(
            job_id=uuid.uuid4().hex,
            request=req,
            agents={a: AgentPull(images={i: ImagePull() for i in req.images}) for a in ids},
        )
        for agent_id, why in lost.items():
            job.agents[agent_id] = AgentPull(state="failed", reason=why)
        self.jobs[job.job_id] = job
        while len(self.jobs) > MAX_JOBS:
            oldest = next((j for j in self.jobs.values() if j.done.is_set()), None)
            if oldest is None:
                break
            del self.jobs[oldest.job_id]
        self._tasks.spawn(self._run(job, ids), f"preload job {job.job_id}")
        return job

    async def job(self, req: JobRequest) -> dict[str, Any]:
        job = self.jobs.get(req.job_id)
        if job is None:
            raise RequestError(
                "not-found", f"job_id: no preload job {req.job_id!r}; list them with {JOBS}"
            )
        return job.view()

    async def list_jobs(self, _: ListJobs) -> dict[str, Any]:
        return {
            "jobs": [
                {k: v for k, v in j.view().items() if k != "agents"} for j in self.jobs.values()
            ]
        }

    async def unload(self, req: UnloadRequest) -> dict[str, Any]:
        asked, req = req.images, _canonical(req)
        ids, lost = target_agents(self.fleet, req)
        out: dict[str, dict[str, dict[str, Any]]] = {
            a: {i: {"removed": False, "reason": why} for i in req.images} for a, why in lost.items()
        }
        slots = asyncio.Semaphore(16)

        async def unload_on(agent_id: str) -> None:
            results = {image: self.unload_refusal(agent_id, image) for image in req.images}
            ask = [image for image, why in results.items() if why is None]
            answers: dict[str, dict[str, Any]] = {
                image: {"removed": False, "reason": why}
                for image, why in results.items()
                if why is not None
            }
            if ask:
                async with slots:
                    try:
                        reply = await self.agents.call(
                            agent_id,
                            rpc.UNLOAD,
                            rpc.Unload(images=ask, reason="unload-requested: by an admin"),
                        )
                        answers.update(reply)
                    except (AgentUnreachable, AgentRefused) as e:
                        answers.update({i: {"removed": False, "reason": str(e)} for i in ask})
            out[agent_id] = {image: answers[image] for image in req.images}

        await asyncio.gather(*(unload_on(a) for a in ids))
        # Answered under the caller's own spelling of each image.
        return {
            "agents": {
                a: {image: r[canonical_or_same(image)] for image in asked} for a, r in out.items()
            }
        }

    def unload_refusal(self, agent_id: str, image: str) -> str | None:
        """Why the manager's view forbids removing ``image`` from the agent now, if it does."""
        for sid in self.fleet.sessions_on(agent_id):
            session = self.fleet.sessions[sid]
            if session.image != image:
                continue
            for k in session.kernels.values():
                if k.agent_id != agent_id:
                    continue
                if k.status in IN_USE:
                    return f"in-use: kernel {k.kernel_id} {k.status}"
                if k.status in ABOUT_TO_USE:
                    return f"about-to-use: kernel {k.kernel_id} {k.status}"
        policy = self.policy_pins(agent_id).get(image)
        if policy is not None:
            return (
                f"pinned: prepull policy {policy!r} wants it on this agent; change or remove"
                " the policy first"
            )
        return None

    # -- running a job -------------------------------------------------------------------

    async def _run(self, job: Job, ids: list[str]) -> None:
        slots = asyncio.Semaphore(job.request.parallelism)

        async def run_on(agent_id: str) -> None:
            async with slots:
                await self._agent(job, agent_id)

        try:
            await asyncio.gather(*(run_on(a) for a in ids))
        finally:
            job.ended_at = time.time()
            job.done.set()

    async def _agent(self, job: Job, agent_id: str) -> None:
        req = job.request
        pull = job.agents[agent_id]
        pull.state = "pulling"
        deadline = time.monotonic() + req.timeout
        delay = req.backoff
        while True:
            pull.attempts += 1
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel.
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    failure = await self._attempt(job, agent_id)
            except TimeoutError:
                pull.state = "failed"
                pull.reason = f"timeout: not done after {req.timeout:g}s"
                return
            if failure is None:
                pull.state, pull.reason = "succeeded", None
                return
            permanent = any(p in failure.lower() for p in _PERMANENT)
            if permanent or pull.attempts > req.backoff_limit:
                pull.state = "failed"
                pull.reason = f"{failure} (after {pull.attempts} attempt(s))"
                return
            if time.monotonic() + delay >= deadline:
                pull.state = "failed"
                pull.reason = f"timeout: not done after {req.timeout:g}s ({failure})"
                return
            pull.reason = f"retrying in {delay:g}s: {failure}"
            await asyncio.sleep(delay)
            delay *= 2

    async def _attempt(self, job: Job, agent_id: str) -> str | None:
        """One preload of the images not yet there; the first failure's reason, or None."""
        pull = job.agents[agent_id]
        wanted = [i for i, p in pull.images.items() if p.state not in ("present", "pulled")]
        try:
            reply = await self.agents.call(
                agent_id,
                rpc.PRELOAD,
                rpc.Preload(images=wanted, reason=f"preload: job {job.job_id}", pinned=True),
            )
        except (AgentUnreachable, AgentRefused) as e:
            return str(e)
        waits = []
        for image in wanted:
            answer = reply.get(image) or {}
            state = pull.images[image]
            state.reason = None
            if answer.get("task_id"):
                state.state, state.task_id = "pulling", answer["task_id"]
                waits.append(self._wait_pull(agent_id, image, state))
            else:
                size = int(answer.get("size") or 0)
                state.state, state.current, state.total = "present", size, size
        failures = [r for r in await asyncio.gather(*waits) if r is not None]
        return failures[0] if failures else None

    async def _wait_pull(self, agent_id: str, image: str, state: ImagePull) -> str | None:
        assert state.task_id is not None
        key = (agent_id, state.task_id)
        self._following.setdefault(key, []).append(state)
        fut = self._ends.get(key)
        if fut is None:
            fut = self._ends[key] = asyncio.get_running_loop().create_future()
        try:
            while not fut.done():
                # The event may have been folded before we listened: look at the view too.
                outcome = self._outcome_in_view(agent_id, image, state.task_id)
                if outcome is not None:
                    if not fut.done():
                        fut.set_result(outcome[1])
                    break
                await asyncio.wait([fut], timeout=1.0)
            reason = fut.result()
        finally:
            following = self._following.get(key, [])
            if state in following:
                following.remove(state)
            if not following:
                self._following.pop(key, None)
                self._ends.pop(key, None)
        if reason is None:
            state.state = "pulled"
            state.current = state.total = max(state.total, state.current)
            held = self.fleet.agents[agent_id].agent.images.get(image)
            if held is not None and state.total == 0:
                state.current = state.total = held.size_bytes
            return None
        state.state, state.reason = "failed", reason
        return f"image {image}: {reason}"

    def _outcome_in_view(
        self, agent_id: str, image: str, task_id: str
    ) -> tuple[bool, str | None] | None:
        s = self.fleet.agents.get(agent_id)
        if s is None:
            return None
        if s.agent.pulls.get(image) == task_id:
            return None
        failed = s.failed_pulls.get(image)
        if failed is not None and failed[0] == task_id:
            return False, failed[1]
        if image in s.agent.images:
            return True, None
        return None

    def pull_ended(self, event: ev.ImagePulled | ev.ImagePullFailed) -> None:
        """A bus handler: a job waiting for this pull learns how it ended."""
        fut = self._ends.get((event.originator_id, event.task_id))
        if fut is not None and not fut.done():
            fut.set_result(event.reason if isinstance(event, ev.ImagePullFailed) else None)

    async def _on_progress(self, msg: Msg) -> None:
        _, _, agent_id, task_id = msg.subject.split(".", 3)
        following = self._following.get((agent_id, task_id))
        if not following:
            return
        try:
            p = self._decoder.decode(msg.data)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return
        for state in following:
            state.current = max(state.current, p.current)
            state.total = max(state.total, p.total)


def _canonical(req: _R) -> _R:
    """The request with each image canonical, so one image is one pull and one unload
    whatever it is called; InvalidField (refused, nothing done) for a bad reference."""
    return msgspec.structs.replace(req, images=canonical_all(req.images))
