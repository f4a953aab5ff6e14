"""Admin SQL's own process: where one admin query runs, under a memory cap of its own.

DuckDB's ``memory_limit`` belongs to a database instance, and the read models' instance must
keep its own (the runner and the queries share it); a second instance on the same file cannot
be opened in one process ("Unique file handle conflict").  And DuckDB counts only what its
buffer manager holds: ``SELECT len(range(100000000))`` built a 4 GB list under a 512 MB
``memory_limit``.  So the query runs in a child process of the read models' process
(``python -m services.manager.admin_sql_process CAP THREADS``):

- the parent sends the tables the query names (the views' base tables included), read in the
  parent's one transaction, as Arrow IPC streams on the child's stdin, after a JSON header
  (the SQL, the row limit, the views to recreate);
- the child loads them into an in-memory DuckDB whose ``memory_limit`` is the cap, with no
  temp directory (nothing spills to disk), locked down as the read models' instance is
  (services.manager.admin_sql), and its data segment (``RLIMIT_DATA``) limited to the cap plus
  HEADROOM for the interpreter, so what DuckDB does not count fails too;
- it answers on stdout with one pickled dict: ``{"columns", "rows"}`` or ``{"error", "message"}``
  (``error``: ``memory``, ``read-only`` or ``invalid-request``).  A child that dies without an
  answer (a failed allocation outside DuckDB's reach can abort it) is answered as the cap.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import struct
import sys
from collections.abc import Sequence
from typing import IO, Any

# Order matters: lock_configuration last, or it would refuse the others.
LOCKDOWN = (
    ("autoinstall_known_extensions", False),
    ("autoload_known_extensions", False),
    ("allow_community_extensions", False),
    ("enable_external_access", False),
    ("lock_configuration", True),
)
HEADROOM = 256 << 20  # the interpreter, duckdb's and pyarrow's own memory, Arrow's buffers
_LENGTH = struct.Struct("!I")


def write_header(out: IO[bytes], header: dict[str, Any]) -> None:
    data = json.dumps(header).encode()
    out.write(_LENGTH.pack(len(data)) + data)


def _read_header(inp: IO[bytes]) -> dict[str, Any]:
    (n,) = _LENGTH.unpack(inp.read(_LENGTH.size))
    header: dict[str, Any] = json.loads(inp.read(n))
    return header


def _answer(cap: int, threads: int, inp: IO[bytes]) -> dict[str, Any]:
    import duckdb
    import pyarrow as pa

    header = _read_header(inp)
    con = duckdb.connect(
        ":memory:",
        config={"memory_limit": f"{cap}B", "threads": threads, "temp_directory": ""},
    )
    for table in header["tables"]:
        reader = pa.ipc.open_stream(inp)
        con.register("_arrow", reader)
        con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM _arrow')
        con.unregister("_arrow")
        del reader
    for _view, sql in header["views"]:
        try:
            con.execute(sql)
        except duckdb.Error:  # a view over tables the query does not name: not needed
            pass
    for name, value in LOCKDOWN:
        con.execute(f"SET {name} = {str(value).lower()}")
    try:
        result = con.execute(header["sql"])
        columns = [d[0] for d in result.description or []]
        rows = result.fetchmany(header["limit"] + 1)
    except (duckdb.OutOfMemoryException, MemoryError) as e:
        return {"error": "memory", "message": _first_line(e)}
    except duckdb.PermissionException as e:
        return {"error": "read-only", "message": _first_line(e)}
    except duckdb.Error as e:
        return {"error": "invalid-request", "message": _first_line(e)}
    return {"columns": columns, "rows": rows}


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def main(argv: Sequence[str] | None = None) -> int:
    cap, threads = (int(a) for a in (argv if argv is not None else sys.argv[1:]))
    import duckdb  # before the limit: loading the libraries is not the query's
    import pyarrow  # noqa: F401

    used = _data_now()
    limit = used + cap + HEADROOM
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
        answer = _answer(cap, threads, sys.stdin.buffer)
    except MemoryError as e:
        answer = {"error": "memory", "message": _first_line(e) or "MemoryError"}
    except duckdb.OutOfMemoryException as e:  # loading the tables the query names
        answer = {"error": "memory", "message": _first_line(e)}
    sys.stdout.buffer.write(pickle.dumps(answer))
    sys.stdout.flush()
    os._exit(0)  # without the interpreter's teardown: nothing is left to flush


def _data_now() -> int:
    """This process's data segment now (VmData), in bytes; what RLIMIT_DATA counts."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


if __name__ == "__main__":
    sys.exit(main())
