"""Read-model queries over NATS, served by the manager process beside the projection runner
(it owns the DuckDB file; queries read through cursors of the runner's connection).

What each query subject takes and answers is in domain.contracts.queries: the filters
of ``hoist.query.<name>`` per name, ``min_seq``/``timeout``/``limit``, and the admin's
``hoist.admin.query.sql`` (services.manager.admin_sql) and ``hoist.admin.verify``.

Per-user queries: each query with an ``owner`` filter (kernels, sessions, occupancy) is also
served as ``hoist.query.<user>.<name>``, which only that user's NATS user may publish; the
owner filter is forced to ``<user>`` (a request naming another owner is refused ``forbidden``
naming ``owner``), so a user's rows are their own, unless ``<user>`` is an admin user, who sees
every owner's.  The other queries (agents, images, pulls, policies, quarantine: fleet-wide, no
owner) are answered on a user's subject only for an admin user.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import duckdb
import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from domain import rpc, subjects
from domain.contracts.queries import (
    BOOL,
    COMMON,
    DEFAULT_LIMIT,
    DEFAULT_WAIT_S,
    FILTERS,
    LABELS,
    MAX_LIMIT,
    MAX_WAIT_S,
    OCCUPANCY_BY,
    OUTCOME,
    PREFIX,
    PULL_OUTCOMES,
    STATUS,
)
from domain.image_ref import canonical_or_same
from domain.limits import MAX_ID, MAX_IMAGE, MAX_LABELS, MAX_LIST, quote
from domain.rpc import RequestError
from domain.status import KernelStatus
from domain.subjects import SQL_SUBJECT, VERIFY_SUBJECT
from domain.user_scope import UserScope
from eventstore.store import StoreError
from projections.policies import JSON_COLUMNS as POLICY_JSON_COLUMNS
from projections.quarantine import count as quarantine_count
from projections.runner import META, Runner
from projections.users import UsersProjection
from projections.verify import verify
from services.manager import admin_sql
from services.manager.responder import manager_responder
from transport.client import Client
from transport.responder import Responder
from transport.tasks import Tasks

log = logging.getLogger(__name__)

QUEUE_GROUP = "hoist-queries"
# How long a per-user query waits for the users model to fold its user's latest record.
USER_WAIT_S = 2.0
LastHeartbeat = Callable[[str], datetime | None]  # agent id -> its latest heartbeat's time
# Checked field by field below, once rpc.decode has bounded its size and depth.
Request = dict[str, Any]


class InvalidRequest(RequestError):
    def __init__(self, message: str, code: str = "invalid-request") -> None:
        super().__init__(code, message)


@dataclass(frozen=True)
class Query:
    """One query subject: the view it reads, the projections behind it (the reply's seq is
    the lowest of theirs), the filters it takes (field -> kind), and its row order."""

    source: str
    projections: tuple[str, ...]
    filters: dict[str, str]  # field -> TEXT | STATUS | OUTCOME | BOOL (domain.contracts)
    order: str
    variants: dict[str, str] = field(default_factory=dict)  # occupancy: by -> source
    json_columns: tuple[str, ...] = ()  # stored as JSON text, sent decoded


# The contract (the filters of each query) is domain's; here is where each reads.
QUERIES: dict[str, Query] = {
    "kernels": Query("kernels", ("sessions",), FILTERS["kernels"], "session_id, kernel_index"),
    "sessions": Query("sessions", ("sessions",), FILTERS["sessions"], "created_at, session_id"),
    "occupancy": Query(
        "occupancy_by_owner",
        ("sessions",),
        FILTERS["occupancy"],
        "1",
        variants={by: f"occupancy_by_{by}" for by in OCCUPANCY_BY},
    ),
    "agents": Query("agents_view", ("agents", "sessions", "images"), FILTERS["agents"], "agent_id"),
    "images": Query(
        "agent_images_view", ("images", "sessions"), FILTERS["images"], "agent_id, image"
    ),
    "pulls": Query("pulls", ("pulls",), FILTERS["pulls"], "started_at, agent_id, task_id"),
    "policies": Query(
        "prepull_policies",
        ("policies",),
        FILTERS["policies"],
        "name",
        json_columns=POLICY_JSON_COLUMNS,
    ),
    # Records every reader skips (domain.admission): who appended what, and why refused.
    "quarantine": Query("quarantine", ("quarantine",), FILTERS["quarantine"], "seq"),
}


def no_heartbeats(agent_id: str) -> datetime | None:
    """A LastHeartbeat that has heard none (without a liveness watcher)."""
    return None


async def serve_queries(
    nc: Client,
    runner: Runner,
    *,
    queue: str = QUEUE_GROUP,
    tasks: Tasks | None = None,
    last_heartbeat: LastHeartbeat = no_heartbeats,
    sql_memory: int = admin_sql.DEFAULT_MEMORY,
) -> list[Subscription]:
    """Subscribe the query handlers; unsubscribe the returned subscriptions to stop.  Each
    request runs in its own task (in ``tasks``, for the caller to stop), so one waiting for
    ``min_seq`` holds up no other.  ``last_heartbeat`` (the heartbeats the read models' process
    hears) gives the agents query's ``last_heartbeat_at``: not an event, so no part of the
    models.  Who may read what comes from the users model (projections.users), once it has
    folded the user's latest record (else ``unavailable``, retry): a per-user query of a user
    never added, or disabled, is refused ``forbidden``; an admin
    user's is answered with every owner's rows, and only they have the admin queries on their
    own subjects (``hoist.admin.<user>.query.sql``, ``.verify``)."""
    handlers = tasks if tasks is not None else Tasks()
    responder = _responder()

    def serving(
        answer: Callable[[dict[str, Any]], Any], scoped: bool = False, admin_only: bool = False
    ) -> Callable[[Msg], Any]:
        async def handle(msg: Msg) -> None:
            user = msg.subject.split(".")[2] if scoped else None
            if not responder.answerable(msg, user):
                return

            async def call() -> Any:
                request = responder.decode(msg, Request)
                if user is not None:
                    enabled, is_admin = await _standing(runner, user)
                    scope = UserScope.of(user, enabled=enabled, admin=is_admin)
                    if admin_only:
                        scope.require_admin(
                            f", and {msg.subject} answers for the whole fleet; ask an admin"
                        )
                    if not scope.admin:  # an admin user sees every owner's rows
                        request = {
                            **request,
                            "owner": scope.owner(request.get("owner"), msg.subject),
                        }
                return await answer(request)

            await responder.reply(msg, call)

        async def spawn(msg: Msg) -> None:
            handlers.spawn(handle(msg))

        return spawn

    subs = []
    for name, query in QUERIES.items():

        def answer(r: dict[str, Any], n: str = name, q: Query = query) -> Any:
            return _answer_query(runner, n, q, r, last_heartbeat)

        subject = f"{subjects.QUERY}.{name}"
        subs.append(await nc.subscribe(subject, queue=queue, cb=serving(answer)))
        # a user's own: hoist.query.<user>.<name>, the fleet-wide ones an admin user's only
        fleet_wide = "owner" not in FILTERS.get(name, {})
        subs.append(
            await nc.subscribe(
                f"{subjects.QUERY}.*.{name}",
                queue=queue,
                cb=serving(answer, scoped=True, admin_only=fleet_wide),
            )
        )
    admin_queries = {
        SQL_SUBJECT: lambda r: _answer_sql(runner, r, sql_memory),
        VERIFY_SUBJECT: lambda r: _answer_verify(runner, r),
    }
    for subject, admin_answer in admin_queries.items():
        subs.append(await nc.subscribe(subject, queue=queue, cb=serving(admin_answer)))
        subs.append(
            await nc.subscribe(
                _admin_scoped(subject),
                queue=queue,
                cb=serving(admin_answer, scoped=True, admin_only=True),
            )
        )
    return subs


def _responder() -> Responder:
    return manager_responder(log, "query")


def _admin_scoped(subject: str) -> str:
    """An admin user's own: hoist.admin.<user>.query.sql, hoist.admin.<user>.verify."""
    return subject.replace(f"{subjects.ADMIN}.", f"{subjects.ADMIN}.*.", 1)


