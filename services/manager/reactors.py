"""The session lifecycle after scheduling: check-readiness, pulls, create, wind-down, destroy.

Every reactor is driven by the session's state, not by which event woke it: ``kick(session)``
runs the session's one worker, which looks at the kernels and does the next due step until
nothing is due (waiting for a pull, running, final).  So a restarted manager only kicks every
unsettled session and each carries on from where the log says it is: a SCHEDULED kernel gets
check-and-pull asked (the agent answers the same task for a pull in flight), a CREATING one
gets create-kernel asked again (idempotent on the agent: a kernel never gets two containers).

Steps, in order of precedence:
1. kernels not yet running on a lost agent -> CANCELLED ``agent-lost: ...``;
2. a kernel ERROR or CANCELLED -> the session's other kernels wind down (``sibling-failed``);
3. TERMINATING kernels (and cancelled ones a create may have reached) -> destroy-kernel;
4. SCHEDULED kernels -> one check-and-pull per agent -> PREPARED or PULLING with the task id;
5. PULLING kernels -> PREPARED when the agent holds the image, CANCELLED
   ``image-pull-failed: <reason>`` when their pull failed;
6. all kernels PREPARED -> CREATING -> create-kernel -> RUNNING, or ERROR
   ``failed-to-start: <reason>``.
Agent RPCs run outside the session lock; their results are recorded under it, re-checking
the kernel is still where the RPC left it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from domain import events as ev
from domain import rpc
from domain.errors import DomainError
from domain.session import Session
from domain.status import PRE_RUNNING, Kernel, KernelStatus
from domain.subjects import agent_rpc
from services.manager.fleet import Fleet
from services.transport.client import Client

log = logging.getLogger(__name__)

S = KernelStatus
_MAX_STEPS = 32  # per kick; a session needs at most ~8


class AgentUnreachable(Exception):
    """No reply (agent down, restarting, slow): nothing is known, ask again later."""


class AgentRefused(Exception):
    """The agent answered with an error reply: it changed nothing."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class AgentRpc:
    """Request/reply to ``hoist.agent.<id>.<verb>`` with the domain.rpc payloads."""

    def __init__(self, nc: Client, timeouts: dict[str, float] | None = None) -> None:
        self.nc = nc
        self.timeouts = {
            rpc.CHECK_AND_PULL: 15.0,  # the agent waits up to 10 s for ImagePullStarted
            rpc.CREATE_KERNEL: 60.0,
            rpc.DESTROY_KERNEL: 30.0,
            rpc.PULL_STATUS: 5.0,
            **(timeouts or {}),
        }

    async def call(self, agent_id: str, verb: str, request: object) -> Any:
        try:
            msg = await self.nc.request(
                agent_rpc(agent_id, verb), rpc.encode(request), timeout=self.timeouts.get(verb, 10)
            )
        except (NoRespondersError, NatsTimeoutError, TimeoutError) as e:
            raise AgentUnreachable(f"agent {agent_id} {verb}: {type(e).__name__}") from None
        reply = msgspec.json.decode(msg.data)
        if isinstance(reply, dict) and isinstance(reply.get("error"), dict):
            error = reply["error"]
            raise AgentRefused(str(error.get("code")), str(error.get("message")))
        return reply


def _was_creating(kernel: Kernel) -> bool:
    history = kernel.status_history
    return len(history) >= 2 and history[-2].status is S.CREATING


