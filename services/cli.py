"""Hoist: a compute-session orchestrator on NATS JetStream. (`hoist`: each subcommand is a thin
function; errors end in one line.)"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
from nats.errors import NoServersError

from domain import codec, subjects
from services import natsauth, stack
from services.eventstore.store import Recorded


class CliError(Exception):
    """An error the user can act on; printed as one line, exit code 1."""


def _stack_url(args: argparse.Namespace, role: str) -> str:
    """The URL (with `role`'s credentials) of the stack in --data-dir, or $HOIST_NATS_URL."""
    if os.environ.get("HOIST_NATS_URL"):
        return os.environ["HOIST_NATS_URL"]
    data_dir = Path(args.data_dir)
    info = stack.StackInfo.read(data_dir)
    if info is None:
        raise CliError(
            f"no Hoist stack in {data_dir}: start one with `hoist up --data-dir {data_dir}`"
            " or set HOIST_NATS_URL"
        )
    creds = natsauth.load_credentials(data_dir)
    return natsauth.role_url(info.url, role, creds)


def _format_event(rec: Recorded) -> str:
    event = codec.decode(rec.data, rec.headers)
    payload = {
        k: v
        for k, v in msgspec.to_builtins(event).items()
        if k not in ("type", "originator_id", "originator_version", "timestamp", "originator_topic")
    }
    when = rec.time.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    kind, _, agg_id = rec.subject.removeprefix(subjects.EVENTS + ".").partition(".")
    return (
        f"{rec.seq:>8}  {when}  {kind}:{agg_id}  {type(event).__name__}"
        f"  {msgspec.json.encode(payload).decode()}"
    )


async def _print_events(url: str, *, subject_filter: str | None, follow: bool) -> None:
    nc = await stack.connect(url, "hoist-cli")
    try:
        store = stack.event_store(nc)
        if subject_filter and not follow and await store.last_seq(subject_filter) == 0:
            raise CliError(f"no events under {subject_filter}: check the session id")
        async for rec in store.replay(subject_filter=subject_filter, follow=follow):
            print(_format_event(rec), flush=True)
    finally:
        await nc.close()


async def cmd_history(args: argparse.Namespace) -> None:
    """Every event of one session, in order, straight from JetStream."""
    await _print_events(
        _stack_url(args, "client"),
        subject_filter=subjects.session_events(args.session_id),
        follow=False,
    )


async def cmd_events(args: argparse.Namespace) -> None:
    subject_filter = subjects.session_events(args.session) if args.session else None
    await _print_events(
        _stack_url(args, "client"), subject_filter=subject_filter, follow=args.follow
    )


async def cmd_creds(args: argparse.Namespace) -> None:
    data_dir = Path(args.data_dir)
    info = stack.StackInfo.read(data_dir)
    if info is None:
        raise CliError(
            f"no Hoist stack in {data_dir}: start one with `hoist up --data-dir {data_dir}`"
        )
    creds = natsauth.load_credentials(data_dir)
    print(natsauth.role_url(info.url, args.role, creds, agent_id=args.agent_id))


async def cmd_up(args: argparse.Namespace) -> None:
    data_dir = Path(args.data_dir)
    server, creds = stack.start_nats(data_dir, args.nats_port, agent_ids=[])
    try:
        stack.StackInfo(url=server.url, pid=os.getpid()).write(data_dir)
        manager_url = natsauth.role_url(server.url, "manager", creds)
        nc = await stack.connect(manager_url, "hoist-up")
        await stack.event_store(nc).ensure_stream()
        await nc.close()
        print(f"Hoist stack up: nats-server at {server.url} (data in {data_dir})", flush=True)
        print("  credentials for scripts and the nats CLI: hoist creds client|admin", flush=True)
        print("  following the event log (Ctrl-C stops the stack):", flush=True)
        await _print_events(manager_url, subject_filter=None, follow=True)
    finally:
        (data_dir / stack.STATE_FILE).unlink(missing_ok=True)
        server.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hoist", description=__doc__)
    parser.add_argument(
        "--data-dir",
        default=str(stack.DEFAULT_DATA_DIR),
        help="the local stack's data dir (default: %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the local stack: nats-server, manager, agents")
    up.add_argument("--nats-port", type=int, default=stack.DEFAULT_PORT)
    up.set_defaults(func=cmd_up)

    creds = sub.add_parser("creds", help="print a NATS URL with a role's credentials")
    creds.add_argument("role", choices=natsauth.ROLES)
    creds.add_argument("--agent-id", help="for role agent: which agent")
    creds.set_defaults(func=cmd_creds)

    for name, module in PROCESSES.items():
        sub.add_parser(
            name,
            help=f"run a{'n' if name[0] in 'aeiou' else ''} {name} process"
            f" (python -m {module}; --help there)",
        )

    history = sub.add_parser("history", help="every event of a session, in order")
    history.add_argument("session_id")
    history.set_defaults(func=cmd_history)

    events = sub.add_parser("events", help="the event log")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    events.add_argument("--session", help="only this session's events")
    events.set_defaults(func=cmd_events)
    return parser


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops like Ctrl-C: the finally blocks clean up


def run(func: Callable[[argparse.Namespace], Awaitable[None]], args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        asyncio.run(func(args))
    except KeyboardInterrupt:
        return 130
    except CliError as e:
        print(f"hoist: {e}", file=sys.stderr)
        return 1
    except (NoServersError, ConnectionRefusedError, OSError) as e:
        print(
            f"hoist: cannot reach NATS ({e}); is the stack running? start it with `hoist up`",
            file=sys.stderr,
        )
        return 1
    except ValueError as e:
        print(f"hoist: {e}", file=sys.stderr)
        return 1
    return 0


# Processes with their own command lines: `hoist agent ...` runs `python -m agent ...`. The agent
# is exec'd, not imported: the manager side never imports agent code.
PROCESSES = {"agent": "agent", "manager": "services.manager"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in PROCESSES:
        os.execv(sys.executable, [sys.executable, "-m", PROCESSES[argv[0]], *argv[1:]])
    args = build_parser().parse_args(argv)
    return run(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
