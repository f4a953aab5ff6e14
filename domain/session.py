"""The Session aggregate: what a user asked for, and the kernels it owns.

Commands check their arguments and the status machine first, then record one event; a refused
command raises and leaves the session unchanged with no pending event.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol
from uuid import uuid4

from eventsourcing.domain import BaseAggregate

from domain import events as ev
from domain.errors import (
    IllegalTransition,
    InvalidField,
    NotNow,
    UnknownKernel,
    convert,
    require_text,
)
from domain.image_ref import canonical, canonical_or_same
from domain.limits import MAX_DETAIL, MAX_REASON, Labels, SessionName, clip
from domain.reasons import Reason, exit_reason, info, reason_of, scheduler_error
from domain.status import (
    FAILED,
    PRE_RUNNING,
    TERMINAL,
    Kernel,
    KernelStatus,
    check_transition,
)
from domain.subjects import check_token

S = KernelStatus

# How far a live kernel has got: a session is only as far along as its slowest kernel.
_PROGRESS = [S.PENDING, S.SCHEDULED, S.PREPARING, S.PULLING, S.PREPARED, S.CREATING, S.RUNNING]
# Not yet known to have its image on its agent: no container is asked for while one is.
_WAITING_FOR_IMAGE = frozenset({S.PENDING, S.SCHEDULED, S.PREPARING, S.PULLING})


_RESOURCES = "{cpu: cores > 0, mem: bytes > 0}"
_WHOLE_ID = re.compile(r"^[0-9a-f]{32}\Z")
_NAME = "1-63 letters, digits, '_', '.' or '-', starting with a letter or digit"
_LABELS = "at most 32 key=value labels: keys 1-63 of letters, digits, '_', '.', '/' or '-'"
_LABELS += ", values at most 63 of letters, digits, '_', '.' or '-'"


# Names a kernel's environment must not set: the cluster info Hoist gives every kernel.
CLUSTER_ENV_PREFIX = "HOIST_"
# Paths the container engine itself mounts into every container: no volume may replace them.
_KERNEL_PATHS = ("/proc", "/sys", "/dev")


def sent_back(kernel: Kernel) -> bool:
    """A create found the kernel's image gone from its agent (it went back to PREPARING)."""
    return any(reason_of(c.status_info) == Reason.IMAGE_MISSING for c in kernel.status_history)


def hoist_env(
    session_id: str, kernel_id: str, cluster_mode: str, hostnames: Mapping[str, str]
) -> dict[str, str]:
    """The ``HOIST_*`` variables a kernel gets (``hostnames``: kernel id -> main1, sub1, ...
    in enqueue order); `hoist describe` shows them as the kernel sees them."""
    name = hostnames[kernel_id]
    role = "main" if name.startswith("main") else "sub"
    return {
        "HOIST_SESSION_ID": session_id,
        "HOIST_KERNEL_ID": kernel_id,
        "HOIST_CLUSTER_MODE": cluster_mode,
        "HOIST_CLUSTER_ROLE": role,
        "HOIST_CLUSTER_IDX": name.removeprefix(role),
        "HOIST_CLUSTER_HOST": name,
        "HOIST_CLUSTER_SIZE": str(len(hostnames)),
        "HOIST_CLUSTER_HOSTS": ",".join(hostnames.values()),
    }


def hostname_of(index: int) -> str:
    """The name of a session's kernel number ``index`` (enqueue order, from 0) in its cluster:
    ``main1``, then ``sub1``, ``sub2``, ... (Backend.AI's naming)."""
    return "main1" if index == 0 else f"sub{index}"


