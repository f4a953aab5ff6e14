"""Agents: capacity, what is free, liveness; images on each agent; image pulls.

Free capacity and image use are views over the kernels (see projections.sessions), so they
always agree with kernel statuses.  The last heartbeat is not an event and no part of these
models: the manager's liveness watcher keeps it, and the agents query joins it in at reply time
(services.manager.queries).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import duckdb

from domain import events as ev
from domain.image_ref import canonical_or_same
from domain.limits import MAX_BYTES
from domain.status import AGENT_RESOURCE_OCCUPYING
from projections.base import Projection, fetch_rows
from projections.sessions import _in, slots_text
from projections.table import Row, Table

AGENTS = Table(
    "agents",
    (
        ("agent_id", "VARCHAR"),
        ("resource_group", "VARCHAR"),
        ("runtime", "VARCHAR"),
        ("cpu", "DOUBLE"),
        ("mem", "BIGINT"),
        ("disk", "BIGINT"),
        ("slots", "VARCHAR"),  # other resource slots offered, e.g. "gpu=2"
        ("slot_amounts", "MAP(VARCHAR, DOUBLE)"),  # the same as a map, e.g. {"gpu": 2.0}
        ("alive", "BOOLEAN"),
        ("status_info", "VARCHAR"),  # registered, reregistered, or why it was lost
        ("registered_at", "TIMESTAMPTZ"),
        ("reregistered_at", "TIMESTAMPTZ"),
        ("lost_at", "TIMESTAMPTZ"),
        ("last_seq", "BIGINT"),
    ),
    key=("agent_id",),
)
AGENT_IMAGES = Table(
    "agent_images",
    (
        ("agent_id", "VARCHAR"),
        ("image", "VARCHAR"),
        ("digest", "VARCHAR"),
        ("size_bytes", "BIGINT"),
        ("pulled_at", "TIMESTAMPTZ"),  # NULL: reported at registration, not pulled since
        ("reported_at", "TIMESTAMPTZ"),  # when the agent last reported or pulled it
        # Seed 000's preload mapping, from ImagePreloaded: held ahead of any kernel; pinned by a
        # preload job (image GC keeps it until it is unloaded); the reason of the latest mark.
        ("preloaded", "BOOLEAN"),
        ("pinned", "BOOLEAN"),
        ("preload_reason", "VARCHAR"),
        ("preloaded_at", "TIMESTAMPTZ"),
        ("last_seq", "BIGINT"),
    ),
    key=("agent_id", "image"),
)
PULLS = Table(
    "pulls",
    (
        ("agent_id", "VARCHAR"),
        ("task_id", "VARCHAR"),
        ("image", "VARCHAR"),
        ("started_at", "TIMESTAMPTZ"),
        ("finished_at", "TIMESTAMPTZ"),
        # pulling, pulled, failed, cancelled (no kernel waited), abandoned (agent restarted)
        ("outcome", "VARCHAR"),
        ("reason", "VARCHAR"),
        ("digest", "VARCHAR"),
        ("bytes", "BIGINT"),
        ("duration_s", "DOUBLE"),
        ("last_seq", "BIGINT"),
    ),
    key=("agent_id", "task_id"),
)


class AgentsProjection(Projection):
    name: ClassVar[str] = "agents"
    # v2: AgentLost only from the manager's liveness subject (one on an agent's own subject is
    # quarantined), so a model built before is rebuilt.  v3: the slots an agent offers.
    # v4: those slots as a map too (slot_amounts), from which the view derives free_slots.
    version: ClassVar[int] = 4
    tables: ClassVar[tuple[Table, ...]] = (AGENTS,)
    views: ClassVar[Mapping[str, str]] = {
        # The images' sum is capped at MAX_BYTES (like the disk): BIGINT never overflows.
        # free_slots: each slot the agent offers less what the kernels holding its room ask
        # (slots_by_agent), as free_cpu is its cpu less theirs.
        "agents_view": f"""
            SELECT a.agent_id, a.resource_group, a.runtime, a.alive, a.status_info,
                   a.cpu, a.mem, a.disk, a.slots, a.slot_amounts,
                   round(a.cpu - coalesce(o.cpu, 0), 6) AS free_cpu,  -- no 1e-14 residue
                   a.mem - coalesce(o.mem, 0) AS free_mem,
                   a.disk - coalesce(i.bytes, 0) AS free_disk,
                   coalesce(f.free_slots, MAP {{}}::MAP(VARCHAR, DOUBLE)) AS free_slots,
                   coalesce(o.kernels, 0) AS kernels,
                   a.registered_at, a.reregistered_at, a.lost_at, a.last_seq
            FROM agents a
            LEFT JOIN occupancy_by_agent o USING (agent_id)
            LEFT JOIN (SELECT agent_id, least(sum(size_bytes), {MAX_BYTES})::BIGINT AS bytes
                       FROM agent_images
                       GROUP BY agent_id) i USING (agent_id)
            LEFT JOIN (SELECT c.agent_id,
                              map_from_entries(list({{'key': c.slot,
                                                      'value': round(c.amount
                                                                     - coalesce(h.amount, 0), 6)}}
                                                     ORDER BY c.slot)) AS free_slots
                       FROM (SELECT agent_id, unnest(map_keys(slot_amounts)) AS slot,
                                    unnest(map_values(slot_amounts)) AS amount
                             FROM agents) c
                       LEFT JOIN slots_by_agent h USING (agent_id, slot)
                       GROUP BY c.agent_id) f USING (agent_id)""",
    }

    def __init__(self) -> None:
        super().__init__()
        self.agents: dict[str, Row] = {}
        self.handlers = {
            ev.AgentRegistered: self._registered,
            ev.AgentReregistered: self._registered,
            ev.AgentLost: self._lost,
        }

    def load(self, cur: duckdb.DuckDBPyConnection, names: Mapping[str, str]) -> None:
        self.agents = {
            r["agent_id"]: r for r in fetch_rows(cur, f"SELECT * FROM {names['agents']}")
        }

    def _registered(self, e: ev.AgentRegistered | ev.AgentReregistered, seq: int) -> None:
        row = self.agents.get(e.originator_id)
        fresh = row is None
        if row is None:
            row = self.agents[e.originator_id] = {"agent_id": e.originator_id}
        if isinstance(e, ev.AgentRegistered):
            row["registered_at"] = e.timestamp
            row["status_info"] = "registered"
        else:
            row["reregistered_at"] = e.timestamp
            row["status_info"] = "reregistered"
        row.update(
            resource_group=e.resource_group,
            runtime=e.runtime,
            cpu=e.capacity.cpu,
            mem=e.capacity.mem,
            disk=e.capacity.disk,
            slots=slots_text(e.capacity.slots),
            slot_amounts=dict(e.capacity.slots),
            alive=True,
            last_seq=seq,
        )
        self.put("agents", e.originator_id, row, fresh=fresh)

    def _lost(self, e: ev.AgentLost, seq: int) -> None:
        row = self.agents.get(e.originator_id)
        if row is None:
            return
        row.update(alive=False, status_info=e.status_info, lost_at=e.timestamp, last_seq=seq)
        self.put("agents", e.originator_id, row)


class ImagesProjection(Projection):
    """Which images each agent holds (what image locality and prepull read)."""

    name: ClassVar[str] = "images"
    # v2: preload marks (pinned, reason, time) from ImagePreloaded.  v3: built under the
    # admission rule (domain.admission), which refuses what older builds took (forgeries).
    # v4: images in canonical form (domain.image_ref): ``python`` and
    # ``docker.io/library/python:latest`` in the log are one row.
    version: ClassVar[int] = 4
    tables: ClassVar[tuple[Table, ...]] = (AGENT_IMAGES,)
    views: ClassVar[Mapping[str, str]] = {
        # In use: kernels on that agent with that image holding the agent's resources; last
        # used: the latest status change of a kernel of that image there that got a container
        # (started, or ended since): a kernel still waiting for the image, or cancelled before
        # it got one, never used it.
        "agent_images_view": f"""
            SELECT i.agent_id, i.image, i.digest, i.size_bytes, i.pulled_at, i.reported_at,
                   u.last_used_at, coalesce(u.kernels_using, 0) AS kernels_using, i.preloaded,
                   i.pinned, i.preload_reason, i.preloaded_at, i.last_seq
            FROM agent_images i
            LEFT JOIN (SELECT agent_id, image,
                              max(status_changed_at) FILTER (WHERE container_id IS NOT NULL)
                                  AS last_used_at,
                              count(*) FILTER (WHERE status IN ({_in(AGENT_RESOURCE_OCCUPYING)}))
                                  AS kernels_using
                       FROM kernels WHERE agent_id IS NOT NULL GROUP BY agent_id, image) u
            USING (agent_id, image)""",
    }

    def __init__(self) -> None:
        super().__init__()
        self.images: dict[tuple[str, str], Row] = {}
        self.handlers = {
            ev.AgentRegistered: self._reported,
            ev.AgentReregistered: self._reported,
            ev.ImagePulled: self._pulled,
            ev.ImageRemoved: self._removed,
            ev.ImagePreloaded: self._preloaded,
        }

    def load(self, cur: duckdb.DuckDBPyConnection, names: Mapping[str, str]) -> None:
        rows = fetch_rows(cur, f"SELECT * FROM {names['agent_images']}")
        self.images = {(r["agent_id"], r["image"]): r for r in rows}

    def _reported(self, e: ev.AgentRegistered | ev.AgentReregistered, seq: int) -> None:
        """The report replaces the agent's inventory; as in the Agent aggregate, a restarted
        agent keeps the preload marks of the images it still holds (by name)."""
        agent = e.originator_id
        report = {canonical_or_same(image): held for image, held in e.images.items()}
        for key in [k for k in self.images if k[0] == agent and k[1] not in report]:
            del self.images[key]
            self.delete("agent_images", key)
        for image, held in report.items():
            key = (agent, image)
            row = self.images.get(key)
            fresh = False
            if row is None or row["digest"] != held.digest:
                fresh = row is None and key not in self.changes["agent_images"].rows
                marks = _NOT_PRELOADED if row is None else {c: row[c] for c in _NOT_PRELOADED}
                row = self.images[key] = {"agent_id": agent, "image": image, **marks}
            row.update(digest=held.digest, size_bytes=held.size_bytes, reported_at=e.timestamp)
            row["last_seq"] = seq
            self.put("agent_images", key, row, fresh=fresh)

    def _pulled(self, e: ev.ImagePulled, seq: int) -> None:
        key = (e.originator_id, canonical_or_same(e.image))
        row = self.images.get(key)
        fresh = row is None and key not in self.changes["agent_images"].rows
        if row is None:
            row = self.images[key] = {"agent_id": e.originator_id, "image": key[1]}
            row.update(_NOT_PRELOADED)
        row.update(
            digest=e.digest,
            size_bytes=e.size_bytes,
            pulled_at=e.timestamp,
            reported_at=e.timestamp,
            last_seq=seq,
        )
        self.put("agent_images", key, row, fresh=fresh)

    def _removed(self, e: ev.ImageRemoved, seq: int) -> None:
        key = (e.originator_id, canonical_or_same(e.image))
        if self.images.pop(key, None) is not None:
            self.delete("agent_images", key)

    def _preloaded(self, e: ev.ImagePreloaded, seq: int) -> None:
        key = (e.originator_id, canonical_or_same(e.image))
        row = self.images.get(key)
        if row is None:
            return  # the domain marks only held images: never recorded
        # A pin stays until the image goes (the aggregate's rule): an unpinned mark keeps it.
        row.update(
            preloaded=True,
            pinned=e.pinned or bool(row["pinned"]),
            preload_reason=e.reason,
            preloaded_at=e.timestamp,
            last_seq=seq,
        )
        self.put("agent_images", key, row)


# The preload columns of an image no one preloaded.
_NOT_PRELOADED: Row = {
    "preloaded": False,
    "pinned": False,
    "preload_reason": None,
    "preloaded_at": None,
}


class PullsProjection(Projection):
    """Every image pull: started, finished, bytes, duration, outcome and reason."""

    name: ClassVar[str] = "pulls"
    # v2: built under the admission rule (domain.admission).  v3: images canonical.
    version: ClassVar[int] = 3
    tables: ClassVar[tuple[Table, ...]] = (PULLS,)

    def __init__(self) -> None:
        super().__init__()
        self.running: dict[tuple[str, str], Row] = {}  # only unfinished pulls can change
        self.handlers = {
            ev.ImagePullStarted: self._started,
            ev.ImagePulled: self._finished,
            ev.ImagePullFailed: self._finished,
            ev.AgentReregistered: self._agent_restarted,
        }

    def load(self, cur: duckdb.DuckDBPyConnection, names: Mapping[str, str]) -> None:
        rows = fetch_rows(cur, f"SELECT * FROM {names['pulls']} WHERE outcome = 'pulling'")
        self.running = {(r["agent_id"], r["task_id"]): r for r in rows}

    def _started(self, e: ev.ImagePullStarted, seq: int) -> None:
        key = (e.originator_id, e.task_id)
        row = {
            "agent_id": e.originator_id,
            "task_id": e.task_id,
            "image": canonical_or_same(e.image),
            "started_at": e.timestamp,
            "outcome": "pulling",
            "last_seq": seq,
        }
        self.running[key] = row
        # Not marked fresh: task ids are the agent's, and nothing forbids reusing one.
        self.put("pulls", key, row)

    def _finished(self, e: ev.ImagePulled | ev.ImagePullFailed, seq: int) -> None:
        row = self.running.pop((e.originator_id, e.task_id), None)
        if row is None:
            return  # no such pull in flight: the domain never records this
        row["finished_at"] = e.timestamp
        row["last_seq"] = seq
        if isinstance(e, ev.ImagePulled):
            row.update(outcome="pulled", digest=e.digest, bytes=e.size_bytes)
            row["duration_s"] = e.duration_s
        else:
            row.update(outcome="cancelled" if e.cancelled else "failed", reason=e.reason)
            row["duration_s"] = (e.timestamp - row["started_at"]).total_seconds()
        self.put("pulls", (e.originator_id, e.task_id), row)

    def _agent_restarted(self, e: ev.AgentReregistered, seq: int) -> None:
        """The pulls of the agent's previous process are gone with it."""
        for key in [k for k in self.running if k[0] == e.originator_id]:
            row = self.running.pop(key)
            row.update(
                outcome="abandoned",
                reason="agent-reregistered",
                finished_at=e.timestamp,
                last_seq=seq,
            )
            row["duration_s"] = (e.timestamp - row["started_at"]).total_seconds()
            self.put("pulls", key, row)
