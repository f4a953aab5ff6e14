"""Image garbage collection on one agent, as the kubelet does it.

When the images take more than ``high`` of the agent's disk budget (``--disk``, default the
host's disk), the least recently used images go, oldest use first, until they take at most
``low``.  Never removed: an image a container uses (running or not), one being pulled, one a
kernel is about to use (the manager's ``pin-images`` ``expected`` list, and a lease on every
check-and-pull, so a kernel between "image present" and "container created" keeps it), one a
preload job pinned, one a prepull policy wants.  ``plan_gc`` is the pure decision; the agent
(agent.image_gc) gathers the facts, removes, and records one ImageRemoved per image with the
reason, e.g. ``gc: disk 91% > 85%, least recently used (last used 2026-05-01T10:00:00Z)``.
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
class GcImage:
    image: str
    size_bytes: int
    last_used: float  # epoch seconds: a container started with it, or it arrived


@dataclass
class GcPlan:
    used: int
    removals: list[tuple[GcImage, str]] = field(default_factory=list)  # image, reason
    note: str = ""

    @property
    def used_after(self) -> int:
        return self.used - sum(i.size_bytes for i, _ in self.removals)


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"


def plan_gc(
    images: Iterable[GcImage], disk: int, policy: GcPolicy, kept: Mapping[str, str]
) -> GcPlan:
    """Which images to remove, least recently used first; ``kept`` maps the images that must
    stay to why."""
    images = list(images)
    used = sum(i.size_bytes for i in images)
    plan = GcPlan(used)
    if disk <= 0 or used <= policy.high * disk:
        return plan
    target = int(policy.low * disk)
    trigger = f"gc: disk {_pct(used / disk)} > {_pct(policy.high)}"
    left = used
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
            f"disk stays at {_pct(left / disk)} (> {_pct(policy.low)}): the rest is in use,"
            " about to be used or pinned"
        )
    return plan
