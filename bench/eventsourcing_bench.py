"""The eventsourcing persistence module on JetStream against the library's own modules.

The library's ``BankAccounts`` test application (snapshotting on, as the library ships it) runs
the same workload on three persistence modules, in one run:

- ``eventstore:Factory`` on a nats-server this script starts (file storage);
- ``eventsourcing.sqlite`` on a database file;
- ``eventsourcing.postgres`` on a real PostgreSQL server this script starts in a temp dir
  (``initdb`` + ``pg_ctl`` of Debian's ``postgresql``; as root it runs them as ``postgres``).

The workload: 1,000 sequential account openings; 8 threads each opening and crediting 250
accounts (saves counted: 4,000); getting the 1,000 accounts of the first phase; reading all
notifications 500 at a time.  Each round runs every module once (the order rotates), on a
fresh stream / file / schema; the best rate of each operation counts.  Printed: the rates and
the ratios JetStream/Postgres and JetStream/SQLite.

    python bench/eventsourcing_bench.py [--rounds 3] [--accounts 1000] [--threads 8]
        [--per-thread 250]

nats-server syncs its file store every 2 minutes by default, PostgreSQL at every commit (its
default ``fsync``/``synchronous_commit``), SQLite as its module sets it; ``--sync-always`` makes
nats-server sync every write, as Hoist's ``nats.conf`` does.

Targets (issue 19): every JetStream/Postgres ratio >= 1, 8-thread saves >= 2, notifications
JetStream/SQLite >= 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's directory comes first on sys.path, and this file's name would
# hide the library it measures.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from decimal import Decimal  # noqa: E402

from eventsourcing.tests.application import BankAccounts  # noqa: E402

from services.stack.natsserver import NatsServer, free_port, wait_for_port  # noqa: E402

OPERATIONS = ("sequential saves", "8-thread saves", "aggregate gets", "notifications read")
PAGE = 500


def _pg_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if found:
        return str(found[-1])
    on_path = shutil.which(name)
    if on_path:
        return on_path
    raise SystemExit(
        f"PostgreSQL's {name} not found: install Debian's postgresql (./dev test does)"
    )


@contextmanager
def postgres_server() -> Iterator[dict[str, str]]:
    """A throwaway PostgreSQL server on 127.0.0.1 (trust auth); yields the library's env."""
    try:
        import psycopg  # noqa: F401 - the library's postgres module needs it
    except ImportError:
        raise SystemExit(
            "psycopg is missing: pip install -e '.[test]' (or 'psycopg[binary,pool]')"
        ) from None
    with tempfile.TemporaryDirectory(prefix="es-bench-pg-") as tmp_name:
        with _postgres_in(Path(tmp_name)) as env:
            yield env


