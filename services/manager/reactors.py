"""The session lifecycle after scheduling: check-and-pull, pulls, create, wind-down, destroy.

Every reactor is driven by the session's state, not by which event woke it: ``kick(session)``
runs the session's one worker, which looks at the kernels and does the next due step until
nothing is due (waiting for a pull, running, final).  So a restarted manager only kicks every
unsettled session and each carries on from where the log says it is: a PREPARING kernel gets
check-and-pull asked (the agent answers the same task for a pull in flight), a CREATING one
gets create-kernel asked again (idempotent on the agent: a kernel never gets two containers).

Steps, in order of precedence (each decision is a method of the Session aggregate):
1. kernels not yet running on a lost agent -> CANCELLED ``agent-lost`` (``agents_lost``);
2. a kernel ERROR or CANCELLED -> the others wind down ``sibling-failed`` (``wind_down``); a
   batch session's main kernel TERMINATED -> the others stop ``session-ended`` (``end_batch``);
3. TERMINATING kernels, cancelled ones a create may have reached, and force-terminated ones
   -> destroy-kernel (``container_removed``); kernels cancelled while PULLING -> pull-cancel
   (the agent stops the pull when no other kernel nor a preload waits for it; nothing is
   recorded);
4. PREPARING kernels (the scheduler records PREPARING with the placement, or PREPARED and
   CREATING where the log shows the image on every agent of the session; a kernel still
   SCHEDULED, from an older log, goes PREPARING first: ``start_preparing``) -> one
   check-and-pull per agent -> PULLING or PREPARED (``image_checked``), naming the kernels
   that wait for the pull;
5. PULLING kernels -> PREPARED when the agent holds the image (``image_ready``; a kernel sent
   back for its image once its own pull is seen finished), CANCELLED ``image-pull-failed``
   when their pull failed (``pull_ended``);
6. no kernel waiting for its image: PREPARED -> CREATING (``start_creating``, in the same
   append as the last PREPARED); CREATING kernels -> create-kernel (at once, even while a
   sibling sent back for its image pulls) -> RUNNING, ERROR ``failed-to-start``
   (``created``), or back to PREPARING when the agent no longer holds the image
   (``image_missing``, once); each create tells the kernel its command, env (with the
   cluster's ``HOIST_*``), ports, mounts, hostname and, multi-node, the other kernels'
   agents' addresses (from their heartbeats).
A kernel's process that ends is an agent's fact (KernelExited), not a state of the session:
``kernel_exited`` records what it means (``process_ended``) as it arrives; a manager that was
down meanwhile learns it from agent sync (``containers_gone`` with the exits).
Agent RPCs run outside the session lock; their results are recorded through the unit of work,
whose decisions re-check that each kernel is still where the RPC left it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar

import msgspec

from domain import events as ev
from domain import rpc
from domain.reasons import Reason, info, reason_of
from domain.session import Session
from domain.status import FAILED, PRE_RUNNING, Kernel, KernelStatus
from eventstore.repository import loaded_seq
from services.manager.agent_rpc import AgentCallFailed, AgentRefused, AgentRpc, AgentUnreachable
from services.manager.bus import LookAgain
from services.manager.dotfiles import files_of
from services.manager.fleet import Fleet
from services.manager.uow import UnitOfWork
from transport.tasks import Tasks

log = logging.getLogger(__name__)

S = KernelStatus
_MAX_STEPS = 32  # per kick; a session needs at most ~8
SyncAgents = Callable[[set[str]], Awaitable[None]]
# The session whose worker is recording a change in the current task (None otherwise).
_worker_of: ContextVar[str | None] = ContextVar("reactor_worker_of", default=None)


def _loopback(address: str) -> bool:
    """An address that, from inside a container, names the container itself."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address == "localhost"
    return ip.is_loopback or ip.is_unspecified


def _was_creating(kernel: Kernel) -> bool:
    history = kernel.status_history
    return len(history) >= 2 and history[-2].status is S.CREATING


def _may_wait_for_a_pull(kernel: Kernel) -> bool:
    """Cancelled while PULLING, or while PREPARING: a check-and-pull in flight may have made it
    a waiter of its agent's pull (pull-cancel of a kernel that is none changes nothing)."""
    history = kernel.status_history
    return len(history) >= 2 and history[-2].status in (S.PULLING, S.PREPARING)


def _force_terminated(kernel: Kernel) -> bool:
    return (
        kernel.status is S.TERMINATED and reason_of(kernel.status_info) == Reason.FORCE_TERMINATED
    )


