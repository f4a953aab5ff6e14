"""Sessions: the client's commands and a superadmin's kernel cancel (services.manager.api).

Subjects (domain.subjects) and payloads (every failure is ``{"error": {"code", "message"}}`` and
changed nothing):

- ``hoist.api.session.create`` ``{owner, image, resources: {cpu, mem}, cluster_size=1,
  resource_group="default", max_wait=0, request_id?}`` -> the session (``SessionView``).
  ``max_wait`` > 0: the reply waits up to that many seconds for RUNNING or a final status and
  answers with the status at that moment (seed 001); PULLING kernels carry ``agent_id`` and
  ``pull_task_id`` so the client can watch ``hoist.progress.<agent_id>.<pull_task_id>``.
  ``request_id``: the session id is derived from (owner, request_id), so the same request twice
  creates one session (the append expects an empty subject); the same request_id with other
  parameters is refused (``conflict``).
- ``hoist.api.session.get`` ``{session_id}`` -> the session.
- ``hoist.api.session.destroy`` ``{session_id, forced=false}`` -> the session: kernels not yet
  running go CANCELLED ``user-requested``, running ones TERMINATING and then TERMINATED once
  their agent removed the container; ``forced`` records them TERMINATED at once
  (``force-terminated``) and removes the containers best effort.
- ``hoist.admin.kernel.cancel`` ``{kernel_id, reason?}`` -> the session: a superadmin forces a
  kernel that is not running yet (e.g. PULLING) to CANCELLED ``force-cancelled: <reason>``;
  its siblings follow. Only the ``admin`` NATS role may publish ``hoist.admin.>``.

Error codes: ``invalid-request`` (the message names the field), ``not-found``, ``conflict``,
``illegal-transition``, ``unavailable`` (the event store did not take the write: retry).
"""

from __future__ import annotations

import hashlib
from typing import Annotated

import msgspec

from domain.contracts.common import TypedReason
from domain.events import Resources
from domain.limits import ClusterSize, Id, Image, Owner
from domain.session import Session


class _Request(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class CreateSession(_Request, kw_only=True):
    owner: Owner
    image: Image
    resources: Resources  # per kernel
    cluster_size: ClusterSize = 1
    resource_group: Id = "default"
    max_wait: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 0.0  # seconds
    request_id: Id | None = None


class GetSession(_Request, kw_only=True):
    session_id: Id


class DestroySession(_Request, kw_only=True):
    session_id: Id
    forced: bool = False


class CancelKernel(_Request, kw_only=True):
    kernel_id: Id
    reason: TypedReason | None = None


class KernelView(msgspec.Struct, frozen=True, kw_only=True):
    kernel_id: str
    status: str
    status_info: str
    agent_id: str | None
    pull_task_id: str | None
    container_id: str | None


class SessionView(msgspec.Struct, frozen=True, kw_only=True):
    """The reply of every session command."""

    session_id: str
    owner: str
    image: str
    resources: Resources
    cluster_size: int
    resource_group: str
    request_id: str | None
    status: str
    status_info: str
    kernels: list[KernelView]


def session_view(session: Session) -> SessionView:
    return SessionView(
        session_id=session.id,
        owner=session.owner,
        image=session.image,
        resources=session.resources,
        cluster_size=len(session.kernels),
        resource_group=session.resource_group,
        request_id=session.request_id,
        status=session.status.value,
        status_info=session.status_info,
        kernels=[
            KernelView(
                kernel_id=k.kernel_id,
                status=k.status.value,
                status_info=k.status_info,
                agent_id=k.agent_id,
                pull_task_id=k.pull_task_id,
                container_id=k.container_id,
            )
            for k in session.kernels.values()
        ],
    )


def session_id_for(owner: str, request_id: str) -> str:
    """The session a (owner, request_id) pair creates: retries land on the same subject."""
    return hashlib.sha256(f"{owner}\0{request_id}".encode()).hexdigest()[:32]
