"""Admin SQL (``hoist.admin.query.sql``, ``hoist sql``): one read-only SELECT over the read
models, with no way out of them.

Three layers, because the statement check alone is not enough (a SELECT can call
``read_text('/path/credentials.json')`` or ``glob('/etc/*')``):

- **The database instance is locked down** (``lock_down``): external access (files, network),
  extension autoinstall/autoload and community extensions off, then the configuration locked so
  no SET can undo it.  DuckDB settings belong to the instance, not the connection: every cursor
  of the read models' connection shares them, the projection runner's too.  That costs the
  runner nothing: it writes through registered Arrow tables, which external access does not
  govern, and its own database file, WAL and temp directory stay allowed.  (A second instance
  with other settings on the same file cannot be opened in one process.)
- **One statement, and only a SELECT** (``check_read_only``): no ATTACH, COPY, EXPORT, INSTALL,
  LOAD, PRAGMA, SET, CREATE, INSERT, UPDATE, DELETE, ...; it runs in a transaction that is
  rolled back, so even a write that slipped through would leave nothing.
- **Bounded**: at most ``limit`` rows come back (``truncated`` says there were more), and a
  query still running after ``time_limit`` seconds is interrupted and answered with ``timeout``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import duckdb

from domain.contracts.queries import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    SQL_DEFAULT_TIME_LIMIT_S,
    SQL_FIELDS,
    SQL_MAX_TIME_LIMIT_S,
)
from domain.limits import quote
from projections.runner import META

# Order matters: lock_configuration last, or it would refuse the others.
LOCKDOWN = (
    ("autoinstall_known_extensions", False),
    ("autoload_known_extensions", False),
    ("allow_community_extensions", False),
    ("enable_external_access", False),
    ("lock_configuration", True),
)

_locking = threading.Lock()  # two first queries at once must not both set the lock


class Refused(Exception):
    """An answer that is not rows: ``code`` is the reply's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SqlRequest:
    sql: str
    limit: int = DEFAULT_LIMIT
    time_limit: float = SQL_DEFAULT_TIME_LIMIT_S


def parse(request: Mapping[str, Any]) -> SqlRequest:
    """The SQL request's own fields (``min_seq``/``timeout`` are the queries' common wait)."""
    unknown = sorted(set(request) - set(SQL_FIELDS))
    if unknown:
        raise Refused(
            "invalid-request",
            f"unknown field {quote(', '.join(unknown))}; fields: {', '.join(SQL_FIELDS)}",
        )
    sql = request.get("sql")
    if not isinstance(sql, str) or not sql.strip():
        raise Refused(
            "invalid-request",
            'sql must be a non-empty string, e.g. {"sql": "SELECT * FROM kernels"}',
        )
    limit = request.get("limit", DEFAULT_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise Refused(
            "invalid-request", f"limit must be an integer from 1 to {MAX_LIMIT}, got {quote(limit)}"
        )
    time_limit = request.get("time_limit", SQL_DEFAULT_TIME_LIMIT_S)
    if (
        isinstance(time_limit, bool)
        or not isinstance(time_limit, int | float)
        or not 0 < time_limit <= SQL_MAX_TIME_LIMIT_S
    ):
        raise Refused(
            "invalid-request",
            f"time_limit must be seconds above 0 and at most {SQL_MAX_TIME_LIMIT_S:g},"
            f" got {quote(time_limit)}",
        )
    return SqlRequest(sql, limit, float(time_limit))


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """Turn off file, network and extension access for ``con``'s whole database instance and
    lock its configuration.  Idempotent; refuses an instance locked with access left on."""
    with _locking:
        cur = con.cursor()
        try:
            settings = dict(
                cur.execute(
                    "SELECT name, value FROM duckdb_settings() WHERE name IN"
                    f" ({', '.join('?' for _ in LOCKDOWN)})",
                    [name for name, _ in LOCKDOWN],
                ).fetchall()
            )
            if settings.get("lock_configuration") == "true":
                if settings.get("enable_external_access") != "false":
                    raise Refused(
                        "unavailable",
                        "admin SQL is off: the read models' database was locked with external"
                        " access on; restart the manager",
                    )
                return
            for name, value in LOCKDOWN:
                cur.execute(f"SET {name} = {str(value).lower()}")
        finally:
            cur.close()


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Allow exactly one SELECT statement; anything else could change the models or reach
    outside them."""
    cur = con.cursor()
    try:
        statements = cur.extract_statements(sql)
    except duckdb.Error as e:
        raise Refused("invalid-request", f"sql does not parse: {e}") from None
    finally:
        cur.close()
    if len(statements) != 1:
        raise Refused(
            "read-only",
            f"read-only: send exactly one SELECT statement, got {len(statements)} statements",
        )
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        hint = " (use SELECT * FROM pragma_...() to read)" if kind.name == "PRAGMA" else ""
        raise Refused("read-only", f"read-only: only a SELECT is allowed, got {kind.name}{hint}")


def run(con: duckdb.DuckDBPyConnection, request: SqlRequest) -> dict[str, Any]:
    """Answer one admin SQL request (blocking: call it in a thread).  The reply is ``{"seq",
    "columns", "rows", "truncated"}``; ``Refused`` otherwise."""
    lock_down(con)
    check_read_only(con, request.sql)
    cur = con.cursor()
    guard = threading.Lock()
    running, timed_out = True, False

    def interrupt() -> None:
        nonlocal timed_out
        with guard:  # never interrupt the rollback or a later statement of this cursor
            if running:
                timed_out = True
                cur.interrupt()

    timer = threading.Timer(request.time_limit, interrupt)
    timer.daemon = True
    cur.begin()
    timer.start()  # covers fetching too: a result may be streamed while it is fetched
    try:
        seqs = [seq for (seq,) in cur.execute(f"SELECT seq FROM {META}").fetchall()]
        try:
            result = cur.execute(request.sql)
            columns = [d[0] for d in result.description or []]
            rows = result.fetchmany(request.limit + 1)
        except duckdb.InterruptException:
            raise Refused(
                "timeout",
                f"the query ran longer than its time_limit of {request.time_limit:g}s and was"
                f" interrupted; narrow it, or raise time_limit (at most {SQL_MAX_TIME_LIMIT_S:g})",
            ) from None
        except duckdb.PermissionException as e:
            raise Refused(
                "read-only",
                f"read-only: admin SQL reads the read models only, no files, network or"
                f" extensions ({_first_line(e)})",
            ) from None
        except duckdb.Error as e:
            raise Refused("invalid-request", f"sql failed: {_first_line(e)}") from None
    finally:
        with guard:
            running = False
        timer.cancel()
        cur.rollback()
        cur.close()
    return {
        "seq": min(seqs, default=0),
        "columns": columns,
        "rows": [list(r) for r in rows[: request.limit]],
        "truncated": len(rows) > request.limit,
    }


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