def served_subjects() -> list[str]:
    """Every subject serve_queries subscribes (a user's own with ``*`` in the user's place)."""
    out = []
    for name in QUERIES:
        out += [f"{subjects.QUERY}.{name}", f"{subjects.QUERY}.*.{name}"]
    for subject in (SQL_SUBJECT, VERIFY_SUBJECT):
        out += [subject, _admin_scoped(subject)]
    return out


async def answer_unavailable(
    nc: Client, why: Callable[[], str], *, queue: str = QUEUE_GROUP
) -> list[Subscription]:
    """Answer every query ``unavailable`` with ``why()`` (and a retry) until the returned
    subscriptions are unsubscribed: the manager, while its read models' process is down, so
    a client hears that rather than no responders (which reads as no manager at all).  Like
    serve_queries, only inboxes get an answer, on a user's subject only that user's."""

    responder = _responder()

    def on(pattern: str) -> Callable[[Msg], Any]:
        scoped = ".*." in pattern

        async def handle(msg: Msg) -> None:
            if not responder.answerable(msg, msg.subject.split(".")[2] if scoped else None):
                return
            error = RequestError("unavailable", f"{why()}; retry in a few seconds")
            await msg.respond(rpc.encode_reply(error.reply()))

        return handle

    return [await nc.subscribe(s, queue=queue, cb=on(s)) for s in served_subjects()]


