"""The streams that session logs and exec opened (on agents), and whose session each reads.

Two parts need it: the command server, which lets a user read only streams opened for their own
sessions, and the idle timeout, which counts a stream read as a use of its session.  Kept per
owner, at most ``PER_OWNER`` each (the oldest forgotten first), so no user opening many streams
can push another user's out.  In memory: after a manager restart a stream is opened again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

PER_OWNER = 1_000  # the agent keeps at most 8 a session and 128 in all (agent.streams)


class Opened(NamedTuple):
    owner: str
    session_id: str


class OpenStreams:
    def __init__(self, per_owner: int = PER_OWNER) -> None:
        self.per_owner = per_owner
        self._by_owner: dict[str, OrderedDict[tuple[str, str], str]] = {}
        self._owner: dict[tuple[str, str], str] = {}

    def opened(self, agent_id: str, stream_id: str, owner: str, session_id: str) -> None:
        key = (agent_id, stream_id)
        previous = self._owner.get(key)
        if previous is not None and previous != owner:
            self._by_owner[previous].pop(key, None)
        streams = self._by_owner.setdefault(owner, OrderedDict())
        streams[key] = session_id
        streams.move_to_end(key)
        self._owner[key] = owner
        while len(streams) > self.per_owner:
            forgotten, _ = streams.popitem(last=False)
            del self._owner[forgotten]

    def get(self, agent_id: str, stream_id: str) -> Opened | None:
        owner = self._owner.get((agent_id, stream_id))
        if owner is None:
            return None
        return Opened(owner, self._by_owner[owner][(agent_id, stream_id)])
