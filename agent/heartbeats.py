"""This agent's heartbeats: what each carries, and their pace.

A beat goes out every ``heartbeat_interval_s``, or the longer floor the leading manager asks
(BeatPace); beats carry the kernels' changes once the manager acknowledged a full one."""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from datetime import UTC, datetime

from agent.config import AgentConfig
from agent.exits import Exits
from agent.facts import AgentFacts
from agent.pulls import PullManager
from agent.room import Room
from agent.runtime.base import KernelContainer, PulledImage, Runtime
from agent.volume_names import VolumeNames
from domain import rpc
from domain.beats import BeatSender
from domain.subjects import heartbeat
from transport.client import Client

log = logging.getLogger(__name__)

# (rpc.is_beat: the header tells a beat from a stored message the server reflected here)
_BEAT = {rpc.BEAT_HEADER: "1"}
# A heartbeat waits this long for the runtime's listings; past it (an engine under load, a
# container it cannot read) it sends the last listing: an agent that is alive must not be
# marked lost, which would end its running kernels.
LISTING_WAIT_S = 5.0
# Whether the manager marked this agent lost is read from the log after the manager's notice
# (rpc.LIVENESS_CHANGED), when the connection came back, and at the first beat this long after
# the last read (a notice is at most once: one lost in a network blip is found here).  Seconds,
# not beats, so a paced agent finds it as soon; reading it at every beat cost the stream a
# read per agent per beat.
LOOK_EVERY_S = 30.0


class Heartbeats:
    def __init__(
        self,
        nc: Client,
        config: AgentConfig,
        runtime: Runtime,
        facts: AgentFacts,
        pulls: PullManager,
        room: Room,
        exits: Exits,
        volume_names: VolumeNames,
    ) -> None:
        self.nc = nc
        self.config = config
        self.id = config.agent_id
        self.runtime = runtime
        self.facts = facts
        self.pulls = pulls
        self.room = room
        self.exits = exits
        self.volume_names = volume_names
        self._last_listing: tuple[list[KernelContainer], list[PulledImage]] | None = None
        # A new epoch per process: a restarted agent starts with full beats.
        self.beats = BeatSender(secrets.token_hex(8))
        self.pace_s = 0.0  # the floor under the interval the leading manager asked (BeatPace)
        self.repaced = asyncio.Event()  # a new floor: beat now (the manager sees it kept)
        # The next wait's share of the interval, below 1 once after a start or a new floor
        # (spread); a new floor to spread after the beat it wakes
        self._phase = 1.0
        self._spread_after_beat = False
        self._read_liveness = True  # read the liveness subject at the next beat
        self._liveness_read_at = time.monotonic()
        self._reconnects = 0  # the connection's count when the subject was last read

    def liveness_changed(self) -> None:
        """The manager's notice: what the liveness subject holds is read at the next beat."""
        self._read_liveness = True

    async def send(self) -> rpc.Heartbeat:
        listed_after = self.exits.marks
        try:
            kernels, images = await asyncio.wait_for(
                asyncio.gather(self.runtime.list_kernels(), self.runtime.list_images()),
                LISTING_WAIT_S,
            )
            self._last_listing = (kernels, images)
            fresh = True
        except Exception as e:  # a slow or failing engine: still say we are alive
            if self._last_listing is None:
                raise
            log.warning(
                "agent %s: listing for the heartbeat failed (%r): last one sent", self.id, e
            )
            kernels, images = self._last_listing
            fresh = False
        body = self.beats.body(
            [
                rpc.LiveKernel(
                    kernel_id=k.kernel_id,
                    session_id=k.session_id,
                    container_id=k.container_id,
                    # Only an exit is an end: a container never started (or paused) is no
                    # kernel kept for its logs (sync-kernels destroys it).
                    status="exited" if k.exit is not None else "running",
                )
                for k in kernels
            ]
        )
        beat = rpc.Heartbeat(
            agent_id=self.id,
            sent_at=datetime.now(UTC),
            kernels=body.kernels,
            epoch=self.beats.epoch,
            seq=body.seq,
            base=body.base,
            gone=body.gone,
            free=self.room.free(disk_used=sum(i.size_bytes for i in images)),
            images=sorted(i.image for i in images),
            pulls={image: task.task_id for image, task in self.pulls.active.items()},
            address=self.config.address,
            volumes=await self.volume_names.get(),
            pace_s=self.pace_s,
        )
        await self.nc.publish(heartbeat(self.id), rpc.encode(beat), headers=_BEAT)
        if fresh:
            self.exits.housekeep(kernels, listed_after)
        return beat

    def spread(self) -> None:
        """Make the next wait a random share of the interval.  Agents started or paced at the
        same moment (a rack powered on, a manager that paces the whole fleet at once) would
        otherwise beat together from then on, and every create in flight then waited for
        them (bench/lifecycle.py --scale)."""
        self._phase = random.uniform(0.05, 1.0)

    def wait_s(self) -> float:
        return self.interval_s() * self._phase

    def interval_s(self) -> float:
        """Its own interval, or the manager's floor when that is longer."""
        return max(self.config.heartbeat_interval_s, self.pace_s)

    async def beat(self) -> None:
        """One round of the heartbeat loop (a failed one is logged; the next may get through)."""
        if self._spread_after_beat:
            self._spread_after_beat = False
            self.spread()
        else:
            self._phase = 1.0
        await self.send()
        # Marked lost while alive (e.g. a network partition): say we are back.  Only at a beat:
        # an agent whose beats do not go out is not back.
        reconnects = self.nc.stats["reconnects"]
        now = time.monotonic()
        if (
            self._read_liveness
            or reconnects != self._reconnects
            or now - self._liveness_read_at >= LOOK_EVERY_S
        ):
            self._read_liveness, self._liveness_read_at = False, now
            self._reconnects = reconnects
            try:
                await self.facts.refresh()
            except BaseException:
                self._read_liveness = True  # read again at the next beat
                raise

    async def acked(self, request: rpc.BeatsAcked) -> rpc.BeatBase:
        return rpc.BeatBase(base=self.beats.acked(request))

    async def pace(self, request: rpc.BeatPace) -> rpc.BeatPaced:
        if request.floor_s != self.pace_s:
            self.pace_s = request.floor_s
            # A beat at once, not after the wait under way: the manager judges this agent by
            # the floor its last beat kept until it sees the new one.  The wait after it is
            # spread: the manager paces every agent at once.
            self._spread_after_beat = True
            self.repaced.set()
            log.info(
                "agent %s: beats every %gs (%s)",
                self.id,
                self.interval_s(),
                "the manager's pace" if self.pace_s else "its own interval again",
            )
        return rpc.BeatPaced(interval_s=self.interval_s())
