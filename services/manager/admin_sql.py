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
- **Bounded**: at most ``limit`` rows come back (``truncated`` says there were more), a query
  still running after ``time_limit`` seconds is stopped and answered with ``timeout``, and one
  that would take more than the manager's ``--admin-sql-memory`` is answered with ``memory``:
  it runs in a process of its own under that cap (services.manager.admin_sql_process), given
  the tables it names, so neither the read models nor the manager share its memory.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from domain.contracts.queries import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    SQL_DEFAULT_TIME_LIMIT_S,
    SQL_FIELDS,
    SQL_MAX_TIME_LIMIT_S,
)
from domain.limits import quote
from projections.runner import META
from services.manager.admin_sql_process import LOCKDOWN, write_header

DEFAULT_MEMORY = 512 << 20  # admin SQL's memory cap (the manager's --admin-sql-memory)

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


def run(
    con: duckdb.DuckDBPyConnection, request: SqlRequest, memory: int = DEFAULT_MEMORY
) -> dict[str, Any]:
    """Answer one admin SQL request (blocking: call it in a thread) in a process of its own
    that may use ``memory`` bytes.  The reply is ``{"seq", "columns", "rows", "truncated"}``;
    ``Refused`` otherwise."""
    lock_down(con)
    check_read_only(con, request.sql)
    cur = con.cursor()
    cur.begin()
    try:  # one transaction: the tables sent and the sequence they reflect agree
        seqs = [seq for (seq,) in cur.execute(f"SELECT seq FROM {META}").fetchall()]
        (threads,) = cur.execute("SELECT current_setting('threads')").fetchone() or (1,)
        try:
            named = cur.get_table_names(request.sql)
        except duckdb.PermissionException as e:
            raise Refused(
                "read-only",
                "read-only: admin SQL reads the read models only, no files, network or"
                f" extensions ({_first_line(e)})",
            ) from None
        except duckdb.Error as e:
            raise Refused("invalid-request", f"sql failed: {_first_line(e)}") from None
        # Every table goes, so the catalog (duckdb_tables(), information_schema) reads as
        # here; only the ones the query names (a view's base tables included) with rows.
        tables = {
            t: t in named
            for (t,) in cur.execute(
                "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'"
                " AND database_name = current_database() ORDER BY table_name"
            ).fetchall()
        }
        views = cur.execute(
            "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal"
            " AND schema_name = 'main' AND database_name = current_database()"
        ).fetchall()
        answer, timed_out = _in_child(cur, request, memory, int(threads), tables, views)
    finally:
        cur.rollback()
        cur.close()
    if timed_out:
        raise Refused(
            "timeout",
            f"the query ran longer than its time_limit of {request.time_limit:g}s and was"
            f" stopped; narrow it, or raise time_limit (at most {SQL_MAX_TIME_LIMIT_S:g})",
        )
    error = answer.get("error")
    if error == "memory":
        raise Refused(
            "memory",
            f"the query needs more memory than admin SQL's cap of {_size(memory)}"
            f" ({answer['message']}); narrow it (fewer rows or columns, smaller joins), add a"
            " LIMIT, or raise the cap with the manager's --admin-sql-memory",
        )
    if error == "read-only":
        raise Refused(
            "read-only",
            "read-only: admin SQL reads the read models only, no files, network or"
            f" extensions ({answer['message']})",
        )
    if error is not None:
        raise Refused("invalid-request", f"sql failed: {answer['message']}")
    rows = answer["rows"]
    return {
        "seq": min(seqs, default=0),
        "columns": answer["columns"],
        "rows": [list(r) for r in rows[: request.limit]],
        "truncated": len(rows) > request.limit,
    }


def _in_child(
    cur: duckdb.DuckDBPyConnection,
    request: SqlRequest,
    memory: int,
    threads: int,
    tables: dict[str, bool],
    views: list[tuple[str, str]],
) -> tuple[dict[str, Any], bool]:
    """Run the query in admin SQL's process, sending it ``tables`` (read through ``cur``;
    those mapped to False without their rows): its answer, and whether it was stopped at the
    time limit."""
    timed_out = False
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.manager.admin_sql_process", str(memory), str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        assert proc.stdin is not None and proc.stdout is not None

        def stop() -> None:
            nonlocal timed_out
            if proc.poll() is None:
                timed_out = True
                proc.kill()

        timer = threading.Timer(request.time_limit, stop)
        timer.daemon = True
        timer.start()
        try:
            try:
                header = {"sql": request.sql, "limit": request.limit, "tables": list(tables)}
                write_header(proc.stdin, {**header, "views": views})
                for table, rows in tables.items():
                    select = f'SELECT * FROM "{table}"' + ("" if rows else " LIMIT 0")
                    reader = cur.sql(select).to_arrow_reader()
                    with pa.ipc.new_stream(proc.stdin, reader.schema) as writer:
                        for batch in reader:
                            writer.write_batch(batch)
                proc.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass  # it ended early (at its cap, or stopped): its answer, or its end, says
            out = proc.stdout.read()
            code = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            if not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        if timed_out:
            return {}, True
        if out:
            answer: dict[str, Any] = pickle.loads(out)
            return answer, False
        stderr.seek(0)
        said = stderr.read().decode(errors="replace").strip().splitlines()
        why = said[-1] if said else f"exit code {code}"
        if code < 0 or "alloc" in why or "memory" in why.lower():  # killed, or aborted
            return {"error": "memory", "message": f"its process ended: {why}"}, False
        raise Refused("unavailable", f"admin SQL's process failed: {why}; see the manager's log")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} bytes"


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