class ProcessEnd(Protocol):
    """How a kernel's process ended (an agent's KernelExited fact, or a sync's report)."""

    @property
    def exit_code(self) -> int: ...
    @property
    def oom_killed(self) -> bool: ...
    @property
    def ran_s(self) -> float: ...


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
        session_type: ev.SessionType
        cluster_mode: ev.ClusterMode
        spec: ev.KernelSpec  # what every kernel runs
        name: str | None  # unique among its owner's sessions that have not ended
        labels: dict[str, str]
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
        session_type: ev.SessionType = "interactive",
        cluster_mode: ev.ClusterMode = "multi-node",
        spec: ev.KernelSpec | Mapping[str, object] | None = None,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Session:
        if isinstance(cluster_size, bool) or not isinstance(cluster_size, int) or cluster_size < 1:
            raise InvalidField("cluster_size", f"must be an integer >= 1, got {cluster_size!r}")
        if session_type not in ("interactive", "batch"):
            raise InvalidField(
                "session_type", f"must be 'interactive' or 'batch', got {session_type!r}"
            )
        if cluster_mode not in ("single-node", "multi-node"):
            raise InvalidField(
                "cluster_mode", f"must be 'single-node' or 'multi-node', got {cluster_mode!r}"
            )
        spec = convert(
            spec or {}, ev.KernelSpec, "spec", "{command?, env?, workdir?, ports?, mounts?}"
        )
        if session_type == "batch" and spec.command is None:
            raise InvalidField(
                "command", "a batch session runs a command to its end: give one (argv list)"
            )
        if len({m.path for m in spec.mounts}) != len(spec.mounts):
            raise InvalidField("mounts", "two mounts at one path: give each its own path")
        for m in spec.mounts:
            if any(m.path == p or m.path.startswith(f"{p}/") for p in _KERNEL_PATHS):
                raise InvalidField(
                    "mounts",
                    f"{m.path}: the kernel's own {', '.join(_KERNEL_PATHS)} cannot be a volume",
                )
        if len(set(spec.ports)) != len(spec.ports):
            raise InvalidField("ports", f"a port is listed twice: {list(spec.ports)}")
        if reserved := sorted(k for k in spec.env if k.startswith(CLUSTER_ENV_PREFIX)):
            raise InvalidField(
                "env", f"{', '.join(reserved)}: names starting {CLUSTER_ENV_PREFIX} are Hoist's own"
            )
        if request_id is not None:
            require_text(request_id, "request_id")
        if name is not None:
            name = convert(name, SessionName, "name", _NAME)
            if _WHOLE_ID.match(name):  # it would read as a session's id wherever one is taken
                raise InvalidField("name", f"{name!r} looks like a session id: choose another")
        labels = convert(labels or {}, Labels, "labels", _LABELS)
        return cls._create(
            ev.SessionEnqueued,
            id=check_token(session_id or uuid4().hex, "session_id"),
            owner=require_text(owner, "owner"),
            image=canonical(image, "image"),
            resources=convert(resources, ev.Resources, "resources", _RESOURCES),
            cluster_size=cluster_size,
            resource_group=check_token(resource_group, "resource_group"),
            kernel_ids=[uuid4().hex for _ in range(cluster_size)],
            status_info="enqueued",
            request_id=request_id,
            session_type=session_type,
            cluster_mode=cluster_mode,
            spec=spec,
            name=name,
            labels=labels,
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

    @property
    def main_kernel(self) -> Kernel:
        return next(iter(self.kernels.values()))

    def hostname(self, kernel_id: str) -> str:
        """The kernel's name in its cluster: the first kernel is ``main1``, the others ``sub1``,
        ``sub2``, ... in enqueue order (Backend.AI's naming)."""
        return self._hostnames()[kernel_id]

    def _hostnames(self) -> dict[str, str]:
        return {kid: hostname_of(i) for i, kid in enumerate(self.kernels)}

    def cluster_env(self, kernel_id: str) -> dict[str, str]:
        """What a kernel is told about its cluster, besides the session's own env."""
        return {
            **self.spec.env,
            **hoist_env(self.id, kernel_id, self.cluster_mode, self._hostnames()),
        }

    def extra_hosts(self, kernel_id: str, addresses: Mapping[str, str]) -> dict[str, str]:
        """Hostname -> address of the kernels on other agents than this one's (multi-node);
        ``addresses`` maps agent id -> the address its published ports are reachable at."""
        here = self.kernel(kernel_id).agent_id
        names = self._hostnames()
        return {
            names[k.kernel_id]: addresses[k.agent_id]
            for k in self.kernels.values()
            if k.agent_id and k.agent_id != here and k.agent_id in addresses
        }

    # --- state changes: what each event does to the session (Event.apply calls WHEN) --------
    # A stored event may be a forgery: each checks the kernels and transitions it names before
    # it changes anything, so a poison event leaves the session as it was (and is quarantined).

    def _on_enqueued(self, e: ev.SessionEnqueued) -> None:
        self.owner = e.owner
        self.image = canonical_or_same(e.image)  # an older event may hold a short form
        self.resources = e.resources
        self.resource_group = e.resource_group
        self.request_id = e.request_id
        self.session_type = e.session_type
        self.cluster_mode = e.cluster_mode
        self.spec = e.spec
        self.name = e.name
        self.labels = dict(e.labels)
        self.kernels = {}
        for kernel_id in e.kernel_ids:
            kernel = Kernel(kernel_id=kernel_id)
            kernel.move_to(S.PENDING, e.status_info, e.timestamp)
            self.kernels[kernel_id] = kernel

    def _on_scheduling_failed(self, e: ev.SessionSchedulingFailed) -> None:
        for kernel in self.kernels.values():
            kernel.move_to(S.PENDING, e.status_info, e.timestamp)

    def _on_scheduled(self, e: ev.SessionScheduled) -> None:
        # Check every kernel before changing any.
        for kernel_id in e.placements:
            if kernel_id not in self.kernels:
                raise KeyError(f"session {self.id} has no kernel {kernel_id}")
            check_transition(self.kernels[kernel_id].status, S.SCHEDULED, kernel_id)
        for kernel_id, agent_id in e.placements.items():
            kernel = self.kernels[kernel_id]
            kernel.agent_id = agent_id
            kernel.move_to(S.SCHEDULED, e.status_info, e.timestamp)

    def _on_kernel_event(self, e: ev.KernelEvent) -> Kernel:
        """One kernel moves to the event's status (returned, for the events' other fields)."""
        kernel = self.kernels.get(e.kernel_id)
        if kernel is None:
            raise KeyError(f"session {self.id} has no kernel {e.kernel_id}")
        # Commands check this too; checked again here so a stored illegal move is refused.
        check_transition(kernel.status, e.status, e.kernel_id)
        kernel.move_to(e.status, e.status_info, e.timestamp)
        return kernel

    def _on_kernel_pulling(self, e: ev.KernelPulling) -> None:
        self._on_kernel_event(e).pull_task_id = e.task_id

    def _on_kernel_created(self, e: ev.KernelCreated) -> None:
        kernel = self._on_kernel_event(e)
        kernel.container_id = e.container_id
        kernel.ports = tuple(e.ports)

    def _on_kernel_terminated(self, e: ev.KernelTerminated) -> None:
        kernel = self._on_kernel_event(e)
        if e.exit_code is not None:
            kernel.exit_code, kernel.ran_s = e.exit_code, e.ran_s

    def _on_note(self, e: ev.Event) -> None:
        """A note in the session's log (HookSkipped): nothing of the session changes."""

    WHEN: ClassVar[dict[type, Callable[[Any, Any], object]]] = {  # event class -> state change
        ev.SessionEnqueued: _on_enqueued,
        ev.SessionSchedulingFailed: _on_scheduling_failed,
        ev.SessionScheduled: _on_scheduled,
        ev.HookSkipped: _on_note,
        **dict.fromkeys(ev.KERNEL_EVENTS, _on_kernel_event),
        ev.KernelPulling: _on_kernel_pulling,
        ev.KernelCreated: _on_kernel_created,
        ev.KernelTerminated: _on_kernel_terminated,
    }

    # --- commands --------------------------------------------------------------------------

    def hook_skipped(self, hook: str, phase: ev.HookPhase, reason: str) -> None:
        """Note in the session's log that lifecycle hook ``hook`` failed at ``phase`` and the
        manager went on without it (services.manager.hooks)."""
        self.trigger_event(
            ev.HookSkipped,
            hook=clip(require_text(hook, "hook"), 128),
            phase=phase,
            reason=clip(require_text(reason, "reason"), MAX_REASON),
        )

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

    def scheduler_failed(self, error: Exception) -> None:
        """The scheduler raised ``error`` while placing this session: it stays PENDING with
        ``scheduler-error: <ExceptionType: text>`` as its reason (the same error again records
        nothing).  Nothing either once it is not PENDING (placed or ended meanwhile: the error
        is not why it waits)."""
        if any(k.status != S.PENDING for k in self.kernels.values()):
            return
        self.scheduling_failed(scheduler_error(error))

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

    def pull_asked_again(self, agent_id: str, kernel_ids: Collection[str], task_id: str) -> None:
        """The agent pulls the image again as ``task_id`` (it restarted and forgot the pull its
        kernels waited for): each of ``kernel_ids`` still PULLING there waits for the new task,
        recorded (KernelPulling again) so whoever follows the pull follows the new one."""
        why = info(
            Reason.IMAGE_PULLING,
            f"asked again of {agent_id} as task {task_id} (the agent lost the first pull)",
        )
        for kernel_id in kernel_ids:
            kernel = self.kernels.get(kernel_id)
            if (
                kernel is not None
                and kernel.status is S.PULLING
                and kernel.agent_id == agent_id
                and kernel.pull_task_id != task_id
            ):
                self.mark_pulling(kernel_id, task_id, why)

    def mark_prepared(self, kernel_id: str, status_info: str = "prepared") -> None:
        self._move(ev.KernelPrepared, kernel_id, status_info)

    def mark_creating(self, kernel_id: str, status_info: str = "creating") -> None:
        self._move(ev.KernelCreating, kernel_id, status_info)

    def mark_created(
        self,
        kernel_id: str,
        container_id: str,
        status_info: str = "running",
        ports: Collection[ev.PublishedPort] = (),
    ) -> None:
        self._move(
            ev.KernelCreated,
            kernel_id,
            status_info,
            container_id=require_text(container_id, "container_id"),
            ports=list(ports),
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

    def mark_terminated(
        self,
        kernel_id: str,
        status_info: str,
        detail: str = "",
        exit_code: int | None = None,
        ran_s: float | None = None,
    ) -> None:
        ended = {} if exit_code is None else {"exit_code": exit_code, "ran_s": ran_s}
        self._move(ev.KernelTerminated, kernel_id, status_info, detail=detail, **ended)

    # --- decisions: what a request or an observed fact means for the kernels ----------------
    # Each looks at the kernels as they are now and records what follows, so the manager's
    # unit of work can call it again on a reloaded session after a conflict.

    def destroy(self, forced: bool = False) -> None:
        """The owner destroys the session: kernels not running yet are CANCELLED, running ones
        TERMINATING (TERMINATED once their agent removed the container).  ``forced`` records
        the stopping ones TERMINATED at once; the manager removes their containers best effort.
        """
        for k in self.kernels.values():
            if k.status in PRE_RUNNING:
                self.cancel(k.kernel_id, Reason.USER_REQUESTED)
            elif k.status is S.RUNNING:
                self.mark_terminating(k.kernel_id, Reason.USER_REQUESTED)
            if forced and k.status is S.TERMINATING:
                self.mark_terminated(
                    k.kernel_id, Reason.FORCE_TERMINATED, "forced: not confirmed by the agent"
                )

    def start_preparing(self, holding: Collection[str] = ()) -> None:
        """The placed kernels' images: SCHEDULED kernels on an agent of ``holding`` (the log
        shows the image there) are PREPARED at once, with no check-and-pull asked; the others
        go PREPARING, and check-and-pull is about to be asked of their agents.  The scheduler
        records this with SessionScheduled, in the batch it stores anyway; the reactor does it
        for a kernel still SCHEDULED, from a log written before.  A create that finds the image
        gone after all sends its kernel back to PREPARING (``image_missing``)."""
        for k in self.kernels.values():
            if k.status is not S.SCHEDULED:
                continue
            if k.agent_id in holding:
                detail = f"{k.agent_id} holds it, by the event log"
                self.mark_prepared(k.kernel_id, info(Reason.IMAGE_PRESENT, detail))
            else:
                detail = f"asking {k.agent_id} for the image"
                self.mark_preparing(k.kernel_id, info(Reason.PREPARING, detail))

    def force_cancel(self, kernel_id: str, why: str | None = None) -> None:
        """A superadmin gives up a kernel that is not running yet (e.g. PULLING)."""
        k = self.kernel(kernel_id)
        if k.status not in PRE_RUNNING:
            raise NotNow(
                f"kernel_id: kernel {kernel_id} is {k.status} ({k.status_info}), only a kernel"
                " not running yet can be force-cancelled; destroy the session instead"
            )
        self.cancel(kernel_id, info(Reason.FORCE_CANCELLED, why or "by a superadmin"))

    def agents_lost(self, lost: Mapping[str, str]) -> None:
        """``lost`` maps agent id -> its status_info: kernels there that are not running yet
        are CANCELLED ``agent-lost`` (a running one is given up later: ``given_up_on``)."""
        for k in self.kernels.values():
            if k.status in PRE_RUNNING and k.agent_id is not None and k.agent_id in lost:
                detail = f"{k.agent_id} ({lost[k.agent_id]})"
                self.cancel(k.kernel_id, info(Reason.AGENT_LOST, detail))

    def given_up_on(self, agent_id: str, agent_info: str, grace_s: float) -> None:
        """The agent stayed lost ``grace_s`` after AgentLost: its RUNNING kernels are
        TERMINATED ``agent-lost``, which frees their room."""
        for k in self.kernels.values():
            if k.status is S.RUNNING and k.agent_id == agent_id:
                self.mark_terminated(
                    k.kernel_id,
                    info(Reason.AGENT_LOST, f"{agent_id} ({agent_info})"),
                    f"no heartbeat for {grace_s:g}s after it was marked lost: the kernel is"
                    " given up",
                )

    def running_since(self) -> datetime | None:
        """When the session became RUNNING (its last kernel did), or None if it is not."""
        if self.status is not S.RUNNING:
            return None
        return max(
            next(c.at for c in reversed(k.status_history) if c.status is S.RUNNING)
            for k in self.kernels.values()
            if k.status is S.RUNNING
        )

    def lifetime_exceeded(self, limit_s: float) -> None:
        """An interactive session ran longer than its owner's ``max_lifetime_s``: its running
        kernels are TERMINATING ``lifetime-exceeded`` (the others CANCELLED)."""
        self._end_running(info(Reason.LIFETIME_EXCEEDED, f"ran longer than {limit_s:g}s"))

    def idle_timed_out(self, limit_s: float) -> None:
        """Nobody used an interactive session through Hoist for its owner's
        ``idle_timeout_s``: as ``lifetime_exceeded``, ``idle-timeout``."""
        self._end_running(info(Reason.IDLE_TIMEOUT, f"not used for {limit_s:g}s"))

    def _end_running(self, why: str) -> None:
        for k in self.kernels.values():
            if k.status in PRE_RUNNING:
                self.cancel(k.kernel_id, why)
            elif k.status is S.RUNNING:
                self.mark_terminating(k.kernel_id, why)

    def wind_down(self) -> None:
        """A kernel ended in ERROR or CANCELLED: the others stop too (``sibling-failed``)."""
        failed = next((k for k in self.kernels.values() if k.status in FAILED), None)
        if failed is None:
            return
        detail = f"kernel {failed.kernel_id} {failed.status}: {failed.status_info}"
        for k in self.kernels.values():
            if k.status in PRE_RUNNING:
                self.cancel(k.kernel_id, info(Reason.SIBLING_FAILED, detail))
            elif k.status is S.RUNNING:
                self.mark_terminating(k.kernel_id, info(Reason.SIBLING_FAILED, detail))

    def image_checked(self, agent_id: str, task_id: str | None, error: str | None = None) -> None:
        """The agent answered check-and-pull for this session's image: its kernels still
        waiting for the answer go PULLING (``task_id`` of the background pull), PREPARED (the
        image is there), or CANCELLED when the agent refused (``error``)."""
        for k in self.kernels.values():
            if k.agent_id != agent_id or k.status not in (S.SCHEDULED, S.PREPARING):
                continue
            if error is not None:
                self.cancel(k.kernel_id, info(Reason.CHECK_AND_PULL_FAILED, error))
            elif task_id:
                self.mark_pulling(k.kernel_id, task_id, Reason.IMAGE_PULLING)
            else:
                self.mark_prepared(k.kernel_id, info(Reason.IMAGE_PRESENT, f"{agent_id} holds it"))

    def image_ready(self, agent_id: str, status_info: str = Reason.IMAGE_PULLED) -> None:
        """The agent holds the image now: its PULLING kernels are PREPARED."""
        for k in self.kernels.values():
            if k.status is S.PULLING and k.agent_id == agent_id:
                self.mark_prepared(k.kernel_id, status_info)

    def pull_ended(
        self, agent_id: str, status_info: str, kernel_ids: Collection[str] | None = None
    ) -> None:
        """The pull the agent's PULLING kernels wait for failed or was given up
        (``image-pull-failed``, ``pull-timeout``, ``pull-stalled``): those kernels (all of them
        on the agent, or the ``kernel_ids`` waiting for that pull) are CANCELLED, which frees
        the agent's room."""
        for k in self.kernels.values():
            if k.status is not S.PULLING or k.agent_id != agent_id:
                continue
            if kernel_ids is None or k.kernel_id in kernel_ids:
                self.cancel(k.kernel_id, status_info)

    def start_creating(self) -> None:
        """No kernel waits for its image any more: the PREPARED ones are asked for their
        containers (CREATING).  Its siblings may be CREATING or, after one went back for its
        image (``image_missing``), RUNNING already.  Nothing once a sibling failed or was
        cancelled: the session winds down (``wind_down``), no container is asked for."""
        kernels = self.kernels.values()
        if not any(k.status in _WAITING_FOR_IMAGE or k.status in FAILED for k in kernels):
            for k in kernels:
                if k.status is S.PREPARED:
                    self.mark_creating(k.kernel_id, Reason.CREATING)

    def image_missing(self, kernel_id: str) -> None:
        """The agent answered create-kernel that it does not hold the image (placed where the
        log showed it, then removed outside Hoist or by its GC): the kernel goes back to
        PREPARING, and check-and-pull is asked (it may pull).  Once: a kernel sent back before
        (its agent said it held the image, then had none at create, twice) fails to start
        instead of going round for ever.  Nothing when it is no longer CREATING."""
        kernel = self.kernel(kernel_id)
        if kernel.status is not S.CREATING:
            return
        detail = f"{kernel.agent_id} had no {self.image} at the create"
        if sent_back(kernel):
            why = info(Reason.FAILED_TO_START, f"{Reason.IMAGE_MISSING} again: {detail}")
            self.creation_failed(kernel_id, detail, why)
        else:
            why = info(Reason.IMAGE_MISSING, f"{detail}; checking again, pulling it if need be")
            self.mark_preparing(kernel_id, why)

    def created(
        self,
        kernel_id: str,
        *,
        container_id: str | None = None,
        error: str | None = None,
        detail: str = "",
        ports: Collection[ev.PublishedPort] = (),
    ) -> None:
        """The agent answered create-kernel: RUNNING in ``container_id``, or ERROR
        ``failed-to-start: <error>`` (``detail``: the runtime's own words).  A kernel no longer
        CREATING (cancelled meanwhile) is left alone: the reactors remove what the create made."""
        if self.kernel(kernel_id).status is not S.CREATING:
            return
        if container_id is not None:
            self.mark_created(kernel_id, container_id, Reason.RUNNING, ports)
        elif error is not None:
            self.creation_failed(kernel_id, detail or error, info(Reason.FAILED_TO_START, error))

    def container_removed(self, kernel_id: str, had_container: bool) -> None:
        """The agent removed a TERMINATING kernel's container (or found none)."""
        k = self.kernel(kernel_id)
        if k.status is S.TERMINATING:
            detail = "container removed" if had_container else "no container was left"
            self.mark_terminated(kernel_id, k.status_info, detail)

    def containers_gone(
        self,
        agent_id: str,
        kernel_ids: Collection[str],
        exited: Collection[str],
        exits: Mapping[str, ProcessEnd] | None = None,
    ) -> None:
        """Agent resource sync found no live container for these kernels: RUNNING ones are
        TERMINATED as their process ended (``exits``: with its exit code, see
        ``process_ended``), ``container-exited`` (ended, code unknown) or ``container-gone``;
        TERMINATING ones TERMINATED as their removal would have."""
        exits = exits or {}
        for kid in kernel_ids:
            k = self.kernels.get(kid)
            if k is None or k.agent_id != agent_id:
                continue
            if k.status is S.RUNNING and kid in exits:
                self.process_ended(agent_id, kid, exits[kid])
            elif k.status is S.RUNNING:
                if kid in exited:
                    why = info(Reason.CONTAINER_EXITED, f"its process ended on agent {agent_id}")
                else:
                    why = info(Reason.CONTAINER_GONE, f"not found on agent {agent_id}")
                self.mark_terminated(kid, why, "repaired by agent resource sync")
            elif k.status is S.TERMINATING:
                self.mark_terminated(kid, k.status_info, "no container was left")

    def process_ended(self, agent_id: str, kernel_id: str, end: ProcessEnd) -> None:
        """A kernel's process ended on its agent (its KernelExited fact, or a sync's report):
        a RUNNING kernel there is TERMINATED with the exit code and how long it ran.  The main
        kernel of a batch session ends the session: ``succeeded`` on exit code 0, and its
        other kernels stop (``session-ended``).  Anything else (an unknown kernel, another
        agent, a kernel already ending) is a late or repeated report: nothing to record."""
        k = self.kernels.get(kernel_id)
        if k is None or k.agent_id != agent_id or k.status is not S.RUNNING:
            return
        main = k is self.main_kernel
        why = exit_reason(end.exit_code, end.oom_killed)
        if self.session_type == "batch" and main and end.exit_code == 0 and not end.oom_killed:
            why = str(Reason.SUCCEEDED)
        self.mark_terminated(
            kernel_id,
            why,
            f"exit code {end.exit_code} after {end.ran_s:.3f}s on agent {agent_id}",
            exit_code=end.exit_code,
            ran_s=end.ran_s,
        )
        self.end_batch()

    def end_batch(self) -> None:
        """A batch session ends with its main kernel: once that is TERMINATED (its command
        ended, its container went, its agent was lost), the other kernels stop
        (``session-ended: <the main kernel's reason>``).  A main kernel that failed or was
        cancelled winds the others down instead (``wind_down``)."""
        main = self.main_kernel
        if self.session_type != "batch" or main.status is not S.TERMINATED:
            return
        why = info(Reason.SESSION_ENDED, main.status_info)
        for other in self.kernels.values():
            if other.status in PRE_RUNNING:
                self.cancel(other.kernel_id, why)
            elif other.status is S.RUNNING:
                self.mark_terminating(other.kernel_id, why)

    def _move(
        self,
        event_class: type[ev.KernelEvent],
        kernel_id: str,
        status_info: str,
        **fields: object,
    ) -> None:
        kernel = self.kernel(kernel_id)
        check_transition(kernel.status, event_class.status, kernel_id)
        if "detail" in fields:  # often a runtime's error text: cut to what readers accept
            fields["detail"] = clip(str(fields["detail"]), MAX_DETAIL)
        self.trigger_event(
            event_class,
            kernel_id=kernel_id,
            status_info=clip(require_text(status_info, "status_info"), MAX_REASON),
            **fields,
        )
