"""The check-pulling-kernels loop: every PULLING kernel is looked at periodically,
so a pull the reactors cannot see finish still ends.

For each PULLING kernel:
- the agent holds the image (view; for a kernel a create sent back for its image, once the
  view saw the pull it waits for finish: Fleet.image_there_for) -> PREPARED;
- PULLING longer than the pull timeout -> CANCELLED ``pull-timeout: ...``;
- otherwise its agent is asked ``pull-status`` for the task (once per task):
  done -> PREPARED (its ImagePulled was lost); failed -> CANCELLED ``image-pull-failed``;
  unknown to the agent (it restarted) -> check-and-pull again (present -> PREPARED, else the
  new task is recorded, KernelPulling again, and followed by everyone); no byte of progress
  for the stall timeout -> CANCELLED ``pull-stalled: ...``.
Progress marks live in memory: after a manager restart the stall clock starts again, the pull
timeout does not (it counts from the first PULLING status in the log, asked again or not).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from datetime import UTC, datetime
from functools import partial

import msgspec

from domain import rpc
from domain.reasons import Reason, info
from domain.session import Session
from domain.status import Kernel
from domain.status import KernelStatus as S
from services.manager.agent_rpc import AgentCallFailed, AgentRpc
from services.manager.fleet import Fleet
from services.manager.uow import UnitOfWork
from transport.tasks import Tasks, every

log = logging.getLogger(__name__)

Pull = tuple[str, str]  # (agent id, task id)


class PullingLoop:
    def __init__(
        self,
        fleet: Fleet,
        uow: UnitOfWork,
        agents: AgentRpc,
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
        self.uow = uow
        self.agents = agents
        self.interval_s = interval_s
        self.pull_timeout_s = pull_timeout_s
        self.stall_timeout_s = stall_timeout_s
        # (agent id, task id) -> (bytes, state) last seen and when they last changed
        self._progress: dict[Pull, tuple[tuple[int, str], float]] = {}
        self._tasks = Tasks()

    def start(self) -> None:
        self._tasks.spawn(every(self.interval_s, self.check, "check-pulling-kernels"))

    async def stop(self) -> None:
        await self._tasks.stop()

    async def check(self) -> None:
        """One round over every PULLING kernel."""
        now = datetime.now(UTC)
        pulls: defaultdict[Pull, list[tuple[str, str]]] = defaultdict(list)
        for agent_id, sids in list(self.fleet.pulling_on_agent.items()):
            for sid in list(sids):
                session = self.fleet.sessions[sid]
                if self.fleet.image_there_on(session, agent_id):
                    await self.uow.try_change(
                        sid, partial(_prepared, agent_id=agent_id), fenced=True
                    )
                    continue
                for k in self.fleet.pulling_there(session, agent_id):
                    waited = (now - _pulling_since(k)).total_seconds()
                    if waited >= self.pull_timeout_s:
                        why = info(
                            Reason.PULL_TIMEOUT, f"not pulled after {self.pull_timeout_s:g}s"
                        )
                        await self._end(agent_id, [(sid, k.kernel_id)], why)
                        continue
                    pulls[(agent_id, k.pull_task_id or "")].append((sid, k.kernel_id))
        await asyncio.gather(*(self._follow(pull, ks) for pull, ks in pulls.items()))
        for key in self._progress.keys() - pulls.keys():
            del self._progress[key]

    async def _follow(self, pull: Pull, kernels: list[tuple[str, str]]) -> None:
        agent_id, task_id = pull
        try:
            reply = msgspec.convert(
                await self.agents.call(agent_id, rpc.PULL_STATUS, rpc.PullStatus(task_id=task_id)),
                rpc.PullStatusReply,
            )
        except AgentCallFailed as e:
            log.info("pull %s on agent %s: no status (%s)", task_id, agent_id, e)
            reply = None
        if reply is not None and reply.known and reply.state == "done":
            await self._ready(
                agent_id, kernels, info(Reason.IMAGE_PULLED, f"the pull finished on {agent_id}")
            )
            return
        if reply is not None and reply.known and reply.state == "failed":
            why = info(Reason.IMAGE_PULL_FAILED, reply.reason or "failed")
            await self._end(agent_id, kernels, why)
            return
        if reply is not None and not reply.known:
            await self._ask_again(agent_id, kernels)
            return
        mark = (reply.current, reply.state or "") if reply is not None else None
        now = time.monotonic()
        seen = self._progress.get(pull)
        if seen is None or (mark is not None and mark != seen[0]):
            self._progress[pull] = (mark or (-1, ""), now)
            return
        if now - seen[1] >= self.stall_timeout_s:
            why = info(Reason.PULL_STALLED, f"no progress for {self.stall_timeout_s:g}s")
            await self._end(agent_id, kernels, why)

    async def _ask_again(self, agent_id: str, kernels: list[tuple[str, str]]) -> None:
        image = self.fleet.sessions[kernels[0][0]].image
        try:
            task_id = await self.agents.check_image(agent_id, image, [k for _, k in kernels])
        except AgentCallFailed as e:
            log.info("agent %s: check-and-pull of %s asked again: %s", agent_id, image, e)
            return
        if task_id is None:
            await self._ready(agent_id, kernels, info(Reason.IMAGE_PRESENT, f"{agent_id} holds it"))
            return
        for sid, kids in _by_session(kernels).items():
            await self.uow.try_change(
                sid,
                partial(
                    Session.pull_asked_again, agent_id=agent_id, kernel_ids=kids, task_id=task_id
                ),
                fenced=True,
            )

    async def _ready(self, agent_id: str, kernels: list[tuple[str, str]], why: str) -> None:
        for sid in dict.fromkeys(sid for sid, _ in kernels):
            await self.uow.try_change(sid, lambda s: _prepared(s, agent_id, why), fenced=True)

    async def _end(self, agent_id: str, kernels: list[tuple[str, str]], why: str) -> None:
        for sid, kids in _by_session(kernels).items():
            await self.uow.try_change(
                sid,
                partial(Session.pull_ended, agent_id=agent_id, status_info=why, kernel_ids=kids),
                fenced=True,
            )


def _by_session(kernels: list[tuple[str, str]]) -> dict[str, list[str]]:
    by_session: defaultdict[str, list[str]] = defaultdict(list)
    for sid, kid in kernels:
        by_session[sid].append(kid)
    return by_session


def _pulling_since(kernel: Kernel) -> datetime:
    """When the kernel entered PULLING first: a pull asked again (PULLING again) does not
    restart the pull timeout, so an agent that keeps restarting cannot hold a kernel for ever."""
    since = kernel.status_history[-1].at
    for entry in reversed(kernel.status_history):
        if entry.status is not S.PULLING:
            break
        since = entry.at
    return since


def _prepared(session: Session, agent_id: str, why: str = Reason.IMAGE_PULLED) -> None:
    """The image is on ``agent_id``: its PULLING kernels are PREPARED, and CREATING in the same
    append when no sibling waits for its image any more."""
    session.image_ready(agent_id, why)
    session.start_creating()
