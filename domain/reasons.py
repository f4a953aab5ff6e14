"""Every reason a kernel's status changes: the first word of its ``status_info``.

A status_info is ``<reason>`` or ``<reason>: <detail>`` (``info``); the reason is one of
``Reason`` and tells a user what happened in words a program can match, the detail is for the
person reading it (an agent's id, a runtime's error).  ``TEXT`` says what each reason means; the
table in docs/manager.md is made from it (tests/domain/test_reasons.py keeps them equal).
"""

from __future__ import annotations

from enum import StrEnum

from domain.limits import MAX_REASON, clip


class Reason(StrEnum):
    # The way to RUNNING.
    ENQUEUED = "enqueued"
    SCHEDULED = "scheduled"
    PREPARING = "preparing"
    IMAGE_PRESENT = "image-present"
    IMAGE_PULLING = "image-pulling"
    IMAGE_PULLED = "image-pulled"
    IMAGE_MISSING = "image-missing"
    CREATING = "creating"
    RUNNING = "running"
    # Why a session waits (the kernels stay PENDING).
    PREDICATE_CHECKS_FAILED = "predicate-checks-failed"
    NO_AVAILABLE_INSTANCES = "no-available-instances"
    SCHEDULER_ERROR = "scheduler-error"
    # Why a kernel never ran.
    CHECK_AND_PULL_FAILED = "check-and-pull-failed"
    IMAGE_PULL_FAILED = "image-pull-failed"
    PULL_TIMEOUT = "pull-timeout"
    PULL_STALLED = "pull-stalled"
    FAILED_TO_START = "failed-to-start"
    # Why a kernel stopped (or never ran).
    USER_REQUESTED = "user-requested"
    FORCE_TERMINATED = "force-terminated"
    FORCE_CANCELLED = "force-cancelled"
    SIBLING_FAILED = "sibling-failed"
    AGENT_LOST = "agent-lost"
    CONTAINER_GONE = "container-gone"
    CONTAINER_EXITED = "container-exited"
    LIFETIME_EXCEEDED = "lifetime-exceeded"
    IDLE_TIMEOUT = "idle-timeout"
    # How a kernel's process ended (its KernelTerminated carries the exit code).
    SUCCEEDED = "succeeded"
    EXITED = "exited"
    KILLED = "killed"
    OOM_KILLED = "oom-killed"
    SESSION_ENDED = "session-ended"
    # Why an agent is lost (its AgentLost event).
    HEARTBEAT_TIMEOUT = "heartbeat-timeout"


TEXT: dict[Reason, str] = {
    Reason.ENQUEUED: "the session was accepted and waits for the scheduler",
    Reason.SCHEDULED: "the scheduler placed the kernel on an agent",
    Reason.PREPARING: "the agent is asked whether it holds the image (check-and-pull)",
    Reason.IMAGE_PRESENT: "the agent already holds the image (it said so at check-and-pull, or"
    " the event log says so and the scheduler asked nothing)",
    Reason.IMAGE_PULLING: "the agent pulls the image; the kernel occupies no user quota meanwhile",
    Reason.IMAGE_PULLED: "the agent's pull of the image finished",
    Reason.IMAGE_MISSING: "the create found the image gone from the agent: it is checked and"
    " pulled again",
    Reason.CREATING: "the agent is asked to create the container",
    Reason.RUNNING: "the container runs",
    Reason.PREDICATE_CHECKS_FAILED: "a limit refuses the session (too large, too many sessions)",
    Reason.NO_AVAILABLE_INSTANCES: "no live agent of the resource group has room now",
    Reason.SCHEDULER_ERROR: "the scheduler failed while placing the session (the detail is the"
    " error); it tries again at its next pass",
    Reason.CHECK_AND_PULL_FAILED: "the agent refused check-and-pull (e.g. a bad image name)",
    Reason.IMAGE_PULL_FAILED: "the agent's pull of the image failed (the detail says why)",
    Reason.PULL_TIMEOUT: "the image was not pulled within the pull timeout",
    Reason.PULL_STALLED: "the pull made no progress for the stall timeout",
    Reason.FAILED_TO_START: "the agent could not create or start the container",
    Reason.USER_REQUESTED: "the session's owner destroyed it",
    Reason.FORCE_TERMINATED: "destroyed with forced: recorded at once, the container removed"
    " best effort",
    Reason.FORCE_CANCELLED: "a superadmin cancelled the kernel before it ran",
    Reason.SIBLING_FAILED: "another kernel of the session failed, so the session winds down",
    Reason.AGENT_LOST: "the kernel's agent stopped sending heartbeats",
    Reason.CONTAINER_GONE: "the agent has no container for a running kernel",
    Reason.CONTAINER_EXITED: "the kernel's process ended on its own",
    Reason.LIFETIME_EXCEEDED: "the interactive session ran longer than its owner's resource"
    " policy allows (max_lifetime_s)",
    Reason.IDLE_TIMEOUT: "nobody used the interactive session through Hoist for longer than its"
    " owner's resource policy allows (idle_timeout_s)",
    Reason.SUCCEEDED: "a batch session's main kernel ran its command to the end with exit code 0",
    Reason.EXITED: "the kernel's process ended with this exit code",
    Reason.KILLED: "the kernel's process was killed by this signal (from outside, or at destroy)",
    Reason.OOM_KILLED: "the kernel's process was killed for using more memory than its limit",
    Reason.SESSION_ENDED: "the batch session's main kernel ended, so its other kernels stop",
    Reason.HEARTBEAT_TIMEOUT: "no heartbeat from the agent within the deadline",
}


def info(reason: Reason, detail: object = "") -> str:
    """The status_info for ``reason`` with an optional ``detail``: ``reason: detail``."""
    detail = str(detail)
    return f"{reason}: {detail}" if detail else str(reason)


def exit_reason(exit_code: int, oom_killed: bool = False) -> str:
    """How a process ended, in words: ``oom-killed``, ``killed: signal 9`` (an exit code above
    128 is 128 + the signal, as shells and Docker report it), or ``exited: code 3``."""
    if oom_killed:
        return str(Reason.OOM_KILLED)
    if 128 < exit_code < 128 + 65:
        return info(Reason.KILLED, f"signal {exit_code - 128}")
    return info(Reason.EXITED, f"code {exit_code}")


def scheduler_error(error: BaseException) -> str:
    """The status_info of a session the scheduler raised ``error`` on, on one line and within
    the length an event takes: ``scheduler-error: KeyError: 'a1'``."""
    text = " ".join(str(error).split())
    detail = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return clip(info(Reason.SCHEDULER_ERROR, detail), MAX_REASON)


def reason_of(status_info: str) -> str:
    """The reason a status_info starts with (the text before the first ': ')."""
    return status_info.split(": ", 1)[0]
