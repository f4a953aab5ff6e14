"""Lifecycle hooks: what a plugin sees of a session, and what it may answer.

A hook is an object (found through the Python entry point group ``hoist.hooks``, or named
with `hoist manager --hook MODULE:ATTR`) with any of these methods, plain or ``async``:

    on_enqueue(session: SessionInfo) -> str | None   # a text refuses the create, with it
    on_schedule(session: SessionInfo) -> None        # its kernels were placed
    on_end(session: SessionInfo) -> None             # every kernel of it ended

``on_enqueue`` runs before anything is recorded: the user sees its refusal as the create's
error (``forbidden: refused by hook NAME: TEXT``).  The others run after the fact, on the
leading manager.  A hook that raises or outlives its time limit is skipped: the manager goes on,
and the session's log says so (HookSkipped).  docs/manager.md shows how to write one.
"""

from __future__ import annotations

import msgspec

from domain.session import Session


class SessionInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A session as a hook sees it (a copy: a hook changes nothing by changing it)."""

    session_id: str
    owner: str
    image: str
    resource_group: str
    cluster_size: int
    session_type: str
    cluster_mode: str
    name: str | None
    labels: dict[str, str]
    command: list[str] | None
    status: str
    status_info: str
    agents: list[str]  # where its kernels are placed (none before the schedule)


def session_info(session: Session) -> SessionInfo:
    return SessionInfo(
        session_id=session.id,
        owner=session.owner,
        image=session.image,
        resource_group=session.resource_group,
        cluster_size=len(session.kernels),
        session_type=session.session_type,
        cluster_mode=session.cluster_mode,
        name=session.name,
        labels=dict(session.labels),
        command=None if session.spec.command is None else list(session.spec.command),
        status=session.status.value,
        status_info=session.status_info,
        agents=sorted({k.agent_id for k in session.kernels.values() if k.agent_id}),
    )
