"""Heartbeats that carry changes, not whole lists (issue 16): both ends, pure.

An agent's beat lists every kernel it holds (a full beat) until the manager acknowledges one
(``beats-acked``, domain.rpc): from then on a beat carries what changed since that acknowledged
beat only (``kernels``: new or changed, ``gone``: removed, ``base``: the acknowledged beat's
``seq``), until the changes outgrow half the list; then a full beat again, acknowledged again.
Counting from the acknowledged beat, not the previous one, a lost beat loses nothing. A beat
the manager cannot apply (it restarted and holds no base, or the agent restarted: another
``epoch``, or the base is not the one it holds) makes it ask for a full list (``beats-acked``
without a ``seq``), and it keeps the last beat it could apply meanwhile (an older snapshot,
with its own ``sent_at``: reconciliation's grace is counted from that).

An agent that sends no ``epoch`` (one before this change) always sends full beats and is never
acknowledged; a manager that never acknowledges (one before this change) always gets them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from domain.rpc import MAX_BEAT_FLOOR_S, BeatsAcked, Heartbeat, LiveKernel

# Changes a beat may carry before a full beat is cheaper (and resets the base), at the least.
MIN_CHANGES = 8


@dataclass(frozen=True)
class BeatBody:
    """What one beat says about the kernels: all of them (``base`` None) or the changes."""

    seq: int
    base: int | None
    kernels: list[LiveKernel]
    gone: list[str]


class BeatSender:
    """The agent's side: ``body(kernels)`` for each beat, ``acked`` when the manager says."""

    def __init__(self, epoch: str) -> None:
        self.epoch = epoch
        self.seq = 0
        self._full: tuple[int, dict[str, LiveKernel]] | None = None  # the last full beat sent
        self._base: tuple[int, dict[str, LiveKernel]] | None = None  # the acknowledged one

    @property
    def base(self) -> int | None:
        """The acknowledged full beat the changes count from; None while full beats go."""
        return None if self._base is None else self._base[0]

    def body(self, kernels: list[LiveKernel]) -> BeatBody:
        self.seq += 1
        listed = {k.kernel_id: k for k in kernels}
        if self._base is not None:
            base_seq, base = self._base
            changed = [k for kid, k in listed.items() if base.get(kid) != k]
            gone = [kid for kid in base if kid not in listed]
            if len(changed) + len(gone) <= max(MIN_CHANGES, len(listed) // 2):
                return BeatBody(self.seq, base_seq, changed, gone)
        self._full = (self.seq, listed)
        self._base = None  # full beats until this one is acknowledged
        return BeatBody(self.seq, None, kernels, [])

    def acked(self, ack: BeatsAcked) -> int | None:
        """The manager holds full beat ``ack.seq`` (changes from it on), or nothing (``seq``
        None: a full beat next); the base now, None while full beats go."""
        if ack.epoch != self.epoch:
            return self.base  # for an earlier process
        if ack.seq is None:
            self._base = None
        elif self._full is not None and self._full[0] == ack.seq:
            self._base = self._full  # (an ack of an older full beat is ignored: a newer went)
        return self.base


class BeatReceiver:
    """The manager's side: ``receive(beat)`` gives the beat with every kernel listed (None if
    it cannot be applied) and the acknowledgement to send the agent (None: nothing to say)."""

    def __init__(self) -> None:
        # agent id -> (epoch, seq, kernels by id) of the full beat acknowledged last
        self._bases: dict[str, tuple[str, int, dict[str, LiveKernel]]] = {}

    def receive(self, beat: Heartbeat) -> tuple[Heartbeat | None, BeatsAcked | None]:
        agent_id = beat.agent_id
        if beat.base is None:
            if not beat.epoch:
                return beat, None  # an agent that always lists everything
            self._bases[agent_id] = (beat.epoch, beat.seq, {k.kernel_id: k for k in beat.kernels})
            return beat, BeatsAcked(epoch=beat.epoch, seq=beat.seq)
        held = self._bases.get(agent_id)
        if held is None or held[0] != beat.epoch or held[1] != beat.base:
            self._bases.pop(agent_id, None)
            return None, BeatsAcked(epoch=beat.epoch, seq=None)  # send everything
        kernels = dict(held[2])
        for k in beat.kernels:
            kernels[k.kernel_id] = k
        for kernel_id in beat.gone:
            kernels.pop(kernel_id, None)
        return msgspec.structs.replace(
            beat, kernels=list(kernels.values()), base=None, gone=[]
        ), None

    def forget(self, agent_id: str) -> None:
        self._bases.pop(agent_id, None)


# -- the pace: a fleet's beats per second bounded (as Nomad's max_heartbeats_per_second) ------
#
# At a fixed interval the beats grow with the fleet: 1,000 agents beating every 2 s send the
# manager, its read models and nats-server 500 messages a second, whatever the sessions do.
# The leading manager keeps them under ``beats_per_s``: past ``beats_per_s * FREE_PACE_S``
# agents it asks each agent for a floor under its interval (``pace_floor``), and judges an
# agent silent only after a deadline that leaves room for that interval (``silence_deadline``).

FREE_PACE_S = 2.0  # the agents' default interval: a fleet that fits at it is not paced
MISSED_BEATS = 4  # beats a paced agent may miss before it is judged silent, plus the grace
GRACE_S = 5.0


def pace_floor(agents: int, beats_per_s: float) -> float:
    """The least interval (whole seconds) that keeps ``agents`` within ``beats_per_s``; 0 while
    they fit at FREE_PACE_S (no floor: each agent beats at its own interval)."""
    if not beats_per_s > 0:
        raise ValueError(f"beats_per_s must be > 0, got {beats_per_s!r}")
    need = agents / beats_per_s
    if need <= FREE_PACE_S:
        return 0.0
    return float(min(math.ceil(need), MAX_BEAT_FLOOR_S))


def silence_deadline(floor_s: float, deadline_s: float) -> float:
    """How long an agent may be silent before it is lost: the manager's ``deadline_s``, or
    MISSED_BEATS floors and the grace when the fleet is paced."""
    return max(deadline_s, MISSED_BEATS * floor_s + GRACE_S) if floor_s > 0 else deadline_s
