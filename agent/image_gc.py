"""Image GC on this agent: what it must keep, and the pass that removes the rest
(the plan itself is agent.gc.plan_gc)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from agent.facts import AgentFacts
from agent.gc import DiskUsage, GcImage, GcPlan, GcPolicy, plan_gc
from agent.metrics import AgentMetrics
from agent.pulls import PullManager
from agent.runtime.base import ImageInUse, Runtime
from domain import events as ev
from domain import rpc

log = logging.getLogger(__name__)

# Rounds of one pass: an image sharing layers frees less than its size, so the pass measures
# again and goes on while the filesystem is above the low watermark.
ROUNDS = 5


class ImageGc:
    def __init__(
        self,
        agent_id: str,
        runtime: Runtime,
        facts: AgentFacts,
        pulls: PullManager,
        metrics: AgentMetrics,
        policy: GcPolicy,
        capacity: Callable[[], ev.Capacity | None],
    ) -> None:
        self.agent_id = agent_id
        self.runtime = runtime
        self.facts = facts
        self.pulls = pulls
        self.metrics = metrics
        self.policy = policy
        self._capacity = capacity
        # What GC must keep besides images in use or being pulled:
        self.preloaded: set[str] = set()  # pinned by preload jobs (ImagePreloaded pinned)
        self.policy_pins: set[str] = set()  # prepull policies (the manager's pin-images)
        self.expected: set[str] = set()  # kernels scheduled here (the manager's pin-images)
        self.leases: dict[str, float] = {}  # image -> monotonic end of its check-and-pull lease
        self.last_used: dict[str, float] = {}  # image -> epoch s: pulled or a container made
        self._lock = asyncio.Lock()
        self._last_note = ""  # the last pass's note, logged once when it changes

    def used(self, image: str) -> None:
        """The image was pulled, or a container made of it, now."""
        self.last_used[image] = time.time()

    def lease(self, images: Iterable[str]) -> None:
        """A kernel is about to use them: kept for the lease (pin-images renews it)."""
        lease = time.monotonic() + self.policy.lease_s
        for image in images:
            self.leases[image] = max(lease, self.leases.get(image, 0.0))

    async def pin(self, request: rpc.PinImages) -> rpc.ImagesPinned:
        if request.policy is not None:
            self.policy_pins = set(request.policy)
        if request.expected is not None:
            self.expected = set(request.expected)
        return rpc.ImagesPinned(policy=len(self.policy_pins), expected=len(self.expected))

    def unloaded(self, image: str) -> None:
        """Removed on request: its pin and its lease go with it."""
        self.preloaded.discard(image)
        self.leases.pop(image, None)

    def about_to_use(self, image: str) -> str | None:
        if image in self.expected:
            return "about-to-use: a kernel scheduled on this agent needs it"
        if self.leases.get(image, 0.0) > time.monotonic():
            return "about-to-use: asked for by check-and-pull"
        return None

    async def images_to_keep(self) -> dict[str, str]:
        """Images GC must not remove, and why."""
        kept: dict[str, str] = {}
        for k in await self.runtime.list_kernels():
            kept.setdefault(k.image, f"in-use: kernel {k.kernel_id}")
            self.used(k.image)  # in use is used now
        for image, task in self.pulls.active.items():
            kept.setdefault(image, f"pulling: task {task.task_id}")
        for image in {*self.expected, *self.leases}:
            if (why := self.about_to_use(image)) is not None:
                kept.setdefault(image, why)
        for image in self.preloaded:
            kept.setdefault(image, "pinned: preloaded")
        for image in self.policy_pins:
            kept.setdefault(image, "pinned: a prepull policy wants it")
        return kept

    async def usage(self, images: list[GcImage]) -> DiskUsage:
        """The engine's filesystem as statvfs measures it, else the images against --disk."""
        fs = await self.runtime.filesystem()
        if fs is not None and fs.total > 0:
            return DiskUsage(fs.path, fs.total, fs.total - fs.available)
        capacity = self._capacity()
        assert capacity is not None, "the agent's start measures capacity first"
        return DiskUsage("--disk", capacity.disk, sum(i.size_bytes for i in images))

    async def _images(self) -> list[GcImage]:
        first_seen = time.time()
        return [
            GcImage(i.image, i.size_bytes, self.last_used.setdefault(i.image, first_seen))
            for i in await self.runtime.list_images()
        ]

    async def run(self, request: rpc.ImageGc | None = None) -> rpc.GcReport:
        """One GC pass: decide with agent.gc.plan_gc, remove, record ImageRemoved each; measure
        again and go on (up to ROUNDS) while the filesystem is still above the low watermark."""
        async with self._lock:
            now = time.monotonic()
            self.leases = {i: t for i, t in self.leases.items() if t > now}
            images = await self._images()
            before = usage = await self.usage(images)
            kept = await self.images_to_keep()
            removed: list[rpc.GcRemoval] = []
            trigger: str | None = None
            note = ""
            for _ in range(ROUNDS):
                plan = plan_gc(images, usage, self.policy, kept, trigger=trigger)
                note, trigger = plan.note, plan.trigger or None
                done = await self._remove(plan)
                removed += done
                if not done:
                    break
                images = await self._images()
                usage = await self.usage(images)
                if usage.used <= self.policy.low * usage.total:
                    note = ""
                    break
            if not note and usage.used > self.policy.low * usage.total and removed:
                note = (
                    f"{usage.where} stays at {usage.fraction * 100:.0f}% after {ROUNDS} rounds"
                    " of removals (images share layers: each freed less than its size)"
                )
            self._log(before, usage, removed, note)
            return rpc.GcReport(
                disk=before.total,
                measured=before.where,
                used_before=before.used,
                used_after=usage.used,
                removed=removed,
                kept={i.image: kept[i.image] for i in images if i.image in kept},
                note=note,
            )

    async def _remove(self, plan: GcPlan) -> list[rpc.GcRemoval]:
        removed: list[rpc.GcRemoval] = []
        for image, reason in plan.removals:
            # Asked for since the plan (a check-and-pull, a preload)? Then it stays.
            if image.image in self.pulls.active or self.about_to_use(image.image):
                continue
            if image.image in self.preloaded or image.image in self.policy_pins:
                continue
            try:
                gone = await self.runtime.remove_image(image.image)
            except ImageInUse:
                continue  # a container appeared meanwhile: it is in use
            self.last_used.pop(image.image, None)
            if gone:
                await self.facts.image_removed(image.image, reason)
                self.metrics.gc_removals.labels("space").inc()
                log.info(
                    "agent %s: image gc removed %s (%d MiB): %s",
                    self.agent_id,
                    image.image,
                    image.size_bytes // 1024**2,
                    reason,
                )
                removed.append(
                    rpc.GcRemoval(image=image.image, size_bytes=image.size_bytes, reason=reason)
                )
        return removed

    def _log(
        self, before: DiskUsage, after: DiskUsage, removed: list[rpc.GcRemoval], note: str
    ) -> None:
        if removed:
            log.info(
                "agent %s: image gc removed %d images; %s, was %s (low watermark %.0f%%)",
                self.agent_id,
                len(removed),
                after.describe(),
                f"{before.fraction * 100:.0f}%",
                self.policy.low * 100,
            )
        if note and note != self._last_note:
            log.warning("agent %s: image gc: %s", self.agent_id, note)
        self._last_note = note