@contextmanager
def _postgres_in(tmp: Path) -> Iterator[dict[str, str]]:
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        user = "postgres" if _has_user("postgres") else "nobody"
        run_as = ["runuser", "-u", user, "--"]
        os.chown(tmp, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
    data, port = tmp / "data", free_port()
    subprocess.run(
        [
            *run_as,
            _pg_bin("initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    options = f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c max_connections=100"
    subprocess.run(
        [
            *run_as,
            _pg_bin("pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(tmp / "log"),
            "-w",
            "start",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_port("127.0.0.1", port)
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute("CREATE DATABASE bench")
        yield {
            "POSTGRES_DBNAME": "bench",
            "POSTGRES_HOST": "127.0.0.1",
            "POSTGRES_PORT": str(port),
            "POSTGRES_USER": "postgres",
            "POSTGRES_PASSWORD": "",
        }
    finally:
        subprocess.run(
            [*run_as, _pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
        )


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def workload(app: BankAccounts, accounts: int, threads: int, per_thread: int) -> dict[str, float]:
    """Rates (operations per second) of the four operations on one fresh application."""
    ids: list[uuid.UUID] = []

    def sequential() -> None:
        for i in range(accounts):
            ids.append(app.open_account(f"Alice {i}", f"alice{i}@example.com"))

    failures: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(per_thread):
                account = app.open_account(f"Bob {n}.{i}", f"bob{n}.{i}@example.com")
                app.credit_account(account, Decimal("10.00"))
        except BaseException as e:
            failures.append(e)

    def concurrent() -> None:
        pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if failures:
            raise failures[0]

    def gets() -> None:
        for account_id in ids:
            app.get_account(account_id)

    read = 0

    def notifications() -> None:
        nonlocal read
        start = 1
        while True:
            page = app.recorder.select_notifications(start, PAGE)
            read += len(page)
            if len(page) < PAGE:
                return
            start = page[-1].id + 1

    rates = {
        "sequential saves": accounts / _timed(sequential),
        "8-thread saves": threads * per_thread * 2 / _timed(concurrent),
        "aggregate gets": accounts / _timed(gets),
    }
    seconds = _timed(notifications)
    rates["notifications read"] = read / seconds
    expected = accounts + threads * per_thread * 2
    if read != expected:
        raise AssertionError(f"read {read} notifications, expected {expected}")
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--per-thread", type=int, default=250)
    parser.add_argument("--only", choices=["jetstream", "sqlite", "postgres"], action="append")
    parser.add_argument(
        "--sync-always",
        action="store_true",
        help="nats-server syncs every write to disk (as Hoist's nats.conf ships), as PostgreSQL"
        " syncs every commit; by default it syncs every 2 minutes",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="es-bench-") as tmp_name:
        tmp = Path(tmp_name)
        config = None
        if args.sync_always:
            config = tmp / "nats.conf"
            config.write_text(
                f'jetstream {{ store_dir: "{tmp / "nats"}", sync_interval: always }}\n'
            )
        with NatsServer(tmp / "nats", config=config) as nats, postgres_server() as pg_env:

            def jetstream(r: int) -> dict[str, str]:
                return {
                    "PERSISTENCE_MODULE": "eventstore:Factory",
                    "NATS_URL": nats.url,
                    "NATS_STREAM": f"bank{r}",
                }

            def sqlite(r: int) -> dict[str, str]:
                return {
                    "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                    "SQLITE_DBNAME": str(tmp / f"bank{r}.db"),
                }

            def postgres(r: int) -> dict[str, str]:
                return {
                    "PERSISTENCE_MODULE": "eventsourcing.postgres",
                    **pg_env,
                    "POSTGRES_SCHEMA": f"bank{r}",
                    "CREATE_TABLE": "y",
                }

            modules: dict[str, Callable[[int], dict[str, str]]] = {
                "jetstream": jetstream,
                "sqlite": sqlite,
                "postgres": postgres,
            }
            names = [n for n in modules if not args.only or n in args.only]
            best: dict[str, dict[str, float]] = {n: {} for n in names}
            for r in range(args.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    if name == "postgres":
                        _create_schema(pg_env, f"bank{r}")
                    app = BankAccounts(env=modules[name](r))
                    try:
                        rates = workload(app, args.accounts, args.threads, args.per_thread)
                    finally:
                        app.close()
                    print(
                        f"round {r + 1} {name:9}",
                        "  ".join(f"{op}: {rates[op]:,.0f}/s" for op in OPERATIONS),
                        flush=True,
                    )
                    for op, rate in rates.items():
                        best[name][op] = max(best[name].get(op, 0.0), rate)
            report(best)


def _create_schema(env: dict[str, str], schema: str) -> None:
    import psycopg

    with psycopg.connect(
        host=env["POSTGRES_HOST"],
        port=int(env["POSTGRES_PORT"]),
        user=env["POSTGRES_USER"],
        dbname=env["POSTGRES_DBNAME"],
        autocommit=True,
    ) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")


def report(best: dict[str, dict[str, float]]) -> None:
    print()
    header = f"{'operation':20}" + "".join(f"{n + ' /s':>16}" for n in best)
    ratios = [
        (a, b)
        for a, b in (("jetstream", "postgres"), ("jetstream", "sqlite"))
        if a in best and b in best
    ]
    header += "".join(f"{a[:2].upper() + '/' + b[:2].upper():>10}" for a, b in ratios)
    print(header)
    for op in OPERATIONS:
        line = f"{op:20}" + "".join(f"{best[n][op]:>16,.0f}" for n in best)
        line += "".join(f"{best[a][op] / best[b][op]:>10.2f}" for a, b in ratios)
        print(line)


if __name__ == "__main__":
    main()
