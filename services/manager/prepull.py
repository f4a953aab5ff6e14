"""Prepull policies on the manager: the commands, and the loop that converges the fleet.

Commands (admin): ``hoist.admin.image.policy.set``, ``.remove``, ``.list``, ``.plan``; what each
takes and answers is in domain.contracts.policies.

Convergence (on every policy change, agent (re)registration, and every ``interval_s``): for
each live agent, the plan's images are pinned on the agent (``pin-images`` ``policy``: image GC
keeps them while the policy wants them), the missing ones preloaded (unpinned, reason
``prepull-policy: <names>``) with at most ``parallelism`` agents asked at a time.  When the
images held would go over the GC high watermark with the new ones, held images no kernel uses,
no job pinned and no policy wants are unloaded first (largest first, ImageRemoved
``prepull-policy: room for <image>``), so a policy change never fills a disk.

Each round first asks the registry (services.manager.registry) what every listed image is now:
its size when no agent has held it, and its manifest digest, so a tag pushed again is preloaded
again (``Preload.digests``) on the agents that hold the older one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from domain import events as ev
from domain import rpc
from domain.contracts.commands import ListPolicies, ShowPlans
from domain.contracts.policies import (
    RemovePolicy,
    SetPolicy,
    plan_view,
    policy_view,
)
from domain.prepull import (
    DEFAULT_FILL,
    AgentDisk,
    AgentPlan,
    KnownImage,
    Policy,
    PrepullPolicy,
    plan_fleet,
)
from domain.status import TERMINAL
from domain.subjects import PREPULL_POLICY
from services.manager.agent_rpc import AgentRefused, AgentRpc, AgentUnreachable
from services.manager.fleet import Fleet
from services.manager.registry import RegistryClient, RegistryError, RemoteImage
from services.manager.uow import UnitOfWork, removal
from transport.tasks import Tasks, every

log = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class PrepullLoop:
    def __init__(
        self,
        fleet: Fleet,
        uow: UnitOfWork,
        agents: AgentRpc,
        *,
        interval_s: float = 10.0,
        parallelism: int = 16,
        fill: float = DEFAULT_FILL,
        high: float = 0.85,
        registry: RegistryClient | None = None,
    ) -> None:
        self.fleet = fleet
        self.uow = uow
        self.agents = agents
        self.interval_s = interval_s
        self.parallelism = parallelism
        self.fill = fill
        self.high = high
        self.registry = registry  # None: sizes only from what agents held, tags never resolved
        self.remote: dict[str, RemoteImage] = {}  # what the registry said at the last round
        self._lookup_errors: dict[str, str] = {}  # image -> the reason last logged
        self.plans: dict[str, AgentPlan] = {}  # the last converge pass's plans
        self.passes = 0
        self._pins_sent: dict[str, tuple[str, ...]] = {}
        self._wake = asyncio.Event()
        self._tasks = Tasks()

    def start(self) -> None:
        self._tasks.spawn(
            every(self.interval_s, self.converge, "prepull convergence", wake=self._wake, now=True)
        )

    async def stop(self) -> None:
        await self._tasks.stop()

    def wake(self, _message: object = None) -> None:
        """Converge soon (a bus handler: a policy changed, an agent joined or was lost)."""
        self._wake.set()

    def agent_registered(self, event: ev.AgentRegistered | ev.AgentReregistered) -> None:
        self._pins_sent.pop(event.originator_id, None)  # a restarted agent forgot its pins
        self.wake()

    # -- planning ------------------------------------------------------------------------

    def live_policies(self) -> list[Policy]:
        return [Policy.of(p) for p in self.fleet.policies.values() if not p.removed]

    async def resolve(self, policies: list[Policy]) -> None:
        """Ask the registry what each image the policies list is now (digest, layers' bytes),
        all at once; one that does not answer is logged (once per reason) and left unknown."""
        if self.registry is None:
            return
        listed = {
            image
            for p in policies
            for rule in p.rules
            if isinstance(rule, ev.ListedImages)
            for image in rule.images
        }
        slots = asyncio.Semaphore(self.parallelism)

        async def one(image: str) -> None:
            assert self.registry is not None
            async with slots:
                try:
                    self.remote[image] = await self.registry.resolve(image)
                except RegistryError as e:
                    self.remote.pop(image, None)
                    if self._lookup_errors.get(image) != e.reason:
                        log.warning("prepull: %s; its size and digest stay unknown", e)
                    self._lookup_errors[image] = e.reason
                    return
            if self._lookup_errors.pop(image, None) is not None:
                log.info("prepull: the registry answers for %s again", image)

        await asyncio.gather(*(one(i) for i in listed))
        for gone in self.remote.keys() - listed:
            del self.remote[gone]

    def catalog(self) -> dict[str, KnownImage]:
        sizes: dict[str, int] = {}
        for state in self.fleet.agents.values():
            for image, held in state.agent.images.items():
                sizes[image] = max(sizes.get(image, 0), held.size_bytes)
        names = sizes.keys() | self.fleet.image_first_seen.keys() | self.remote.keys()
        return {
            image: KnownImage(
                image,
                sizes.get(image, remote.size_bytes if (remote := self.remote.get(image)) else None),
                self.fleet.image_last_used.get(image),
                self.fleet.image_first_seen.get(image, _EPOCH),
                remote.digest if remote else None,
            )
            for image in names
        }

    def disks(self) -> list[AgentDisk]:
        out = []
        for agent_id, state in self.fleet.agents.items():
            if not state.live:
                continue
            agent = state.agent
            kept = {image for image, pinned in agent.preloaded.items() if pinned}
            for sid in self.fleet.sessions_on(agent_id):
                session = self.fleet.sessions[sid]
                if any(
                    k.agent_id == agent_id and k.status not in TERMINAL
                    for k in session.kernels.values()
                ):
                    kept.add(session.image)
            held = {image: h.size_bytes for image, h in agent.images.items()}
            out.append(
                AgentDisk(
                    agent_id,
                    agent.resource_group,
                    agent.capacity.disk,
                    held,
                    frozenset(kept & held.keys()),
                    {image: h.digest for image, h in agent.images.items()},
                )
            )
        return out

    def plan(self, policies: list[Policy] | None = None) -> dict[str, AgentPlan]:
        return plan_fleet(
            self.disks(),
            self.live_policies() if policies is None else policies,
            self.catalog(),
            datetime.now(UTC),
            self.fill,
        )

    def pins(self, agent_id: str) -> dict[str, str]:
        """Image -> policy for what the policies want on the agent (unload refuses those)."""
        plan = self.plans.get(agent_id)
        return {w.image: w.policy for w in plan.desired} if plan else {}

    def converged(self) -> bool:
        """Every live agent holds its plan's images (as of now)."""
        plans = self.plan()
        return all(not p.to_pull for p in plans.values())

    # -- commands ------------------------------------------------------------------------

    async def set_policy(self, req: SetPolicy) -> dict[str, Any]:
        others = [p for p in self.live_policies() if p.name != req.name]
        policy, recorded = await self.uow.admin(
            PREPULL_POLICY,
            req.name,
            lambda p: PrepullPolicy.set(
                p,
                name=req.name,
                resource_groups=req.resource_groups,
                rules=req.rules,
                priority=req.priority,
            ),
            dry_run=req.dry_run,
        )
        candidate = Policy(req.name, policy.resource_groups, policy.rules, policy.priority)
        await self.resolve([*others, candidate])
        plans = self.plan([*others, candidate])
        return {
            "policy": policy_view(policy),
            "recorded": recorded,
            "dry_run": req.dry_run,
            "plans": {a: plan_view(p) for a, p in plans.items()},
        }

    async def remove_policy(self, req: RemovePolicy) -> dict[str, Any]:
        missing = f"no prepull policy {req.name!r}; list them with policy list"
        plans = self.plan([p for p in self.live_policies() if p.name != req.name])
        _, recorded = await self.uow.admin(
            PREPULL_POLICY, req.name, removal(missing), dry_run=req.dry_run
        )
        return {
            "policy": req.name,
            "recorded": recorded,
            "dry_run": req.dry_run,
            "plans": {a: plan_view(p) for a, p in plans.items()},
        }

    async def list_policies(self, _: ListPolicies) -> dict[str, Any]:
        return {"policies": [policy_view(p) for p in self.fleet.policies.values()]}

    async def show_plan(self, _: ShowPlans) -> dict[str, Any]:
        plans = self.plan()
        return {
            "plans": {a: plan_view(p) for a, p in plans.items()},
            "converged": all(not p.to_pull for p in plans.values()),
        }

    # -- convergence ---------------------------------------------------------------------

    async def converge(self) -> int:
        """One pass; the number of agents asked to pull something."""
        self.passes += 1
        if not self.fleet.policies and not self._pins_sent:
            return 0
        await self.resolve(self.live_policies())
        plans = self.plan()
        self.plans = plans
        names = ", ".join(sorted(p.name for p in self.live_policies())) or "none"
        slots = asyncio.Semaphore(self.parallelism)

        async def converge(agent_id: str, plan: AgentPlan) -> bool:
            async with slots:
                return await self._converge_agent(agent_id, plan, names)

        asked = await asyncio.gather(*(converge(a, p) for a, p in plans.items()))
        return sum(asked)

    async def _converge_agent(self, agent_id: str, plan: AgentPlan, names: str) -> bool:
        state = self.fleet.agents[agent_id]
        pins = tuple(plan.images)
        try:
            if self._pins_sent.get(agent_id) != pins:
                await self.agents.call(agent_id, rpc.PIN_IMAGES, rpc.PinImages(policy=list(pins)))
                self._pins_sent[agent_id] = pins
            missing = [i for i in plan.to_pull if i not in state.agent.pulls]
            if not missing:
                return False
            for image in missing:
                if image in plan.refresh:
                    log.info(
                        "prepull: agent %s holds %s as %s, the registry now says %s: pulling"
                        " it again",
                        agent_id,
                        image,
                        state.agent.images[image].digest if image in state.agent.images else "?",
                        plan.refresh[image],
                    )
            await self._make_room(agent_id, plan, missing)
            await self.agents.call(
                agent_id,
                rpc.PRELOAD,
                rpc.Preload(
                    images=missing,
                    reason=f"prepull-policy: {names}",
                    pinned=False,
                    digests={i: plan.refresh[i] for i in missing if i in plan.refresh},
                ),
            )
        except (AgentUnreachable, AgentRefused) as e:
            log.info("agent %s: prepull not converged (%s); next pass retries", agent_id, e)
            return False
        return True

    async def _make_room(self, agent_id: str, plan: AgentPlan, missing: list[str]) -> None:
        agent = self.fleet.agents[agent_id].agent
        sizes = {w.image: w.size_bytes for w in plan.desired}
        need = sum(h.size_bytes for h in agent.images.values()) + sum(sizes[i] for i in missing)
        limit = int(agent.capacity.disk * self.high)
        if need <= limit:
            return
        wanted = set(plan.images)
        busy = {self.fleet.sessions[sid].image for sid in self.fleet.sessions_on(agent_id)} | {
            image for image, pinned in agent.preloaded.items() if pinned
        }
        spare = sorted(
            (i for i in agent.images if i not in wanted and i not in busy),
            key=lambda i: -agent.images[i].size_bytes,
        )
        drop = []
        for image in spare:
            if need <= limit:
                break
            drop.append(image)
            need -= agent.images[image].size_bytes
        if drop:
            await self.agents.call(
                agent_id,
                rpc.UNLOAD,
                rpc.Unload(images=drop, reason=f"prepull-policy: room for {', '.join(missing)}"),
            )

    async def wait_converged(self, within_s: float) -> float:
        """Seconds until every live agent holds its plan (for tests and benchmarks)."""
        start = time.monotonic()
        while not self.converged():
            if time.monotonic() - start > within_s:
                raise TimeoutError(f"the fleet did not converge within {within_s:g}s")
            await asyncio.sleep(0.05)
        return time.monotonic() - start