class Reactors:
    def __init__(
        self,
        fleet: Fleet,
        uow: UnitOfWork,
        agents: AgentRpc,
        *,
        retry_s: float = 1.0,
        sync_before_create: SyncAgents | None = None,
        sync_after_refusal: SyncAgents | None = None,
        address_of: Callable[[str], str | None] = lambda agent_id: None,
    ) -> None:
        self.fleet = fleet
        self.uow = uow
        self.agents = agents
        self.retry_s = retry_s
        # Agent resource sync (services.manager.agent_sync): sync these agents before
        # create-kernel; after insufficient-resources refusals, sync the refusing agents (all
        # at once: a multi-kernel session can fail on several) and retry those creates once.
        self.sync_before_create = sync_before_create
        self.sync_after_refusal = sync_after_refusal
        self.address_of = address_of  # agent id -> where its published ports are reachable
        self._removed: set[str] = set()  # cancelled/forced kernels whose container is gone
        self._released: set[str] = set()  # kernels cancelled while pulling, pull-cancel sent
        # Exits reported while the kernel was still CREATING (its command was quicker than
        # the create-kernel reply): recorded with the reply.
        self._early_exits: dict[str, ev.KernelExited] = {}
        self._running: set[str] = set()
        self._again: set[str] = set()
        self._tasks = Tasks()
        self._later: dict[str, asyncio.TimerHandle] = {}

    # -- waking (bus handlers) -----------------------------------------------------------

    def kick(self, session_id: str) -> None:
        """Make the session's worker look at it (again)."""
        if session_id in self._running:
            self._again.add(session_id)
            return
        self._running.add(session_id)
        self._tasks.spawn(self._worker(session_id), f"session {session_id}")

    def session_changed(self, event: ev.Event) -> None:
        # Published from the session's own worker (its change, saved in its task): it looks
        # again anyway.  Anyone else's change (an API request, the scheduler, a loop) kicks it.
        if _worker_of.get() != event.originator_id:
            self.kick(event.originator_id)

    def look_again(self, note: LookAgain) -> None:
        self.kick(note.session_id)

    def pull_ended(self, event: ev.ImagePulled | ev.ImagePullFailed) -> None:
        for sid in list(self.fleet.pulling_on_agent.get(event.originator_id, ())):
            self.kick(sid)

    def agent_changed(self, event: ev.AgentLost | ev.AgentReregistered) -> None:
        for sid in self.fleet.sessions_on(event.originator_id):
            self.kick(sid)

    def kernel_exited(self, event: ev.KernelExited) -> None:
        """An agent says a kernel's process ended there: record it on the kernel's session
        (nothing when the session does not know that kernel on that agent, or it is no longer
        RUNNING: a late, repeated or forged report).  A quick command can end before its
        create-kernel reply is recorded: the exit of a kernel still CREATING there is kept and
        recorded right after its KernelCreated (``_create``)."""
        agent_id = event.originator_id  # the subject's id, which only that agent may write
        if event.session_id not in self.fleet.sessions:
            return

        def decide(s: Session) -> None:
            k = s.kernels.get(event.kernel_id)
            if k is not None and k.agent_id == agent_id and k.status is S.CREATING:
                self._early_exits[event.kernel_id] = event
            else:
                s.process_ended(agent_id, event.kernel_id, event)

        self._tasks.spawn(
            self.uow.try_change(event.session_id, decide, fenced=False),
            f"kernel {event.kernel_id} exited",
        )

    def kick_later(self, session_id: str) -> None:
        if session_id not in self._later:
            self._later[session_id] = asyncio.get_running_loop().call_later(
                self.retry_s, self._kick_due, session_id
            )

    def _kick_due(self, session_id: str) -> None:
        self._later.pop(session_id, None)
        self.kick(session_id)

    async def stop(self) -> None:
        for handle in self._later.values():
            handle.cancel()
        self._later.clear()
        await self._tasks.stop()

    async def _worker(self, session_id: str) -> None:
        _worker_of.set(None)  # not the context of whoever kicked it
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

    async def _change(self, session_id: str, decide: Callable[[Session], None]) -> bool:
        """Record through the unit of work; True if the worker must look again.  What it
        publishes meanwhile is its own change (the session's lock is held): no wake for it."""
        token = _worker_of.set(session_id)
        try:
            return await self.uow.change(session_id, decide, fenced=False)
        finally:
            _worker_of.reset(token)

    # -- the steps -----------------------------------------------------------------------

    async def _step(self, session: Session) -> bool:
        sid = session.id
        kernels = list(session.kernels.values())
        lost = {
            k.agent_id: self.fleet.agents[k.agent_id].status_info
            for k in kernels
            if k.status in PRE_RUNNING and k.agent_id is not None and self._lost(k.agent_id)
        }
        if lost:
            return await self._change(sid, lambda s: s.agents_lost(lost))
        failed = any(k.status in FAILED for k in kernels)
        if failed and any(k.status in PRE_RUNNING or k.status is S.RUNNING for k in kernels):
            return await self._change(sid, Session.wind_down)
        if (
            session.session_type == "batch"
            and kernels[0].status is S.TERMINATED
            and any(k.status in PRE_RUNNING or k.status is S.RUNNING for k in kernels)
        ):
            return await self._change(sid, Session.end_batch)
        to_destroy = [
            k
            for k in kernels
            if k.status is S.TERMINATING
            or (
                ((k.status is S.CANCELLED and _was_creating(k)) or _force_terminated(k))
                and k.kernel_id not in self._removed
            )
        ]
        if to_destroy:
            return await self._destroy(sid, to_destroy)
        to_release = [
            k
            for k in kernels
            if k.status is S.CANCELLED
            and _may_wait_for_a_pull(k)
            and k.kernel_id not in self._released
        ]
        if to_release:
            return await self._release_pulls(session, to_release)
        if any(k.status is S.SCHEDULED for k in kernels):
            return await self._change(sid, Session.start_preparing)
        if any(k.status is S.PREPARING for k in kernels):
            return await self._check_and_pull(session)
        pulling = any(k.status is S.PULLING for k in kernels)
        if pulling and await self._pull_outcomes(session):
            return True
        # Ask for the containers: of PREPARED kernels once none waits for its image, of
        # CREATING ones at once (a sibling sent back for its image may pull meanwhile, or run).
        if not pulling and any(k.status is S.PREPARED for k in kernels):
            return await self._change(sid, Session.start_creating)
        if any(k.status is S.CREATING for k in kernels):
            return await self._create(session)
        return False

    def _lost(self, agent_id: str) -> bool:
        state = self.fleet.agents.get(agent_id)
        return state is not None and not state.live

    async def _destroy(self, session_id: str, kernels: list[Kernel]) -> bool:
        async def destroy_one(k: Kernel) -> tuple[Kernel, rpc.KernelDestroyed | Exception]:
            assert k.agent_id is not None
            try:
                reply = await self.agents.call(
                    k.agent_id, rpc.DESTROY_KERNEL, rpc.DestroyKernel(kernel_id=k.kernel_id)
                )
                return k, msgspec.convert(reply, rpc.KernelDestroyed)
            except AgentCallFailed as e:
                return k, e

        results = await asyncio.gather(*(destroy_one(k) for k in kernels if k.agent_id is not None))
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
                self._removed.add(k.kernel_id)

        def decide(s: Session) -> None:
            for kid, had_container in gone.items():
                s.container_removed(kid, had_container)

        return await self._change(session_id, decide)

    async def _release_pulls(self, session: Session, kernels: list[Kernel]) -> bool:
        """Kernels cancelled while PULLING wait for their pull no more: pull-cancel tells each
        agent, which stops the pull unless another kernel (or a preload) waits for it.  Nothing
        is recorded; an agent that does not answer is asked again later, a lost one not."""
        by_agent: defaultdict[str, list[str]] = defaultdict(list)
        for k in kernels:
            if k.agent_id is None or self._lost(k.agent_id):
                self._released.add(k.kernel_id)  # its pulls went with it
            else:
                by_agent[k.agent_id].append(k.kernel_id)

        async def cancel_on(agent_id: str, kernel_ids: list[str]) -> None:
            why = f"no kernel waits for it: {', '.join(kernel_ids)} cancelled"
            request = rpc.PullCancel(image=session.image, kernel_ids=kernel_ids, reason=why)
            try:
                await self.agents.call(agent_id, rpc.PULL_CANCEL, request)
            except AgentUnreachable as e:
                log.info("agent %s: pull-cancel of %s not sent (%s)", agent_id, session.image, e)
                self.kick_later(session.id)
                return
            except AgentRefused as e:  # e.g. an agent without the verb: its pull runs on
                log.warning("agent %s: pull-cancel of %s refused: %s", agent_id, session.image, e)
            self._released.update(kernel_ids)

        await asyncio.gather(*(cancel_on(a, ks) for a, ks in by_agent.items()))
        return any(k.kernel_id in self._released for k in kernels)

    async def _check_and_pull(self, session: Session) -> bool:
        by_agent: defaultdict[str, list[str]] = defaultdict(list)
        for k in session.kernels.values():
            if k.status is S.PREPARING and k.agent_id is not None:
                by_agent[k.agent_id].append(k.kernel_id)

        async def ask(agent_id: str) -> tuple[str, str | Exception | None]:
            try:
                kernel_ids = by_agent[agent_id]
                return agent_id, await self.agents.check_image(agent_id, session.image, kernel_ids)
            except AgentCallFailed as e:
                return agent_id, e

        answers = dict(await asyncio.gather(*(ask(a) for a in by_agent)))
        if any(isinstance(a, AgentUnreachable) for a in answers.values()):
            self.kick_later(session.id)

        def decide(s: Session) -> None:
            for agent_id, answer in answers.items():
                if isinstance(answer, AgentUnreachable):
                    continue
                if isinstance(answer, Exception):
                    s.image_checked(agent_id, None, error=str(answer))
                else:
                    s.image_checked(agent_id, answer)
            s.start_creating()  # in the same append when that made every kernel PREPARED

        return await self._change(session.id, decide)

    async def _pull_outcomes(self, session: Session) -> bool:
        pulling = [
            k
            for k in session.kernels.values()
            if k.status is S.PULLING and k.agent_id in self.fleet.agents
        ]
        on_agents = dict.fromkeys(k.agent_id for k in pulling if k.agent_id is not None)
        there = [a for a in on_agents if self.fleet.image_there_on(session, a)]
        failed: dict[str, tuple[str, list[str]]] = {}  # agent -> (reason, kernels of that pull)
        for k in pulling:
            if k.agent_id is None or self.fleet.image_there_for(k, session.image):
                continue
            failure = self.fleet.agents[k.agent_id].failed_pulls.get(session.image)
            if failure is not None and failure[0] == k.pull_task_id:
                why = info(Reason.IMAGE_PULL_FAILED, failure[1])
                failed.setdefault(k.agent_id, (why, []))[1].append(k.kernel_id)
        if not there and not failed:
            return False

        def decide(s: Session) -> None:
            for agent_id in there:
                s.image_ready(agent_id)
            for agent_id, (why, kernel_ids) in failed.items():
                s.pull_ended(agent_id, why, kernel_ids)
            s.start_creating()  # in the same append when that made every kernel PREPARED

        return await self._change(session.id, decide)

    async def _create(self, session: Session) -> bool:
        creating = [k for k in session.kernels.values() if k.status is S.CREATING]

        # A loopback address names the container itself from inside it: no use to a peer.
        addresses = {
            k.agent_id: address
            for k in session.kernels.values()
            if k.agent_id is not None
            and (address := self.address_of(k.agent_id)) is not None
            and not _loopback(address)
        }

        # The owner's dotfiles as they are now: each kernel gets them in its home at start.
        dotfiles = [
            rpc.KernelDotfile(path=f.path, content=f.content, mode=f.mode)
            for f in files_of(self.fleet, session.owner)
        ]

        async def create_one(k: Kernel) -> tuple[str, rpc.KernelCreated | Exception]:
            assert k.agent_id is not None
            request = rpc.CreateKernel(
                kernel_id=k.kernel_id,
                session_id=session.id,
                image=session.image,
                resources=session.resources,
                owner=session.owner,
                spec=msgspec.structs.replace(session.spec, env=session.cluster_env(k.kernel_id)),
                hostname=session.hostname(k.kernel_id),
                cluster_mode=session.cluster_mode,
                extra_hosts=session.extra_hosts(k.kernel_id, addresses),
                cluster_size=len(session.kernels),
                seq=loaded_seq(session),  # a lagging view's sync spares what this asks for
                dotfiles=dotfiles,
            )
            try:
                reply = await self.agents.call(k.agent_id, rpc.CREATE_KERNEL, request)
                return k.kernel_id, msgspec.convert(reply, rpc.KernelCreated)
            except AgentCallFailed as e:
                return k.kernel_id, e

        if self.sync_before_create is not None:
            await self.sync_before_create({k.agent_id for k in creating if k.agent_id})
        results = dict(await asyncio.gather(*(create_one(k) for k in creating)))
        refused = [
            k
            for k in creating
            if isinstance(r := results[k.kernel_id], AgentRefused)
            and r.code == "insufficient-resources"
        ]
        if refused and self.sync_after_refusal is not None:
            await self.sync_after_refusal({k.agent_id for k in refused if k.agent_id})
            results.update(await asyncio.gather(*(create_one(k) for k in refused)))
        if any(isinstance(r, AgentUnreachable) for r in results.values()):
            self.kick_later(session.id)

        def decide(s: Session) -> None:
            for kid, result in results.items():
                if isinstance(result, rpc.KernelCreated):
                    s.created(kid, container_id=result.container_id, ports=result.ports)
                    if (early := self._early_exits.get(kid)) is not None:
                        s.process_ended(early.originator_id, kid, early)
                elif isinstance(result, AgentRefused) and result.code == rpc.IMAGE_MISSING:
                    # check-and-pull, maybe a pull, again
                    s.image_missing(kid)
                elif isinstance(result, AgentRefused):
                    s.created(kid, error=str(result), detail=result.message or str(result))

        try:
            return await self._change(session.id, decide)
        finally:
            for kid, result in results.items():
                if not isinstance(result, AgentUnreachable):
                    self._early_exits.pop(kid, None)
