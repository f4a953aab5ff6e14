"""Sessions and their kernels: status, status_info and the time of every status, each kernel's
status history, and resource occupancy by owner and by agent (views over the kernels, from the
explicit occupying-status sets, so they can never disagree with the kernel statuses)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import ClassVar

import duckdb
import msgspec

from domain import events as ev
from domain.admission import Inadmissible
from domain.image_ref import canonical_or_same
from domain.session import hostname_of, session_status
from domain.status import (
    AGENT_RESOURCE_OCCUPYING,
    TERMINAL,
    USER_RESOURCE_OCCUPYING,
    KernelStatus,
    check_transition,
)
from projections.base import Projection, fetch_rows
from projections.table import Row, Table

STATUS_TIME = {s: f"{s.value.lower()}_at" for s in KernelStatus}  # last time it entered s

KERNELS = Table(
    "kernels",
    (
        ("kernel_id", "VARCHAR"),
        ("session_id", "VARCHAR"),
        ("kernel_index", "INTEGER"),  # position in the session's enqueue order
        ("owner", "VARCHAR"),
        ("image", "VARCHAR"),
        ("resource_group", "VARCHAR"),
        ("agent_id", "VARCHAR"),
        ("cpu", "DOUBLE"),
        ("mem", "BIGINT"),
        ("status", "VARCHAR"),
        ("status_info", "VARCHAR"),
        ("status_changed_at", "TIMESTAMPTZ"),
        *((column, "TIMESTAMPTZ") for column in STATUS_TIME.values()),
        ("pull_task_id", "VARCHAR"),
        ("container_id", "VARCHAR"),
        ("detail", "VARCHAR"),
        ("hostname", "VARCHAR"),  # main1, sub1, ...
        ("slots", "VARCHAR"),  # other resource slots, e.g. "gpu=2"
        ("slot_amounts", "MAP(VARCHAR, DOUBLE)"),  # the same as a map, e.g. {"gpu": 2.0}
        ("ports", "VARCHAR"),  # "8080->127.0.0.1:32768, ..." once created
        ("exit_code", "INTEGER"),  # once its process ended on its own
        ("ran_s", "DOUBLE"),  # how long its command ran
        ("session_name", "VARCHAR"),  # its session's (`hoist run --name`)
        ("labels", "MAP(VARCHAR, VARCHAR)"),  # its session's
        ("last_seq", "BIGINT"),
    ),
    key=("kernel_id",),
)
KERNEL_STATUS_HISTORY = Table(
    "kernel_status_history",
    (
        ("seq", "BIGINT"),
        ("kernel_id", "VARCHAR"),
        ("session_id", "VARCHAR"),
        ("status", "VARCHAR"),
        ("status_info", "VARCHAR"),
        ("changed_at", "TIMESTAMPTZ"),
    ),
)
SESSIONS = Table(
    "sessions",
    (
        ("session_id", "VARCHAR"),
        ("owner", "VARCHAR"),
        ("image", "VARCHAR"),
        ("resource_group", "VARCHAR"),
        ("cluster_size", "INTEGER"),
        ("cpu", "DOUBLE"),  # per kernel
        ("mem", "BIGINT"),  # per kernel
        ("request_id", "VARCHAR"),
        ("session_type", "VARCHAR"),
        ("cluster_mode", "VARCHAR"),
        ("command", "VARCHAR"),  # JSON argv; NULL: the image's entrypoint and cmd
        ("status", "VARCHAR"),
        ("status_info", "VARCHAR"),
        ("created_at", "TIMESTAMPTZ"),
        ("updated_at", "TIMESTAMPTZ"),
        ("name", "VARCHAR"),  # `hoist run --name`
        ("labels", "MAP(VARCHAR, VARCHAR)"),  # `hoist run --label k=v`
        ("last_seq", "BIGINT"),
    ),
    key=("session_id",),
)


def slots_text(slots: Mapping[str, float]) -> str | None:
    """Resource slots as a cell reads them: ``gpu=2, tpu=0.5`` (None: no slot)."""
    return ", ".join(f"{k}={v:g}" for k, v in sorted(slots.items())) or None


def _in(statuses: frozenset[KernelStatus]) -> str:
    return ", ".join(f"'{s.value}'" for s in sorted(statuses))


class _KernelView:
    """What the session's status rule reads of a kernel."""

    __slots__ = ("status", "status_info")

    def __init__(self, status: KernelStatus, status_info: str) -> None:
        self.status = status
        self.status_info = status_info


