"""Preload and unload images across the fleet (served by services.manager.images_admin).

- ``hoist.admin.image.preload {images, agents | resource_group | all, parallelism=4,
  timeout=600, backoff_limit=3, backoff=2, wait=0}`` starts a job and answers its view (after up
  to ``wait`` seconds, or at once): at most ``parallelism`` agents pull at a time; each agent
  gets ``preload`` (the agent records ImagePreloaded, pinned: image GC keeps the images until
  they are unloaded); a failed agent is tried again up to ``backoff_limit`` times, ``backoff``
  seconds doubling between tries (never for not-found or unauthorized); an agent not done
  within ``timeout`` seconds fails ``timeout: ...`` (its pull may still finish).
- ``hoist.admin.image.job {job_id}`` -> the job's view: ``{job_id, images, parallelism, timeout,
  backoff_limit, state: running | done, started_at, ended_at, overall, agents}``; per agent
  ``state`` waiting | pulling | succeeded | failed (with ``reason``), ``attempts``, per image
  state and bytes (from the progress stream); ``overall`` counts and bytes.
  ``hoist.admin.image.jobs {}`` -> ``{"jobs": [...]}``, the views without ``agents``.
- ``hoist.admin.image.unload {images, agents | resource_group | all}`` -> ``{"agents": {id:
  {image: {"removed", "reason"?}}}}``.  Refused per agent, before the agent is asked, where a
  kernel uses the image (``in-use: kernel K RUNNING``) or is about to (``about-to-use: kernel
  K PULLING``: SCHEDULED through CREATING) or a prepull policy wants it there (``pinned: ...``);
  the agent refuses too (a container it has, a pull in flight).

Exactly one of ``agents``, ``resource_group`` and ``all`` names the targets.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from domain.contracts.common import AgentIds, NoRequest
from domain.limits import Id, Image

__all__ = [
    "AgentIds",
    "Images",
    "JobRequest",
    "NoRequest",
    "PreloadRequest",
    "Targets",
    "UnloadRequest",
]

Images = Annotated[list[Image], msgspec.Meta(min_length=1, max_length=256)]


class Targets(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    images: Images
    agents: AgentIds | None = None
    resource_group: Id | None = None
    all: bool = False


class PreloadRequest(Targets, frozen=True, kw_only=True):
    parallelism: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 4
    timeout: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 600.0  # per agent, seconds
    backoff_limit: Annotated[int, msgspec.Meta(ge=0, le=20)] = 3
    backoff: Annotated[float, msgspec.Meta(ge=0, le=600)] = 2.0  # seconds, doubled each retry
    wait: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 0.0


class UnloadRequest(Targets, frozen=True, kw_only=True):
    pass


class JobRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    job_id: Id
