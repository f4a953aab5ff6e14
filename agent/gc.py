"""Image garbage collection on one agent, as the kubelet does it.

When the engine's filesystem (Docker: its root dir, ``DockerRootDir``, as ``statvfs`` measures
it: used = size - available) is more than ``high`` full, the least recently used images go,
oldest use first, until it is at most ``low`` full.  Where the filesystem cannot be measured (a
remote daemon, the dummy runtime) the images' sizes count against the agent's ``--disk``.
Never removed: an image a container uses (running or not), one being pulled, one a kernel is
about to use (the manager's ``pin-images`` ``expected`` list, and a lease on every
check-and-pull, so a kernel between "image present" and "container created" keeps it), one a
preload job pinned, one a prepull policy wants.  ``plan_gc`` is the pure decision; the agent
(agent.image_gc) gathers the facts, removes, and records one ImageRemoved per image with the
reason, e.g. ``gc: /var/lib/docker 91% used (9318 MiB of 10240 MiB) > 85%, least recently
used (last used 2026-05-01T10:00:00+00:00)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime


@dataclass(frozen=True)
class GcPolicy:
    high: float = 0.85  # kubelet's imageGCHighThresholdPercent
    low: float = 0.80  # ... and imageGCLowThresholdPercent
    interval_s: float = 30.0
    lease_s: float = 600.0  # a check-and-pull protects its images this long

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high <= 1:
            raise ValueError(
                f"image GC watermarks need 0 < low < high <= 1, got low {self.low}, high"
                f" {self.high} (--image-gc-low / --image-gc-high are percentages)"
            )
        if not self.interval_s > 0 or not self.lease_s >= 0:
            raise ValueError("image GC interval must be > 0 s and the lease >= 0 s")


@dataclass(frozen=True)
class DiskUsage:
    """What GC measures against: ``used`` of ``total`` bytes of ``where``."""

    where: str  # "/var/lib/docker", or "images against --disk" when not measured
    total: int
    used: int

    @property
    def fraction(self) -> float:
        return self.used / self.total if self.total > 0 else 0.0

    def describe(self) -> str:
        return f"{self.where} {_pct(self.fraction)} used ({_mib(self.used)} of {_mib(self.total)})"


@dataclass(frozen=True)
class GcImage:
    image: str
    size_bytes: int
    last_used: float  # epoch seconds: a container started with it, or it arrived


@dataclass
class GcPlan:
    used: int
    removals: list[tuple[GcImage, str]] = field(default_factory=list)  # image, reason
    note: str = ""
    trigger: str = ""  # why the pass runs ("" when none is due): the next round's ``trigger``

    @property
    def used_after(self) -> int:
        return self.used - sum(i.size_bytes for i, _ in self.removals)


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"


def _mib(size: int) -> str:
    return f"{size / 1024**2:.0f} MiB"


def plan_gc(
    images: Iterable[GcImage],
    usage: DiskUsage,
    policy: GcPolicy,
    kept: Mapping[str, str],
    *,
    trigger: str | None = None,
) -> GcPlan:
    """Which images to remove, least recently used first, so that ``usage`` comes down to the
    low watermark (each removal counted as freeing its image's size); ``kept`` maps the images
    that must stay to why.  A pass starts above the high watermark; ``trigger`` (the first
    round's) continues one already started while the measured usage is above the low one (an
    image that shares layers frees less than its size)."""
    images = list(images)
    plan = GcPlan(usage.used)
    if usage.total <= 0:
        return plan
    if trigger is None:
        if usage.used <= policy.high * usage.total:
            return plan
        trigger = f"gc: {usage.describe()} > {_pct(policy.high)}"
    plan.trigger = trigger
    target = int(policy.low * usage.total)
    left = usage.used
    for image in sorted(images, key=lambda i: (i.last_used, i.image)):
        if left <= target:
            break
        if image.image in kept:
            continue
        when = datetime.fromtimestamp(image.last_used, UTC).isoformat(timespec="seconds")
        plan.removals.append((image, f"{trigger}, least recently used (last used {when})"))
        left -= image.size_bytes
    if left > target:
        plan.note = (
            f"{usage.where} stays at {_pct(left / usage.total)} (> {_pct(policy.low)}):"
            " the rest is in use, about to be used or pinned"
        )
    return plan