class Reactors:
    def __init__(self, fleet: Fleet, agents: AgentRpc, *, retry_s: float = 1.0) -> None:
        self.fleet = fleet
        self.agents = agents
        self.retry_s = retry_s
        self.retask: dict[str, str] = {}  # kernel id -> pull task asked again by the loop
        self.force_destroy: set[str] = set()  # kernels forced TERMINATED: remove best effort
        self._destroyed: set[str] = set()  # cancelled kernels whose container is gone
        self._running: set[str] = set()
        self._again: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._later: dict[str, asyncio.TimerHandle] = {}
        # Agent resource sync triggers (services.agent_sync): sync these agents before
        # create-kernel; after insufficient-resources refusals, sync the refusing agents (all
        # at once: a multi-kernel session can fail on several) and retry those creates once.
        self.before_create: Callable[[set[str]], Awaitable[None]] | None = None
        self.on_create_refused: Callable[[set[str]], Awaitable[None]] | None = None

    # -- waking --------------------------------------------------------------------------

    def kick(self, session_id: str) -> None:
        """Make the session's worker look at it (again)."""
        if session_id in self._running:
            self._again.add(session_id)
            return
        self._running.add(session_id)
        self._spawn(self._worker(session_id))

    def kick_later(self, session_id: str) -> None:
        if session_id not in self._later:
            self._later[session_id] = asyncio.get_running_loop().call_later(
                self.retry_s, self._kick_due, session_id
            )

    def _kick_due(self, session_id: str) -> None:
        self._later.pop(session_id, None)
        self.kick(session_id)

    def on_agent_event(self, agent_id: str, event: ev.Event) -> None:
        if isinstance(event, ev.ImagePulled | ev.ImagePullFailed):
            for sid in list(self.fleet.pulling_on_agent.get(agent_id, ())):
                self.kick(sid)
        elif isinstance(event, ev.AgentLost | ev.AgentReregistered):
            for sid in self.fleet.sessions_on(agent_id):
                self.kick(sid)

    async def stop(self) -> None:
        for handle in self._later.values():
            handle.cancel()
        self._later.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _worker(self, session_id: str) -> None:
        try:
            while True:
                self._again.discard(session_id)
                try:
                    await self._advance(session_id)
                except Exception:
                    log.exception("session %s: reactor step failed; retrying", session_id)
                    self.kick_later(session_id)
                if session_id not in self._again:
                    return
        finally:
            self._running.discard(session_id)

    async def _advance(self, session_id: str) -> None:
        for _ in range(_MAX_STEPS):
            session = self.fleet.sessions.get(session_id)
            if session is None or not await self._step(session):
                return

    # -- recording -----------------------------------------------------------------------

    async def record(self, session_id: str, decide: Callable[[Session], None]) -> bool:
        """Under the session's lock, let ``decide`` call commands on the current session and
        store what they recorded; True if something was stored or the session was reloaded
        (look again), False if ``decide`` found nothing to do."""
        async with self.fleet.locked(session_id) as session:
            if session is None:
                return False
            try:
                decide(session)
            except DomainError as e:
                # The session moved on under a stale decision: reload, decide again.
                log.warning("session %s: %s", session_id, e)
                session.collect_events()
                await self.fleet.reload(session_id)
                return True
            if not session.pending_events:
                return False
            await self.fleet.commit(session)
            return True

    # -- the steps -----------------------------------------------------------------------

    async def _step(self, session: Session) -> bool:
        sid = session.id
        kernels = list(session.kernels.values())
        lost = [
            k
            for k in kernels
            if k.status in PRE_RUNNING and k.agent_id is not None and self._lost(k.agent_id)
        ]
        if lost:
            return await self.record(sid, self._cancel_on_lost_agents)
        failed = next((k for k in kernels if k.status in (S.ERROR, S.CANCELLED)), None)
        if failed is not None and any(
            k.status in PRE_RUNNING or k.status is S.RUNNING for k in kernels
        ):
            return await self.record(sid, self._wind_down)
        to_destroy = [
            k
            for k in kernels
            if k.status is S.TERMINATING
            or (k.status is S.CANCELLED and _was_creating(k) and k.kernel_id not in self._destroyed)
            or (k.status is S.TERMINATED and k.kernel_id in self.force_destroy)
        ]
        if to_destroy:
            return await self._destroy(sid, to_destroy)
        if any(k.status in (S.SCHEDULED, S.PREPARING) for k in kernels):
            return await self._check_and_pull(session)
        if any(k.status is S.PULLING for k in kernels):
            return await self.record(sid, self._pull_outcomes)
        if kernels and all(k.status in (S.PREPARED, S.CREATING) for k in kernels):
            if any(k.status is S.PREPARED for k in kernels):
                return await self.record(sid, self._mark_creating)
            return await self._create(session)
        return False

    def _lost(self, agent_id: str) -> bool:
        state = self.fleet.agents.get(agent_id)
        return state is not None and not state.live

    def _cancel_on_lost_agents(self, session: Session) -> None:
        for k in session.kernels.values():
            if k.status in PRE_RUNNING and k.agent_id is not None and self._lost(k.agent_id):
                info = self.fleet.agents[k.agent_id].status_info
                session.cancel(k.kernel_id, f"agent-lost: {k.agent_id} ({info})")

    def _wind_down(self, session: Session) -> None:
        failed = next(k for k in session.kernels.values() if k.status in (S.ERROR, S.CANCELLED))
        info = f"sibling-failed: kernel {failed.kernel_id} {failed.status}: {failed.status_info}"
        for k in session.kernels.values():
            if k.status in PRE_RUNNING:
                session.cancel(k.kernel_id, info)
            elif k.status is S.RUNNING:
                session.mark_terminating(k.kernel_id, info)

    async def _destroy(self, session_id: str, kernels: list[Kernel]) -> bool:
        async def one(k: Kernel) -> tuple[Kernel, rpc.KernelDestroyed | Exception]:
            assert k.agent_id is not None
            try:
                reply = await self.agents.call(
                    k.agent_id, rpc.DESTROY_KERNEL, rpc.DestroyKernel(kernel_id=k.kernel_id)
                )
                return k, msgspec.convert(reply, rpc.KernelDestroyed)
            except (AgentUnreachable, AgentRefused) as e:
                return k, e

        results = await asyncio.gather(*(one(k) for k in kernels if k.agent_id is not None))
        gone: dict[str, bool] = {}
        for k, result in results:
            if isinstance(result, Exception):
                if self._lost(k.agent_id or ""):
                    gone[k.kernel_id] = False  # its containers went with it (or sync removes them)
                else:
                    log.warning("kernel %s: destroy failed (%s); retrying", k.kernel_id, result)
                    self.kick_later(session_id)
                continue
            gone[k.kernel_id] = result.destroyed
        for k in kernels:
            if k.kernel_id in gone and k.status is not S.TERMINATING:
                self._destroyed.add(k.kernel_id)
                self.force_destroy.discard(k.kernel_id)

        def decide(session: Session) -> None:
            for kid, destroyed in gone.items():
                k = session.kernels[kid]
                if k.status is S.TERMINATING:
                    detail = "container removed" if destroyed else "no container was left"
                    session.mark_terminated(kid, k.status_info, detail)

        return await self.record(session_id, decide)

    async def _check_and_pull(self, session: Session) -> bool:
        by_agent: defaultdict[str, list[str]] = defaultdict(list)
        for k in session.kernels.values():
            if k.status in (S.SCHEDULED, S.PREPARING) and k.agent_id is not None:
                by_agent[k.agent_id].append(k.kernel_id)
        image = session.image

        async def ask(agent_id: str) -> tuple[str, dict[str, Any] | Exception]:
            try:
                reply = await self.agents.call(
                    agent_id, rpc.CHECK_AND_PULL, rpc.CheckAndPull(images=[image])
                )
                return agent_id, reply[image]
            except (AgentUnreachable, AgentRefused, KeyError, TypeError) as e:
                return agent_id, e

        answers = dict(await asyncio.gather(*(ask(a) for a in by_agent)))
        if any(isinstance(a, AgentUnreachable) for a in answers.values()):
            self.kick_later(session.id)

        def decide(s: Session) -> None:
            for agent_id, answer in answers.items():
                for kid in by_agent[agent_id]:
                    if s.kernels[kid].status not in (S.SCHEDULED, S.PREPARING):
                        continue
                    if isinstance(answer, AgentUnreachable):
                        continue
                    if isinstance(answer, Exception):
                        s.cancel(kid, f"check-and-pull-failed: {answer}")
                    elif answer.get("task_id"):
                        s.mark_pulling(kid, answer["task_id"], "image-pulling")
                    else:
                        s.mark_prepared(kid, "image-present")

        return await self.record(session.id, decide)

    def _pull_outcomes(self, session: Session) -> None:
        for k in session.kernels.values():
            if k.status is not S.PULLING or k.agent_id is None:
                continue
            state = self.fleet.agents.get(k.agent_id)
            if state is None:
                continue
            if session.image in state.agent.images:
                session.mark_prepared(k.kernel_id, "image-pulled")
                continue
            failure = state.failed_pulls.get(session.image)
            if failure is not None and failure[0] in (k.pull_task_id, self.retask.get(k.kernel_id)):
                session.cancel(k.kernel_id, f"image-pull-failed: {failure[1]}")

    def _mark_creating(self, session: Session) -> None:
        for k in session.kernels.values():
            if k.status is S.PREPARED:
                session.mark_creating(k.kernel_id)

    async def _create(self, session: Session) -> bool:
        creating = [k for k in session.kernels.values() if k.status is S.CREATING]

        async def one(k: Kernel) -> tuple[str, rpc.KernelCreated | Exception]:
            assert k.agent_id is not None
            request = rpc.CreateKernel(
                kernel_id=k.kernel_id,
                session_id=session.id,
                image=session.image,
                resources=session.resources,
            )
            try:
                reply = await self.agents.call(k.agent_id, rpc.CREATE_KERNEL, request)
                return k.kernel_id, msgspec.convert(reply, rpc.KernelCreated)
            except (AgentUnreachable, AgentRefused) as e:
                return k.kernel_id, e

        if self.before_create is not None:
            await self.before_create({k.agent_id for k in creating if k.agent_id is not None})
        results = dict(await asyncio.gather(*(one(k) for k in creating)))
        refused = [
            k
            for k in creating
            if isinstance(r := results[k.kernel_id], AgentRefused)
            and r.code == "insufficient-resources"
        ]
        if refused and self.on_create_refused is not None:
            await self.on_create_refused({k.agent_id for k in refused if k.agent_id is not None})
            results.update(await asyncio.gather(*(one(k) for k in refused)))
        if any(isinstance(r, AgentUnreachable) for r in results.values()):
            self.kick_later(session.id)

        def decide(s: Session) -> None:
            for kid, result in results.items():
                if s.kernels[kid].status is not S.CREATING:
                    continue  # cancelled meanwhile: step 3 removes what the create made
                if isinstance(result, rpc.KernelCreated):
                    s.mark_created(kid, result.container_id, "running")
                elif isinstance(result, AgentRefused):
                    s.creation_failed(kid, result.message, f"failed-to-start: {result}")

        return await self.record(session.id, decide)
