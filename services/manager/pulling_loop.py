"""The check-pulling-kernels loop (seed 000): every PULLING kernel is looked at periodically,
so a pull the reactors cannot see finish still ends.

For each PULLING kernel:
- the agent holds the image (view) -> the session's worker promotes it;
- PULLING longer than the pull timeout -> CANCELLED ``pull-timeout: ...``;
- otherwise its agent is asked ``pull-status`` for the task (once per task):
  done -> PREPARED (its ImagePulled was lost); failed -> CANCELLED ``image-pull-failed``;
  unknown to the agent (it restarted) -> check-and-pull again (present -> PREPARED, else the
  new task is followed); no byte of progress for the stall timeout -> CANCELLED
  ``pull-stalled: ...``.
Progress marks live in memory: after a manager restart the stall clock starts again, the pull
timeout does not (it counts from the PULLING status in the log).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from datetime import UTC, datetime

import msgspec

from domain import rpc
from domain.session import Session
from domain.status import KernelStatus
from services.manager.fleet import Fleet
from services.manager.reactors import AgentRefused, AgentRpc, AgentUnreachable, Reactors

log = logging.getLogger(__name__)

S = KernelStatus


class PullingLoop:
    def __init__(
        self,
        fleet: Fleet,
        agents: AgentRpc,
        reactors: Reactors,
        *,
        interval_s: float = 5.0,
        pull_timeout_s: float = 7200.0,
        stall_timeout_s: float = 300.0,
    ) -> None:
        for name, value in (
            ("interval_s", interval_s),
            ("pull_timeout_s", pull_timeout_s),
            ("stall_timeout_s", stall_timeout_s),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        self.fleet = fleet
        self.agents = agents
        self.reactors = reactors
        self.interval_s = interval_s
        self.pull_timeout_s = pull_timeout_s
        self.stall_timeout_s = stall_timeout_s
        # (agent id, task id) -> (bytes, state) last seen and when they last changed
        self._progress: dict[tuple[str, str], tuple[tuple[int, str], float]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception:
                log.exception("check-pulling-kernels")

    async def check(self) -> None:
        """One round over every PULLING kernel."""
        now = datetime.now(UTC)
        tasks: defaultdict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
        pulling: set[str] = set()
        for agent_id, sids in list(self.fleet.pulling_on_agent.items()):
            state = self.fleet.agents.get(agent_id)
            for sid in list(sids):
                session = self.fleet.sessions[sid]
                for k in session.kernels.values():
                    if k.status is not S.PULLING or k.agent_id != agent_id:
                        continue
                    pulling.add(k.kernel_id)
                    if state is not None and session.image in state.agent.images:
                        self.reactors.kick(sid)
                        continue
                    waited = (now - k.status_history[-1].at).total_seconds()
                    if waited >= self.pull_timeout_s:
                        reason = f"pull-timeout: not pulled after {self.pull_timeout_s:g}s"
                        await self._end(sid, k.kernel_id, reason)
                        continue
                    task_id = self.reactors.retask.get(k.kernel_id) or k.pull_task_id or ""
                    tasks[(agent_id, task_id)].append((sid, k.kernel_id))
        await asyncio.gather(*(self._follow(a, t, ks) for (a, t), ks in tasks.items()))
        alive = set(tasks)
        for key in [k for k in self._progress if k not in alive]:
            del self._progress[key]
        # A kernel that left PULLING (prepared by the pull, cancelled) needs no retask any more.
        for kid in [k for k in self.reactors.retask if k not in pulling]:
            del self.reactors.retask[kid]

    async def _follow(self, agent_id: str, task_id: str, kernels: list[tuple[str, str]]) -> None:
        key = (agent_id, task_id)
        try:
            reply = msgspec.convert(
                await self.agents.call(agent_id, rpc.PULL_STATUS, rpc.PullStatus(task_id=task_id)),
                rpc.PullStatusReply,
            )
        except (AgentUnreachable, AgentRefused) as e:
            log.info("pull %s on agent %s: no status (%s)", task_id, agent_id, e)
            reply = None
        if reply is not None and reply.known and reply.state == "done":
            for sid, kid in kernels:
                await self._promote(sid, kid, "image-pulled: seen by check-pulling-kernels")
            return
        if reply is not None and reply.known and reply.state == "failed":
            for sid, kid in kernels:
                await self._end(sid, kid, f"image-pull-failed: {reply.reason or 'failed'}")
            return
        if reply is not None and not reply.known:
            await self._ask_again(agent_id, kernels)
            return
        mark = (reply.current, reply.state or "") if reply is not None else None
        now = time.monotonic()
        seen = self._progress.get(key)
        if seen is None or (mark is not None and mark != seen[0]):
            self._progress[key] = (mark or (-1, ""), now)
            return
        if now - seen[1] >= self.stall_timeout_s:
            reason = f"pull-stalled: no progress for {self.stall_timeout_s:g}s"
            for sid, kid in kernels:
                await self._end(sid, kid, reason)

    async def _ask_again(self, agent_id: str, kernels: list[tuple[str, str]]) -> None:
        image = self.fleet.sessions[kernels[0][0]].image
        try:
            reply = await self.agents.call(
                agent_id, rpc.CHECK_AND_PULL, rpc.CheckAndPull(images=[image])
            )
            answer = reply[image]
        except (AgentUnreachable, AgentRefused, KeyError, TypeError) as e:
            log.info("agent %s: check-and-pull of %s asked again: %s", agent_id, image, e)
            return
        for sid, kid in kernels:
            if answer.get("task_id"):
                self.reactors.retask[kid] = answer["task_id"]
            else:
                await self._promote(sid, kid, "image-present: seen by check-pulling-kernels")

    async def _promote(self, session_id: str, kernel_id: str, info: str) -> None:
        def decide(session: Session) -> None:
            if session.kernels[kernel_id].status is S.PULLING:
                session.mark_prepared(kernel_id, info)

        if await self.reactors.record(session_id, decide):
            self.reactors.kick(session_id)

    async def _end(self, session_id: str, kernel_id: str, info: str) -> None:
        def decide(session: Session) -> None:
            if session.kernels[kernel_id].status is S.PULLING:
                session.cancel(kernel_id, info)

        if await self.reactors.record(session_id, decide):
            self.reactors.retask.pop(kernel_id, None)
            self.reactors.kick(session_id)
