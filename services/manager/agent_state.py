"""One agent as the manager's view holds it: its aggregate, the room its kernels hold, its pulls."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from domain.agent import Agent
from domain.liveness import AgentLiveness, is_lost
from eventstore.repository import loaded_seq


@dataclass
class AgentState:
    """One agent: its aggregate and the room its kernels hold."""

    agent: Agent
    reserved_cpu: float = 0.0
    reserved_mem: int = 0
    reserved_slots: dict[str, float] = field(default_factory=dict)  # e.g. gpu held
    # image -> (task id, reason) of its last failed pull, until a new pull starts or succeeds
    failed_pulls: dict[str, tuple[str, str]] = field(default_factory=dict)
    # image -> task id of its last finished pull (what a kernel sent back for its image waits
    # for: the image in ``agent.images`` may be the stale one it was sent back from)
    pulled: dict[str, str] = field(default_factory=dict)
    registered_seq: int = 0  # stream sequence of its latest (re)registration
    liveness: AgentLiveness | None = None  # its losses (the manager's subject)

    @property
    def live(self) -> bool:
        lost_seq = 0 if self.liveness is None else loaded_seq(self.liveness)
        return not is_lost(self.registered_seq, lost_seq)

    @property
    def status_info(self) -> str:
        """Why it is lost, or how it last registered."""
        if not self.live and self.liveness is not None:
            return self.liveness.status_info
        return self.agent.status_info

    @property
    def lost_at(self) -> datetime | None:
        return None if self.live or self.liveness is None else self.liveness.lost_at
