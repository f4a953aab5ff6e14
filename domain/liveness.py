"""An agent's liveness as the manager records it: the AgentLiveness aggregate on
``hoist.events.liveness.<agent id>``, a subject only the manager writes (domain.subjects).

It holds the agent's losses only; whether the agent is lost *now* depends on the order of
facts on two subjects: it is lost when its latest AgentLost is later in the stream than its
latest (re)registration (``is_lost``).  An agent that is back re-registers on its own subject.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from eventsourcing.domain import BaseAggregate

from domain import events as ev
from domain.errors import require_text
from domain.limits import MAX_REASON, clip
from domain.subjects import LIVENESS, check_token


@ev.started_by(ev.AgentLost)  # its first loss creates it (the event names no topic)
class AgentLiveness(BaseAggregate[str]):
    KIND = LIVENESS

    if TYPE_CHECKING:  # set by the events
        losses: int
        status_info: str  # why it was last lost, e.g. "heartbeat-timeout: no heartbeat for 15s"
        lost_at: datetime

    @staticmethod
    def mark_lost(existing: AgentLiveness | None, agent_id: str, status_info: str) -> AgentLiveness:
        """Record one more loss of ``agent_id`` (``existing``: its liveness so far, if any)."""
        status_info = clip(require_text(status_info, "status_info"), MAX_REASON)
        if existing is not None:
            existing.trigger_event(ev.AgentLost, status_info=status_info)
            return existing
        event = ev.AgentLost(
            originator_id=check_token(agent_id, "agent_id"),
            originator_version=1,
            timestamp=ev.AgentLost.create_timestamp(),
            status_info=status_info,
        )
        liveness: AgentLiveness = event.mutate(None)
        liveness.pending_events.append(event)
        return liveness

    # --- state change: what AgentLost does (Event.apply calls WHEN) -------------------------

    def _on_lost(self, e: ev.AgentLost) -> None:
        self.losses = getattr(self, "losses", 0) + 1
        self.status_info = e.status_info
        self.lost_at = e.timestamp

    WHEN = {ev.AgentLost: _on_lost}  # event class -> state change, for Event.apply


def is_lost(registered_seq: int, lost_seq: int) -> bool:
    """The rule every reader applies: lost iff the latest AgentLost (stream sequence
    ``lost_seq``, 0 if none) came after the latest (re)registration (``registered_seq``)."""
    return lost_seq > registered_seq