# -- requests ------------------------------------------------------------------------------------


async def _standing(runner: Runner, user: str) -> tuple[bool, bool]:
    """(enabled, admin) of ``user`` from the users model, once it has folded the user's latest
    record (up to USER_WAIT_S): a user added, disabled or made admin a moment ago is judged as
    they are now, though the model may be behind the rest of the log."""
    # Never judged on a model that may be behind the user's record: it could still hold an
    # admin demoted or a user disabled a moment ago (fail closed, with a retry).
    try:
        seq = await runner.store.last_seq(subjects.aggregate_subject(subjects.USER, user))
    except StoreError as e:
        raise RequestError(
            "unavailable", f"could not read the record of user {user!r} to check it: {e}"
        ) from None
    if seq > _users(runner).seq and not await runner.wait_for(
        seq, USER_WAIT_S, (UsersProjection.name,)
    ):
        raise RequestError(
            "unavailable",
            f"the read models have not yet folded the latest record of user {user!r} (after"
            f" {USER_WAIT_S:g}s; they are catching up with the log): retry in a few seconds",
        )
    return _users(runner).standing(user)


def _users(runner: Runner) -> UsersProjection:
    # looked up each time: the runner makes its projections again when it reopens
    return next(p for p in runner.projections if isinstance(p, UsersProjection))


def _int(request: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = request.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be an integer from {low} to {high}, got {quote(value)}")
    return value


def _wait_s(request: dict[str, Any]) -> float:
    value = request.get("timeout", DEFAULT_WAIT_S)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_WAIT_S
    ):
        raise InvalidRequest(
            f"timeout must be seconds from 0 to {MAX_WAIT_S:g}, got {quote(value)}"
        )
    return float(value)


async def _wait(runner: Runner, request: dict[str, Any], projections: tuple[str, ...]) -> None:
    """Read-your-writes: hold the query until the models reflect ``min_seq``."""
    # Both checked even without min_seq: a wrong-typed option is an error, never ignored.
    min_seq = _int(request, "min_seq", 0, 0, 2**63 - 1)
    wait_s = _wait_s(request)
    if "min_seq" not in request:
        return
    if not await runner.wait_for(min_seq, wait_s, projections):
        raise InvalidRequest(
            f"the read model reflects sequence {runner.seq}, not yet min_seq {min_seq}, after"
            f" {wait_s:g}s; retry, or raise timeout (at most {MAX_WAIT_S:g})",
            code="timeout",
        )


def _filter(name: str, kind: str, value: Any) -> tuple[str, list[Any]]:
    """A WHERE clause and its parameters for one filter."""
    if kind == BOOL:
        if not isinstance(value, bool):
            raise InvalidRequest(f"{name} must be true or false, got {quote(value)}")
        return f"{name} = ?", [value]
    if kind == LABELS:
        return _labels(name, value)
    if kind == PREFIX:  # the start of an id: a short id the CLI resolves
        if not isinstance(value, str) or not 0 < len(value) <= MAX_ID:
            raise InvalidRequest(
                f"{name} must be a string of 1 to {MAX_ID} characters, got {quote(value)}"
            )
        return f"starts_with({name.removesuffix('_prefix')}, ?)", [value]
    values = value if isinstance(value, list) else [value]
    # No stored text is longer than an image reference: a longer value could match nothing.
    if not 0 < len(values) <= MAX_LIST or not all(
        isinstance(v, str) and 0 < len(v) <= MAX_IMAGE for v in values
    ):
        raise InvalidRequest(
            f"{name} must be a string of 1 to {MAX_IMAGE} characters or a list of 1 to"
            f" {MAX_LIST} of them, got {quote(value)}"
        )
    allowed = {STATUS: [s.value for s in KernelStatus], OUTCOME: list(PULL_OUTCOMES)}.get(kind)
    if allowed is not None:
        bad = [v for v in values if v not in allowed]
        if bad:
            raise InvalidRequest(f"{name} {quote(bad)} unknown: use any of {', '.join(allowed)}")
    if name == "image":  # the read models hold canonical references: any spelling finds them
        values = [canonical_or_same(v) for v in values]
    return f"{name} IN ({', '.join('?' for _ in values)})", values


def _labels(name: str, value: Any) -> tuple[str, list[Any]]:
    """Every ``key=value`` (the label has that value) or ``key`` (the label is set) given."""
    values = value if isinstance(value, list) else [value]
    if not 0 < len(values) <= MAX_LABELS or not all(
        isinstance(v, str) and 0 < len(v) <= 2 * 64 for v in values
    ):
        raise InvalidRequest(
            f"{name} must be key=value (or key) or a list of 1 to {MAX_LABELS} of them,"
            f" got {quote(value)}"
        )
    clauses, params = [], []
    for v in values:
        key, eq, val = v.partition("=")
        if eq:
            clauses.append(f"{name}[?] = ?")
            params += [key, val]
        else:
            clauses.append(f"map_contains({name}, ?)")
            params.append(key)
    return " AND ".join(clauses), params


