"""The Agent aggregate: a host's capacity, the images it holds and the pulls it runs.

Registration is the created event (``Agent.register``); an agent that restarts is the same
aggregate and records ``AgentReregistered`` (``agent.reregister``), so its history, and the
subject sequence the store checks, carry on.  Which images an agent *should* hold, and where
kernels go, is policy and lives elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from eventsourcing.domain import BaseAggregate

from domain import events as ev
from domain.errors import DomainError, InvalidField, convert, require_text
from domain.image_ref import canonical, canonical_or_same
from domain.limits import MAX_REASON, clip
from domain.reasons import exit_reason
from domain.subjects import check_token

_CAPACITY = "{cpu: cores > 0, mem: bytes > 0, disk: bytes >= 0}"
_IMAGES = "{image: {digest, size_bytes}}"


class Agent(BaseAggregate[str]):
    if TYPE_CHECKING:  # set by the events; class annotations would make eventsourcing a dataclass
        resource_group: str
        capacity: ev.Capacity
        runtime: str
        images: dict[str, ev.HeldImage]  # image -> what is on disk
        pulls: dict[str, str]  # image -> task id of the pull in flight
        preloaded: dict[str, bool]  # image held ahead of kernels -> pinned (a preload job)
        status_info: str  # registered, reregistered (a loss is on its liveness: domain.liveness)

    @classmethod
    def register(
        cls,
        *,
        agent_id: str,
        resource_group: str,
        capacity: ev.Capacity | Mapping[str, object],
        runtime: str,
        images: Mapping[str, ev.HeldImage | Mapping[str, object]] | None = None,
    ) -> Agent:
        return cls._create(
            ev.AgentRegistered,
            id=check_token(agent_id, "agent_id"),
            resource_group=check_token(resource_group, "resource_group"),
            capacity=convert(capacity, ev.Capacity, "capacity", _CAPACITY),
            runtime=check_token(runtime, "runtime"),
            images=_held(images),
        )

    def reregister(
        self,
        *,
        resource_group: str,
        capacity: ev.Capacity | Mapping[str, object],
        runtime: str,
        images: Mapping[str, ev.HeldImage | Mapping[str, object]] | None = None,
    ) -> None:
        self.trigger_event(
            ev.AgentReregistered,
            resource_group=check_token(resource_group, "resource_group"),
            capacity=convert(capacity, ev.Capacity, "capacity", _CAPACITY),
            runtime=check_token(runtime, "runtime"),
            images=_held(images),
        )

    def pull_started(self, image: str, task_id: str) -> None:
        image = canonical(image, "image")
        check_token(task_id, "task_id")
        running = self.pulls.get(image)
        if running is not None:
            raise DomainError(
                f"agent {self.id} already pulls {image} as task {running}; follow that task"
                " instead of starting another"
            )
        self.trigger_event(ev.ImagePullStarted, image=image, task_id=task_id)

    def pulled(
        self, image: str, task_id: str, digest: str, size_bytes: int, duration_s: float
    ) -> None:
        image = canonical(image, "image")
        self._check_pull(image, task_id)
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0:
            raise InvalidField("size_bytes", f"must be an integer >= 0, got {size_bytes!r}")
        if not isinstance(duration_s, int | float) or duration_s < 0:
            raise InvalidField("duration_s", f"must be a number >= 0, got {duration_s!r}")
        self.trigger_event(
            ev.ImagePulled,
            image=image,
            task_id=task_id,
            digest=require_text(digest, "digest"),
            size_bytes=size_bytes,
            duration_s=float(duration_s),
        )

    def pull_failed(self, image: str, task_id: str, reason: str, cancelled: bool = False) -> None:
        image = canonical(image, "image")
        self._check_pull(image, task_id)
        self.trigger_event(
            ev.ImagePullFailed,
            image=image,
            task_id=task_id,
            reason=clip(require_text(reason, "reason"), MAX_REASON),  # a registry's words
            cancelled=cancelled,
        )

    def image_removed(self, image: str, reason: str) -> None:
        reason = clip(require_text(reason, "reason"), MAX_REASON)
        image = canonical(image, "image")
        if image not in self.images:
            raise DomainError(
                f"agent {self.id} holds no image {image!r}; nothing to remove"
                f" (it holds: {', '.join(sorted(self.images)) or 'none'})"
            )
        self.trigger_event(ev.ImageRemoved, image=image, reason=reason)

    def mark_preloaded(self, image: str, reason: str, pinned: bool) -> None:
        """Record that ``image`` was preloaded; nothing if that is known already (one fact)."""
        reason = clip(require_text(reason, "reason"), MAX_REASON)
        image = canonical(image, "image")
        if image not in self.images:
            raise DomainError(
                f"agent {self.id} holds no image {image!r}; preload marks only images it holds"
            )
        if image in self.preloaded and (self.preloaded[image] or not pinned):
            return
        self.trigger_event(ev.ImagePreloaded, image=image, reason=reason, pinned=pinned)

    def kernel_exited(
        self, kernel_id: str, session_id: str, exit_code: int, ran_s: float, oom_killed: bool
    ) -> None:
        """A kernel's process ended here (the manager decides what it means for the kernel)."""
        self.trigger_event(
            ev.KernelExited,
            kernel_id=check_token(kernel_id, "kernel_id"),
            session_id=check_token(session_id, "session_id"),
            exit_code=exit_code,
            oom_killed=oom_killed,
            ran_s=max(0.0, float(ran_s)),
            reason=exit_reason(exit_code, oom_killed),
        )

    def _check_pull(self, image: str, task_id: str) -> None:
        if self.pulls.get(image) != task_id:
            raise DomainError(
                f"agent {self.id} has no pull of {image!r} as task {task_id!r}"
                f" (in flight: {self.pulls.get(image) or 'none'}); record ImagePullStarted first"
            )

    # --- state changes: what each event does to the agent (Event.apply calls WHEN) ----------

    def _on_registered(self, e: ev.AgentRegistered) -> None:
        self.pulls = {}
        self.status_info = "registered"
        self.preloaded = {}
        self._registration(e)

    def _on_reregistered(self, e: ev.AgentReregistered) -> None:
        self.pulls = {}
        self.status_info = "reregistered"
        self._registration(e)

    def _registration(self, e: ev.AgentRegistered | ev.AgentReregistered) -> None:
        self.resource_group = e.resource_group
        self.capacity = e.capacity
        self.runtime = e.runtime
        # Older events (and engines) may name an image in a short form: one key per image.
        self.images = {canonical_or_same(i): held for i, held in e.images.items()}
        # A preload mark outlives a restart for as long as the image is still there.
        self.preloaded = {
            image: pinned
            for image, pinned in getattr(self, "preloaded", {}).items()
            if image in self.images
        }

    def _on_pull_started(self, e: ev.ImagePullStarted) -> None:
        self.pulls[canonical_or_same(e.image)] = e.task_id

    def _on_pulled(self, e: ev.ImagePulled) -> None:
        image = canonical_or_same(e.image)
        self.pulls.pop(image, None)
        self.images[image] = ev.HeldImage(digest=e.digest, size_bytes=e.size_bytes)

    def _on_pull_failed(self, e: ev.ImagePullFailed) -> None:
        self.pulls.pop(canonical_or_same(e.image), None)

    def _on_image_removed(self, e: ev.ImageRemoved) -> None:
        image = canonical_or_same(e.image)
        self.images.pop(image, None)
        self.preloaded.pop(image, None)

    def _on_preloaded(self, e: ev.ImagePreloaded) -> None:
        image = canonical_or_same(e.image)
        self.preloaded[image] = e.pinned or self.preloaded.get(image, False)

    WHEN = {  # event class -> state change, for Event.apply
        ev.AgentRegistered: _on_registered,
        ev.AgentReregistered: _on_reregistered,
        ev.ImagePullStarted: _on_pull_started,
        ev.ImagePulled: _on_pulled,
        ev.ImagePullFailed: _on_pull_failed,
        ev.ImageRemoved: _on_image_removed,
        ev.ImagePreloaded: _on_preloaded,
        ev.KernelExited: lambda agent, e: None,  # a fact for the manager; changes no agent state
    }


def _held(
    images: Mapping[str, ev.HeldImage | Mapping[str, object]] | None,
) -> dict[str, ev.HeldImage]:
    """An agent's inventory keyed by canonical references (an engine lists short forms)."""
    held = convert(images or {}, dict[str, ev.HeldImage], "images", _IMAGES)
    return {canonical_or_same(image): h for image, h in held.items()}
