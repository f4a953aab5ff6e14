"""The image verbs: check-and-pull, preload, unload, and the pulls they start."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence

from agent.facts import AgentFacts
from agent.image_gc import ImageGc
from agent.metrics import AgentMetrics
from agent.pulls import PullManager, PullTask
from agent.runtime.base import ImageInUse, Runtime
from domain import rpc
from transport.tasks import Tasks

log = logging.getLogger(__name__)

RECORD_WAIT_S = 10.0  # a check-and-pull reply waits this long for ImagePullStarted to be stored


class ImageVerbs:
    def __init__(
        self,
        runtime: Runtime,
        facts: AgentFacts,
        pulls: PullManager,
        image_gc: ImageGc,
        metrics: AgentMetrics,
        tasks: Tasks,
    ) -> None:
        self.runtime = runtime
        self.facts = facts
        self.pulls = pulls
        self.image_gc = image_gc
        self.metrics = metrics
        self.tasks = tasks

    async def check_and_pull(
        self, request: rpc.CheckAndPull | rpc.Preload
    ) -> dict[str, rpc.ImagePresent | rpc.PullTask]:
        self.image_gc.lease(request.images)
        kernel_ids = request.kernel_ids if isinstance(request, rpc.CheckAndPull) else []
        return await self._present_or_pull(request.images, kernel_ids)

    async def _present_or_pull(
        self,
        images: list[str],
        kernel_ids: Sequence[str] = (),
        digests: Mapping[str, str] | None = None,
    ) -> dict[str, rpc.ImagePresent | rpc.PullTask]:
        """Each image held, or its pull (the one in flight, or a new one) with ``kernel_ids``
        waiting for it (none: an anonymous caller, whose pull is never cancelled).  An image
        held under another digest than ``digests`` names is pulled again (its tag moved)."""
        out: dict[str, rpc.ImagePresent | rpc.PullTask] = {}
        started = []
        for i, image in enumerate(images):
            if image not in self.pulls.active:
                try:
                    held = await self.runtime.has_image(image)
                except ValueError as e:
                    raise rpc.RequestError("invalid-request", f"images[{i}]: {e}") from None
                wanted = (digests or {}).get(image)
                if held is not None and wanted not in (None, held.digest):
                    log.info(
                        "agent %s: %s is %s here, the registry now says %s: pulling it again",
                        self.facts.agent_id,
                        image,
                        held.digest,
                        wanted,
                    )
                elif held is not None:
                    out[image] = rpc.ImagePresent(digest=held.digest, size=held.size_bytes)
                    continue
            task = self.pulls.request(image, kernel_ids)  # the task in flight, if there is one
            out[image] = rpc.PullTask(task_id=task.task_id)
            started.append(task.recorded.wait())
        # Reply once ImagePullStarted is stored, so the manager can follow the task in the log.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(RECORD_WAIT_S):  # wait_for can lose a cancel on 3.11
                await asyncio.gather(*started)
        return out

    async def preload(self, request: rpc.Preload) -> dict[str, rpc.ImagePresent | rpc.PullTask]:
        if request.pinned:
            self.image_gc.preloaded.update(request.images)
        # No lease: no kernel waits for it.
        out = await self._present_or_pull(request.images, digests=request.digests)
        for image, answer in out.items():
            if isinstance(answer, rpc.ImagePresent):
                await self.facts.image_preloaded(image, request.reason, request.pinned)
            elif (task := self.pulls.get(answer.task_id)) is not None:
                self.tasks.spawn(self._preloaded_when_pulled(task, request.reason, request.pinned))
        return out

    async def _preloaded_when_pulled(self, task: PullTask, reason: str, pinned: bool) -> None:
        await task.ended.wait()  # ImagePulled is recorded by then
        if task.state == "done":
            await self.facts.image_preloaded(task.image, reason, pinned)

    async def pull_cancel(self, request: rpc.PullCancel) -> rpc.PullCancelled:
        """The kernels no longer wait for the image: its pull stops if nobody else waits."""
        task = self.pulls.release(request.image, request.kernel_ids, request.reason)
        if task is None:
            return rpc.PullCancelled()
        cancelled = task.cancel_reason is not None
        return rpc.PullCancelled(
            task_id=task.task_id,
            state="cancelled" if cancelled else task.state,
            cancelled=cancelled,
            waiting=sorted(task.kernels),
        )

    async def pull_status(self, request: rpc.PullStatus) -> rpc.PullStatusReply:
        task = self.pulls.get(request.task_id)
        if task is None:
            return rpc.PullStatusReply(task_id=request.task_id, known=False)
        return rpc.PullStatusReply(
            task_id=task.task_id,
            known=True,
            image=task.image,
            state=task.state,
            reason=task.reason,
            current=task.current,
            total=task.total,
        )

    async def unload(self, request: rpc.Unload) -> dict[str, rpc.UnloadResult]:
        out: dict[str, rpc.UnloadResult] = {}
        kernels = await self.runtime.list_kernels()
        for i, image in enumerate(request.images):
            users = sorted(k.kernel_id for k in kernels if k.image == image)
            task = self.pulls.active.get(image)
            if users:
                in_use = f"in-use: kernels {first_few(users)}"  # ended ones' are kept for logs
                out[image] = rpc.UnloadResult(removed=False, reason=in_use)
                continue
            if task is not None:
                out[image] = rpc.UnloadResult(removed=False, reason=f"pulling: task {task.task_id}")
                continue
            if (why := self.image_gc.about_to_use(image)) is not None:
                out[image] = rpc.UnloadResult(removed=False, reason=why)
                continue
            try:
                removed = await self.runtime.remove_image(image)
            except ImageInUse as e:
                out[image] = rpc.UnloadResult(removed=False, reason=f"in-use: {e}")
                continue
            except ValueError as e:
                raise rpc.RequestError("invalid-request", f"images[{i}]: {e}") from None
            self.image_gc.unloaded(image)
            if removed:
                await self.facts.image_removed(image, request.reason)
                self.metrics.gc_removals.labels("unload").inc()
                out[image] = rpc.UnloadResult(removed=True)
            else:
                out[image] = rpc.UnloadResult(removed=False, reason="not-present")
        return out


def first_few(ids: list[str], shown: int = 3) -> str:
    """``a, b, c and 18 more``: a reason stays one readable line."""
    head = ", ".join(ids[:shown])
    return head if len(ids) <= shown else f"{head} and {len(ids) - shown} more"