def _parse(name: str, query: Query, request: dict[str, Any]) -> tuple[str, list[Any], int]:
    source = query.source
    known = set(query.filters) | set(COMMON) | ({"by"} if query.variants else set())
    unknown = sorted(set(request) - known)
    if unknown:
        raise InvalidRequest(
            f"unknown field {quote(', '.join(unknown))} for {subjects.QUERY}.{name}; fields:"
            f" {', '.join(sorted(known))}"
        )
    filters = dict(query.filters)
    if query.variants:
        by = request.get("by", next(iter(query.variants)))
        if not isinstance(by, str) or by not in query.variants:
            raise InvalidRequest(f"by must be one of {', '.join(query.variants)}, got {quote(by)}")
        source = query.variants[by]
        other = "agent_id" if by == "owner" else "owner"
        if other in request:
            raise InvalidRequest(
                f"{other} filters occupancy by {other.removesuffix('_id')}: set by to"
                f" {other.removesuffix('_id')!r} with it"
            )
        filters.pop(other)
    where, params = [], []
    for field_name, kind in filters.items():
        if field_name in request:
            clause, values = _filter(field_name, kind, request[field_name])
            where.append(clause)
            params.extend(values)
    limit = _int(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    sql = f"SELECT * FROM {source}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY {query.order} LIMIT {limit + 1}"
    return sql, params, limit


# -- answers -------------------------------------------------------------------------------------


async def _answer_query(
    runner: Runner,
    name: str,
    query: Query,
    request: dict[str, Any],
    last_heartbeat: LastHeartbeat = no_heartbeats,
) -> dict[str, Any]:
    sql, params, limit = _parse(name, query, request)
    await _wait(runner, request, query.projections)
    reply = await asyncio.to_thread(_read, runner.con, query.projections, sql, params, limit, True)
    for row in reply["rows"]:
        for column in query.json_columns:
            row[column] = msgspec.json.decode(row[column])
        if name == "agents":  # live, from the liveness watcher, joined in at reply time
            row["last_heartbeat_at"] = last_heartbeat(row["agent_id"])
    return reply


async def _answer_sql(runner: Runner, request: dict[str, Any], memory: int) -> dict[str, Any]:
    try:
        parsed = admin_sql.parse(request)
        await _wait(runner, request, ())
        return await asyncio.to_thread(admin_sql.run, runner.con, parsed, memory)
    except admin_sql.Refused as e:
        raise InvalidRequest(str(e), code=e.code) from None


async def _answer_verify(runner: Runner, request: dict[str, Any]) -> dict[str, Any]:
    if request:
        raise InvalidRequest(
            f"unknown field {quote(', '.join(sorted(request)))}; verify takes none: {{}}"
        )
    try:
        seq, differences = await verify(runner.con, runner.store, runner.bulk, runner.types)
    except ValueError as e:
        raise InvalidRequest(str(e), code="busy") from None
    return {
        "seq": seq,
        "ok": not differences,
        "quarantined": await asyncio.to_thread(quarantine_count, runner.con),
        "differences": [dataclasses.asdict(d) for d in differences],
    }


def _read(
    con: duckdb.DuckDBPyConnection,
    projections: tuple[str, ...],
    sql: str,
    params: list[Any],
    limit: int,
    as_dicts: bool,
) -> dict[str, Any]:
    """Run ``sql`` and read the models' sequence in one snapshot; the transaction is rolled
    back, so even a statement that slipped past the check could change nothing."""
    cur = con.cursor()
    cur.begin()
    try:
        seqs = dict(cur.execute(f"SELECT projection, seq FROM {META}").fetchall())
        wanted = [seqs[p] for p in projections if p in seqs] if projections else list(seqs.values())
        try:
            result = cur.execute(sql, params)
        except duckdb.Error as e:
            raise InvalidRequest(f"sql failed: {e}") from None
        columns = [d[0] for d in result.description or []]
        rows = result.fetchmany(limit + 1)
    finally:
        cur.rollback()
        cur.close()
    reply: dict[str, Any] = {"seq": min(wanted, default=0)}
    truncated = len(rows) > limit
    rows = rows[:limit]
    if as_dicts:
        reply["rows"] = [dict(zip(columns, r, strict=True)) for r in rows]
    else:
        reply["columns"] = columns
        reply["rows"] = [list(r) for r in rows]
    reply["truncated"] = truncated
    return reply
