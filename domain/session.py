"""The Session aggregate: what a user asked for, and the kernels it owns.

Commands check their arguments and the status machine first, then record one event; a refused
command raises and leaves the session unchanged with no pending event.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Protocol
from uuid import uuid4

from eventsourcing.domain import BaseAggregate

from domain import events as ev
from domain.errors import IllegalTransition, InvalidField, UnknownKernel, convert, require_text
from domain.limits import MAX_DETAIL, MAX_REASON, clip
from domain.status import TERMINAL, Kernel, KernelStatus, check_transition
from domain.subjects import check_token

S = KernelStatus

# How far a live kernel has got: a session is only as far along as its slowest kernel.
_PROGRESS = [S.PENDING, S.SCHEDULED, S.PREPARING, S.PULLING, S.PREPARED, S.CREATING, S.RUNNING]


_RESOURCES = "{cpu: cores > 0, mem: bytes > 0}"


class _HasStatus(Protocol):
    status: KernelStatus
    status_info: str


def session_status(kernels: Collection[_HasStatus]) -> tuple[KernelStatus, str]:
    """A session's status and status_info from its kernels (in enqueue order): ERROR if any
    kernel failed; when all are final, TERMINATED if any ran to the end, else CANCELLED;
    otherwise TERMINATING if any is stopping, else the least advanced live status (RUNNING only
    when every live kernel runs).  The status_info is the first kernel's in that status."""
    if len(kernels) == 1:  # the rule gives a lone kernel's own status (a common case, and hot)
        (kernel,) = kernels
        return kernel.status, kernel.status_info
    statuses = {k.status for k in kernels}
    if S.ERROR in statuses:
        status = S.ERROR
    elif statuses <= TERMINAL:
        status = S.TERMINATED if S.TERMINATED in statuses else S.CANCELLED
    elif S.TERMINATING in statuses:
        status = S.TERMINATING
    else:
        status = min(statuses - TERMINAL, key=_PROGRESS.index)
    return status, next(k.status_info for k in kernels if k.status == status)


class Session(BaseAggregate[str]):
    if TYPE_CHECKING:  # set by the events; class annotations would make eventsourcing a dataclass
        owner: str
        image: str
        resources: ev.Resources  # per kernel
        resource_group: str
        request_id: str | None
        kernels: dict[str, Kernel]  # kernel id -> kernel, in enqueue order

    @classmethod
    def enqueue(
        cls,
        *,
        owner: str,
        image: str,
        resources: ev.Resources | Mapping[str, object],
        resource_group: str,
        cluster_size: int = 1,
        request_id: str | None = None,
        session_id: str | None = None,
    ) -> Session:
        if isinstance(cluster_size, bool) or not isinstance(cluster_size, int) or cluster_size < 1:
            raise InvalidField("cluster_size", f"must be an integer >= 1, got {cluster_size!r}")
        if request_id is not None:
            require_text(request_id, "request_id")
        return cls._create(
            ev.SessionEnqueued,
            id=check_token(session_id or uuid4().hex, "session_id"),
            owner=require_text(owner, "owner"),
            image=require_text(image, "image"),
            resources=convert(resources, ev.Resources, "resources", _RESOURCES),
            cluster_size=cluster_size,
            resource_group=check_token(resource_group, "resource_group"),
            kernel_ids=[uuid4().hex for _ in range(cluster_size)],
            status_info="enqueued",
            request_id=request_id,
        )

    # --- derived state ---------------------------------------------------------------------

    @property
    def status(self) -> KernelStatus:
        return session_status(self.kernels.values())[0]

    @property
    def status_info(self) -> str:
        return session_status(self.kernels.values())[1]

    def kernel(self, kernel_id: str) -> Kernel:
        try:
            return self.kernels[kernel_id]
        except KeyError:
            raise UnknownKernel(self.id, kernel_id) from None

    # --- commands --------------------------------------------------------------------------

    def scheduling_failed(self, status_info: str) -> None:
        """Record why no placement was found; the kernels stay PENDING.  Repeating the same
        reason records nothing, so a scheduler retrying every tick does not flood history."""
        status_info = clip(require_text(status_info, "status_info"), MAX_REASON)
        for kernel in self.kernels.values():
            if kernel.status != S.PENDING:
                raise IllegalTransition(kernel.status, S.PENDING, frozenset(), kernel.kernel_id)
        if all(k.status_info == status_info for k in self.kernels.values()):
            return
        self.trigger_event(ev.SessionSchedulingFailed, status_info=status_info)

    def schedule(self, placements: Mapping[str, str], status_info: str = "scheduled") -> None:
        """Place every kernel: ``placements`` maps each kernel id to an agent id."""
        missing = self.kernels.keys() - placements.keys()
        extra = placements.keys() - self.kernels.keys()
        if missing or extra:
            raise InvalidField(
                "placements",
                f"must place exactly this session's kernels; missing {sorted(missing)},"
                f" unknown {sorted(extra)}",
            )
        for kernel_id, agent_id in placements.items():
            check_token(agent_id, f"placements[{kernel_id}]")
            check_transition(self.kernels[kernel_id].status, S.SCHEDULED, kernel_id)
        self.trigger_event(
            ev.SessionScheduled,
            placements=dict(placements),
            status_info=require_text(status_info, "status_info"),
        )

    def mark_preparing(self, kernel_id: str, status_info: str = "preparing") -> None:
        self._move(ev.KernelPreparing, kernel_id, status_info)

    def mark_pulling(self, kernel_id: str, task_id: str, status_info: str = "pulling") -> None:
        self._move(
            ev.KernelPulling, kernel_id, status_info, task_id=check_token(task_id, "task_id")
        )

    def mark_prepared(self, kernel_id: str, status_info: str = "prepared") -> None:
        self._move(ev.KernelPrepared, kernel_id, status_info)

    def mark_creating(self, kernel_id: str, status_info: str = "creating") -> None:
        self._move(ev.KernelCreating, kernel_id, status_info)

    def mark_created(self, kernel_id: str, container_id: str, status_info: str = "running") -> None:
        self._move(
            ev.KernelCreated,
            kernel_id,
            status_info,
            container_id=require_text(container_id, "container_id"),
        )

    def creation_failed(
        self, kernel_id: str, detail: str, status_info: str = "failed-to-start"
    ) -> None:
        self._move(ev.KernelCreationFailed, kernel_id, status_info, detail=detail)

    def cancel(self, kernel_id: str, status_info: str, detail: str = "") -> None:
        """Give up a kernel that has not started running (e.g. ``user-requested``,
        ``image-pull-failed``, ``force-cancelled``)."""
        self._move(ev.KernelCancelled, kernel_id, status_info, detail=detail)

    def mark_terminating(self, kernel_id: str, status_info: str, detail: str = "") -> None:
        self._move(ev.KernelTerminating, kernel_id, status_info, detail=detail)

    def mark_terminated(self, kernel_id: str, status_info: str, detail: str = "") -> None:
        self._move(ev.KernelTerminated, kernel_id, status_info, detail=detail)

    def _move(
        self, event_class: type[ev.KernelEvent], kernel_id: str, status_info: str, **fields: str
    ) -> None:
        kernel = self.kernel(kernel_id)
        check_transition(kernel.status, event_class.status, kernel_id)
        if "detail" in fields:  # often a runtime's error text: cut to what readers accept
            fields["detail"] = clip(fields["detail"], MAX_DETAIL)
        self.trigger_event(
            event_class,
            kernel_id=kernel_id,
            status_info=clip(require_text(status_info, "status_info"), MAX_REASON),
            **fields,
        )