class _Live:
    """A session with a kernel not yet final: its row, its kernels' rows in enqueue order, and
    their statuses, from which the Session aggregate's own rule derives the session's."""

    __slots__ = ("kernels", "row", "rows")

    def __init__(self, row: Row, rows: dict[str, Row]) -> None:
        self.row = row
        self.rows = rows
        self.kernels = {
            k: _KernelView(KernelStatus(r["status"]), r["status_info"]) for k, r in rows.items()
        }


class SessionsProjection(Projection):
    name: ClassVar[str] = "sessions"
    # v2: built under the admission rule (domain.admission), which refuses events older builds
    # applied (a kernel the session lacks, an illegal transition, a version gap).
    # v3: what kernels run and how they ended (hostname, slots, ports, exit_code, ran_s;
    # session_type, cluster_mode, command).  v4: images in canonical form (domain.image_ref).
    # v5: each kernel's slots as a map too (slot_amounts), which slots_by_agent sums.
    # v6: sessions' names and labels (on their kernels too, for `hoist ps -l`).
    version: ClassVar[int] = 6
    tables: ClassVar[tuple[Table, ...]] = (KERNELS, KERNEL_STATUS_HISTORY, SESSIONS)
    views: ClassVar[Mapping[str, str]] = {
        "occupancy_by_owner": f"""
            SELECT owner, count(*) AS kernels, sum(cpu) AS cpu, sum(mem)::BIGINT AS mem
            FROM kernels WHERE status IN ({_in(USER_RESOURCE_OCCUPYING)}) GROUP BY owner""",
        "occupancy_by_agent": f"""
            SELECT agent_id, count(*) AS kernels, sum(cpu) AS cpu, sum(mem)::BIGINT AS mem
            FROM kernels WHERE status IN ({_in(AGENT_RESOURCE_OCCUPYING)}) GROUP BY agent_id""",
        # The resource slots the kernels holding an agent's room ask, per agent and slot.
        "slots_by_agent": f"""
            SELECT agent_id, slot, sum(amount) AS amount
            FROM (SELECT agent_id, unnest(map_keys(slot_amounts)) AS slot,
                         unnest(map_values(slot_amounts)) AS amount
                  FROM kernels
                  WHERE status IN ({_in(AGENT_RESOURCE_OCCUPYING)}) AND agent_id IS NOT NULL)
            GROUP BY agent_id, slot""",
    }

    def __init__(self) -> None:
        super().__init__()
        # Sessions whose kernels are all final never change again: only live ones stay here.
        self.live: dict[str, _Live] = {}
        self.handlers = {
            ev.SessionEnqueued: self._enqueued,
            ev.SessionSchedulingFailed: self._scheduling_failed,
            ev.SessionScheduled: self._scheduled,
            **{cls: self._kernel_event for cls in ev.KERNEL_EVENTS},
        }

    def load(self, cur: duckdb.DuckDBPyConnection, names: Mapping[str, str]) -> None:
        kernels, sessions = names["kernels"], names["sessions"]
        live = f"SELECT DISTINCT session_id FROM {kernels} WHERE status NOT IN ({_in(TERMINAL)})"
        rows: dict[str, dict[str, Row]] = {}
        # Enqueue order matters: a session's status_info is its first kernel's in that status.
        for row in fetch_rows(
            cur, f"SELECT * FROM {kernels} WHERE session_id IN ({live}) ORDER BY kernel_index"
        ):
            rows.setdefault(row["session_id"], {})[row["kernel_id"]] = row
        for row in fetch_rows(cur, f"SELECT * FROM {sessions} WHERE session_id IN ({live})"):
            self.live[row["session_id"]] = _Live(row, rows[row["session_id"]])

    # -- folds ----------------------------------------------------------------------------------

    def _enqueued(self, e: ev.SessionEnqueued, seq: int) -> None:
        image = canonical_or_same(e.image)  # an older event may hold a short form
        row: Row = {
            "session_id": e.originator_id,
            "owner": e.owner,
            "image": image,
            "resource_group": e.resource_group,
            "cluster_size": e.cluster_size,
            "cpu": e.resources.cpu,
            "mem": e.resources.mem,
            "request_id": e.request_id,
            "session_type": e.session_type,
            "cluster_mode": e.cluster_mode,
            "command": None
            if e.spec.command is None
            else msgspec.json.encode(e.spec.command).decode(),
            "created_at": e.timestamp,
            "name": e.name,
            "labels": dict(e.labels),
        }
        slots = slots_text(e.resources.slots)
        kernels: dict[str, Row] = {}
        status, info = KernelStatus.PENDING, e.status_info
        for index, kernel_id in enumerate(e.kernel_ids):
            kernels[kernel_id] = {
                "kernel_id": kernel_id,
                "session_id": e.originator_id,
                "kernel_index": index,
                "hostname": hostname_of(index),
                "slots": slots,
                "slot_amounts": dict(e.resources.slots),
                "owner": e.owner,
                "image": image,
                "resource_group": e.resource_group,
                "cpu": e.resources.cpu,
                "mem": e.resources.mem,
                "status": status,
                "status_info": info,
                "session_name": e.name,
                "labels": dict(e.labels),
            }
        live = self.live[e.originator_id] = _Live(row, kernels)
        for kernel in kernels.values():
            self._move(live, kernel, status, info, e.timestamp, seq, True)
        self._session_changed(live, e.timestamp, seq, fresh=True)

    def _scheduling_failed(self, e: ev.SessionSchedulingFailed, seq: int) -> None:
        live = self.live.get(e.originator_id)
        if live is None:
            return
        for kernel in live.rows.values():
            self._move(live, kernel, KernelStatus.PENDING, e.status_info, e.timestamp, seq)
        self._session_changed(live, e.timestamp, seq)

    def _scheduled(self, e: ev.SessionScheduled, seq: int) -> None:
        live = self._live_kernels(e, e.placements, KernelStatus.SCHEDULED)
        for kernel_id, agent_id in e.placements.items():
            kernel = live.rows[kernel_id]
            kernel["agent_id"] = agent_id
            self._move(live, kernel, KernelStatus.SCHEDULED, e.status_info, e.timestamp, seq)
        self._session_changed(live, e.timestamp, seq)

    def _kernel_event(self, e: ev.KernelEvent, seq: int) -> None:
        live = self._live_kernels(e, (e.kernel_id,), e.status)
        kernel = live.rows[e.kernel_id]
        if isinstance(e, ev.KernelPulling):
            kernel["pull_task_id"] = e.task_id
        elif isinstance(e, ev.KernelCreated):
            kernel["container_id"] = e.container_id
            kernel["ports"] = (
                ", ".join(f"{p.port}->{p.host}:{p.host_port}" for p in e.ports) or None
            )
        elif isinstance(e, ev.KernelTerminated) and e.exit_code is not None:
            kernel["exit_code"], kernel["ran_s"] = e.exit_code, e.ran_s
        detail = getattr(e, "detail", None)
        if detail:
            kernel["detail"] = detail
        self._move(live, kernel, e.status, e.status_info, e.timestamp, seq)
        self._session_changed(live, e.timestamp, seq)

    def _live_kernels(self, e: ev.Event, kernel_ids: Iterable[str], status: KernelStatus) -> _Live:
        """The live session of ``e`` if each of ``kernel_ids`` may move to ``status``, else
        Inadmissible: the Session aggregate refuses the same (quarantined by every reader;
        a final session is not live, and a final kernel may move nowhere)."""
        live = self.live.get(e.originator_id)
        if live is None:
            raise Inadmissible(f"session {e.originator_id} is unknown or final")
        for kernel_id in kernel_ids:
            view = live.kernels.get(kernel_id)
            if view is None:
                raise Inadmissible(f"session {e.originator_id} has no kernel {kernel_id}")
            check_transition(view.status, status, kernel_id)
        return live

    def _move(
        self,
        live: _Live,
        kernel: Row,
        status: KernelStatus,
        status_info: str,
        at: datetime,
        seq: int,
        fresh: bool = False,
    ) -> None:
        kernel_id = kernel["kernel_id"]
        view = live.kernels[kernel_id]
        view.status, view.status_info = status, status_info
        kernel["status"] = status  # a StrEnum: Arrow takes it as the string it is
        kernel["status_info"] = status_info
        kernel["status_changed_at"] = at
        kernel[STATUS_TIME[status]] = at
        kernel["last_seq"] = seq
        self.put("kernels", kernel_id, kernel, fresh=fresh)
        self.append(
            "kernel_status_history",
            (seq, kernel_id, kernel["session_id"], status, status_info, at),
        )

    def _session_changed(self, live: _Live, at: datetime, seq: int, fresh: bool = False) -> None:
        row = live.row
        row["status"], row["status_info"] = session_status(live.kernels.values())
        row["updated_at"] = at
        row["last_seq"] = seq
        self.put("sessions", row["session_id"], row, fresh=fresh)
        if all(k.status in TERMINAL for k in live.kernels.values()):
            del self.live[row["session_id"]]
