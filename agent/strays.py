"""sync-kernels: this agent's containers reconciled with the manager's view of them.

Containers the manager does not know are strays, destroyed unless a create from past the
manager's view made them (agent.spares); kernels it wants ended are destroyed."""

from __future__ import annotations

import asyncio
import logging

from agent.exits import Exits
from agent.kernels import Kernels
from domain import rpc

log = logging.getLogger(__name__)


class Strays:
    def __init__(self, agent_id: str, kernels: Kernels, exits: Exits) -> None:
        self.agent_id = agent_id
        self.kernels = kernels
        self.spares = kernels.spares
        self.exits = exits

    async def sync(self, request: rpc.SyncKernels) -> rpc.KernelsSynced:
        """Reconcile with the manager's truth: the kernels it knows, in which status."""
        known = {
            *request.preparing,
            *request.pulling,
            *request.creating,
            *request.running,
            *request.terminating,
        }
        should_end = {*request.running, *request.terminating}
        to_end = set(request.terminating)
        view = request.view_seq
        running: list[str] = []
        destroy: list[str] = []
        unknown: list[str] = []
        spared: list[str] = []
        busy: list[str] = []
        exits: dict[str, rpc.KernelExit] = {}
        listed_after = self.exits.marks
        kernels = await self.kernels.runtime.list_kernels()
        self.spares.recall_from_labels(kernels)
        for k in kernels:
            kid = k.kernel_id
            ended = k.exit is not None  # kept for its logs; not running without an exit is not
            if k.exit is not None:
                exits[kid] = rpc.KernelExit(
                    exit_code=k.exit.exit_code,
                    oom_killed=k.exit.oom_killed,
                    ran_s=max(0.0, k.exit.ran_s),
                )
            if kid in self.kernels.terminating:
                busy.append(kid)
            elif self.kernels.locks.in_flight(kid):
                # A create-kernel is in flight: the manager asked for it, its view lags.
                running.append(kid)
            elif kid in to_end:
                destroy.append(kid)
            elif ended:
                pass  # kept (with its logs) until keep_exited_s, known or not: terminated
            elif kid not in known:
                # spared running or not (a start that failed too): at most SPARE_S
                (spared if self.spares.created_past_view(kid, view) else unknown).append(kid)
            elif not k.running:
                destroy.append(kid)  # never started, or paused: not the kernel running
            else:
                running.append(kid)
        self.exits.housekeep(kernels, listed_after)
        kept = await asyncio.gather(
            *(self.kernels.destroy(kid) for kid in destroy),
            *(self.destroy_stray(kid, view) for kid in unknown),
        )
        # Kept: a create asked again from past the view while the sync waited for the lock
        strays = list(zip(unknown, kept[len(destroy) :], strict=True))
        spared += [kid for kid, was_kept in strays if was_kept]
        unknown = [kid for kid, was_kept in strays if not was_kept]
        if unknown:
            log.warning(
                "agent %s: destroyed containers the manager does not know: %s",
                self.agent_id,
                unknown,
            )
        if spared:
            log.info(
                "agent %s: kept containers created past the manager's view (seq %s): %s",
                self.agent_id,
                view,
                spared,
            )
        have = {*running, *busy}
        terminated = sorted(k for k in should_end if k not in have)
        return rpc.KernelsSynced(
            running=sorted(running),
            terminating=sorted(k for k in busy if k in known),
            terminated=terminated,
            destroyed=sorted(unknown),
            spared=sorted(spared),
            exits={k: exits[k] for k in terminated if k in exits},
        )

    async def destroy_stray(self, kernel_id: str, view_seq: int | None) -> bool:
        """Destroy a container of a kernel the manager does not know, unless a create-kernel
        from past its view took the kernel's lock first (then kept: True)."""
        async with self.kernels.locks.hold(kernel_id):
            if self.spares.created_past_view(kernel_id, view_seq):
                return True
            await self.kernels.destroy_locked(kernel_id)
            return False
