"""Hoist: a compute-session orchestrator on NATS JetStream. (`hoist`: each subcommand is a thin
function; errors end in one line.)"""

from __future__ import annotations

import argparse
import asyncio
import errno
import math
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import unquote, urlsplit

from client.connection import CliError, Connection, ReplyError
from client.connection import login_name as cli_nats_login_name
from domain.limits import MAX_CPU, MAX_MEM, MAX_SLOT, MIN_KERNEL_MEM, SLOT_NAME
from domain.quota import fmt_mem
from domain.status import TERMINAL, KernelStatus
from domain.subjects import (
    KERNEL_CANCEL,
    SESSION_CREATE,
    SESSION_DESTROY,
    SESSION_GET,
    SESSION_LOGS,
    inbox_prefix,
)
from eventstore.store import StoreError
from services.cli import complete_values, completion, ids, output, stack_cmds
from services.cli import describe as describe_cli
from services.cli import history as history_cli
from services.cli import kernels as kernel_cli
from services.cli import read as cli_read
from services.cli.connected import connected
from services.cli.did_you_mean import HoistParser, innermost
from services.cli.flag_errors import in_flag_terms
from services.cli.kernels import INTERRUPTED, kernel_spec, port_lines
from services.cli.output import add_output_flags, print_json, wants_json
from services.cli.progress_view import FAILED, report, watch, watch_and_report
from services.cli.streams import (
    interrupt_event,
    process_exit,
    read_stream,
    silence_stdout,
    until_stopped,
)
from services.cli.up_cmd import cmd_up
from services.stack import home as stack_home
from services.stack import up as stack
from transport import credentials

_interrupt_event = interrupt_event


# --- run, watch ----------------------------------------------------------------------------------

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kmgt]?)(?:i?b)?$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
DEFAULT_RESOURCES = {"cpu": 1.0, "mem": 512 * 1024**2}
EXIT_WAIT_S = 30.0  # for the main kernel's exit to be recorded once its output ended


_SLOT = re.compile(SLOT_NAME)


def _wait_seconds(text: str) -> float:
    """--max-wait: seconds >= 0 (a negative or ``nan`` wait would mean nothing clear)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds >= 0 like 30 (0: no limit)")
    return value


def parse_resources(specs: list[str]) -> dict[str, float | int]:
    """``-r cpu=1 -r mem=512m -r gpu=2`` -> {"cpu": 1.0, "mem": 536870912, "gpu": 2.0}; defaults
    fill cpu and mem.  Any other name is a resource slot agents advertise (``--slot gpu=2``)."""
    out: dict[str, float | int] = dict(DEFAULT_RESOURCES)
    given: dict[str, str] = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not _SLOT.match(key):
            raise CliError(f"-r {spec}: write cpu=CORES, mem=SIZE or SLOT=AMOUNT (e.g. gpu=1)")
        if key in given:  # not the last one silently: which one was meant?
            raise CliError(f"-r {spec}: {key} is already given (-r {given[key]}); give it once")
        given[key] = spec
        if key == "cpu":
            try:
                cpu = float(value)
            except ValueError:
                cpu = 0.0
            if not 0 < cpu <= MAX_CPU:  # inf and nan too (JSON has neither)
                raise CliError(
                    f"-r {spec}: cpu takes a number of cores > 0 like 1 or 0.5"
                    f" (at most {MAX_CPU:g})"
                )
            out["cpu"] = cpu
        elif key == "mem":
            m = _SIZE.match(value)
            size = float(m[1]) * _UNITS[m[2].lower()] if m else 0.0
            if not MIN_KERNEL_MEM <= size <= MAX_MEM:  # inf too (300 digits)
                raise CliError(
                    f"-r {spec}: mem takes a size like 512m or 2g, from"
                    f" {fmt_mem(MIN_KERNEL_MEM)} to {fmt_mem(MAX_MEM)}"
                )
            out["mem"] = int(size)
        else:
            try:
                amount = float(value)
            except ValueError:
                amount = -1.0
            if not 0 <= amount <= MAX_SLOT:  # inf and nan too
                raise CliError(
                    f"-r {spec}: {key} takes an amount >= 0 like 1 or 0.5 (at most {MAX_SLOT:,.0f})"
                )
            out[key] = amount
    return out


# How long `hoist run` asks its create again while nothing answers or the store is unavailable:
# a manager's lease TTL (5 s) and a stream leader's election, with room.
CREATE_AGAIN_FOR_S = 30.0


async def cmd_run(args: argparse.Namespace) -> int:
    if args.cmd is not None and args.words:
        raise CliError("give the command once: after IMAGE, or after `--` when it has options")
    command = args.cmd if args.cmd is not None else (args.words or None)
    if args.cmd is not None and not args.cmd:
        raise CliError("nothing after `--`: write hoist run IMAGE -- CMD ...")
    if wants_json(args) and not args.detach:
        raise CliError("-o json prints the created session: give it with -d/--detach")
    request: dict[str, Any] = {
        "owner": args.owner,
        "image": args.image,
        "resources": parse_resources(args.resource or []),
        "cluster_size": args.cluster_size,
        "resource_group": args.resource_group,
        # The same request asked again creates one session (a reply lost in a failover).
        "request_id": uuid.uuid4().hex,
        **kernel_spec(args, command),
    }
    if args.detach:  # the manager waits for us; without --detach the CLI watches instead
        request["max_wait"] = args.max_wait
    detach = _interrupt_event()
    async with connected(args) as conn:
        reply = await conn.request(
            SESSION_CREATE, request, wait_s=args.max_wait + 10, again_for_s=CREATE_AGAIN_FOR_S
        )
        session_id = reply["session_id"]
        if args.detach:
            if wants_json(args):
                print_json(reply)
            else:
                if not reply.get("created", True):
                    print(_found(session_id), flush=True)
                print(f"session {session_id} {reply['status']} {reply['status_info']}")
                _print_ports(reply)
            return 1 if reply["status"] in FAILED else 0
        if command is not None:  # like `docker run`: the output, then its exit code
            return await _run_attached(conn, reply, args.max_wait, detach)
        print(_started(reply), flush=True)
        console = output.console()
        outcome = await watch(
            conn,
            session_id,
            console,
            live=console.is_terminal,
            max_wait=args.max_wait,
            detach=detach,
        )
        code = report(session_id, outcome, args.max_wait)
        if outcome.status is KernelStatus.RUNNING and not (outcome.detached or outcome.timed_out):
            _print_ports(await conn.request(SESSION_GET, {"session_id": session_id}))
        return code


def _found(session_id: str) -> str:
    """What `hoist run` says when its create found the session an earlier try of the same
    request stored (a reply lost on the way: the manager answers ``created: false``)."""
    return f"found session {session_id} (created by an earlier try of this request)"


def _started(reply: dict[str, Any]) -> str:
    session_id = reply["session_id"]
    if reply.get("created", True):
        return f"session {session_id} created (Ctrl-C detaches; it goes on)"
    return f"{_found(session_id)}; Ctrl-C detaches, it goes on"


def _print_ports(view: dict[str, Any], file: TextIO | None = None) -> None:
    for line in port_lines(view):
        print(line, file=file or sys.stdout, flush=True)


async def _run_attached(
    conn: Connection, reply: dict[str, Any], max_wait: float, detach: asyncio.Event
) -> int:
    """The pull view and status lines on stderr (stdout is the command's output, for pipes),
    then the main kernel's output until it ends; its exit code becomes ours."""
    err = sys.stderr
    session_id = reply["session_id"]
    print(_started(reply), file=err, flush=True)
    console = output.console(stderr=True)
    outcome = await watch(
        conn, session_id, console, live=console.is_terminal, max_wait=max_wait, detach=detach
    )
    code = report(session_id, outcome, max_wait, file=err)
    if outcome.detached:
        return INTERRUPTED  # Ctrl-C: 130 while pulling, as while following the output
    if outcome.timed_out or outcome.status in FAILED:
        return code
    view = await conn.request(SESSION_GET, {"session_id": session_id})
    _print_ports(view, err)
    main_id = view["kernels"][0]["kernel_id"]  # main1: the first kernel
    try:
        opened = await conn.request(
            SESSION_LOGS, {"session_id": session_id, "kernel_id": main_id, "follow": True}
        )
    except CliError as e:  # e.g. destroyed meanwhile, or too many streams: the code still
        print(
            f"hoist: the output of session {session_id} cannot be shown here: {e};"
            f" `hoist logs {session_id}` reads it",
            file=err,
            flush=True,
        )
    else:
        end = await read_stream(conn, opened, detach)
        if end.interrupted:
            print(
                f"detached from session {session_id}; it goes on."
                f" Its output: `hoist logs -f {session_id}`",
                file=err,
                flush=True,
            )
            return INTERRUPTED
        if end.pipe_closed:
            return 0
        if end.lost is not None:  # expired or evicted on the agent: the rest is not shown
            print(
                f"hoist: the output stream of session {session_id} was lost on its agent"
                f" (unread for a while, or evicted to make room) after {end.cursor} bytes;"
                f" the rest is not shown here: `hoist logs {session_id}` reads the output",
                file=err,
                flush=True,
            )
        if end.reason:
            print(f"hoist: the output ended early: {end.reason}", file=err, flush=True)
    assert outcome.status is not None  # settled
    shown = f"session {session_id} {outcome.status.value} {outcome.status_info}"
    return await _main_exit_code(conn, session_id, main_id, detach, shown)


async def _main_exit_code(
    conn: Connection, session_id: str, kernel_id: str, stop: asyncio.Event, shown: str
) -> int:
    """The main kernel's exit code, once its end is recorded (the output can end a moment
    before the agent's KernelExited reaches the log); the session's status line on stderr
    unless it is ``shown`` already."""
    deadline = time.monotonic() + EXIT_WAIT_S
    while True:
        view = await conn.request(SESSION_GET, {"session_id": session_id})
        kernel = next(k for k in view["kernels"] if k["kernel_id"] == kernel_id)
        line = f"session {session_id} {view['status']} {view['status_info']}"
        if kernel.get("exit_code") is not None:
            if line != shown:
                print(line, file=sys.stderr, flush=True)
            return process_exit(kernel["exit_code"])
        if KernelStatus(kernel["status"]) in TERMINAL:  # ended without an exit code: destroyed
            print(f"{line}; main kernel {kernel['status_info']}", file=sys.stderr, flush=True)
            return 1
        if time.monotonic() > deadline:
            raise CliError(
                f"the output of session {session_id} ended but its main kernel is still"
                f" {kernel['status']} after {EXIT_WAIT_S:g}s; see `hoist watch {session_id}`"
            )
        await until_stopped(asyncio.sleep(0.2), stop)
        if stop.is_set():
            return INTERRUPTED


async def cmd_watch(args: argparse.Namespace) -> int:
    detach = _interrupt_event()
    async with connected(args) as conn:
        session_id = await ids.session_id(conn, args.session_id)
        return await watch_and_report(conn, session_id, max_wait=args.max_wait, detach=detach)


async def cmd_destroy(args: argparse.Namespace) -> int:
    """Each session named, as `docker rm` does: one that fails is said and the rest go on;
    the exit code is 1 if any failed."""
    replies: list[Any] = []
    failed = 0
    async with connected(args) as conn:
        for given in args.session_id:
            try:
                session_id = await ids.session_id(conn, given)
                reply = await conn.request(
                    SESSION_DESTROY, {"session_id": session_id, "forced": args.forced}
                )
            except CliError as e:
                if len(args.session_id) == 1:
                    raise
                print(f"hoist: {output.printable(f'{given}: {e}')}", file=sys.stderr)
                failed += 1
                continue
            replies.append(reply)
            if not wants_json(args):
                print(f"session {reply['session_id']} {reply['status']} {reply['status_info']}")
    if wants_json(args):
        print_json(replies[0] if len(args.session_id) == 1 else replies)
    return 1 if failed else 0


async def cmd_cancel_kernel(args: argparse.Namespace) -> int:
    async with connected(args, "admin") as conn:
        try:
            kernel_id = await ids.kernel_id(conn, args.kernel_id)
        except ids.NoMatch:  # sent as given: the manager says why (not-found, or the role)
            kernel_id = args.kernel_id
        payload = {"kernel_id": kernel_id}
        if args.reason:
            payload["reason"] = args.reason
        reply = await conn.request(KERNEL_CANCEL, payload)
    if wants_json(args):
        print_json(reply)
        return 0
    for kernel in reply.get("kernels", []):
        if kernel["kernel_id"] == kernel_id:
            print(f"kernel {kernel_id} {kernel['status']} {kernel['status_info']}")
    print(f"session {reply['session_id']} {reply['status']} {reply['status_info']}")
    return 0


async def cmd_read(args: argparse.Namespace) -> int:
    async with connected(args) as conn:
        if getattr(args, "session", None):
            args.session = await ids.session_id(conn, args.session)
        await cli_read.run_read(conn, args, output.console())
    return 0


async def cmd_creds(args: argparse.Namespace) -> None:
    data_dir = Path(args.data_dir)
    info = stack.StackInfo.read(data_dir)
    if info is None or not info.alive():
        raise CliError(
            f"no Hoist stack runs in {data_dir}: start one with `hoist up --data-dir {data_dir}`"
        )
    creds = credentials.load_credentials(data_dir)
    if args.role == "agent" and args.agent_id and args.agent_id not in creds.agents:
        creds = stack.add_agent_user(data_dir, info, args.agent_id)  # an agent joining later
    try:
        if args.role == "user":
            if not args.name:
                raise CliError("hoist creds user NAME: which Hoist user (see `hoist user list`)")
            url = credentials.user_url(info.url, args.name, creds)
        else:
            url = credentials.role_url(info.url, args.role, creds, agent_id=args.agent_id)
    except KeyError as e:
        raise CliError(f"{e.args[0]}") from None
    print(url)
    if user := urlsplit(url).username:  # on stderr: `$(hoist creds client)` takes the URL only
        inbox = inbox_prefix(unquote(user))
        print(
            f"replies to this user come on {inbox}.>: connect nats-py with"
            f' inbox_prefix="{inbox}", the nats CLI with --inbox-prefix {inbox}',
            file=sys.stderr,
        )


# --- the parser ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = HoistParser(prog="hoist", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hoist {package_version()}")
    parser.add_argument(
        "--data-dir",
        help="the local stack's data dir (default: $HOIST_HOME, else the nearest .hoist from"
        " here up, else the per-user state dir); HOIST_NATS_URL overrides it",
    )
    parser.add_argument(
        "--user",
        default=os.environ.get("HOIST_USER") or None,
        help="act as this Hoist user (their credentials from the data dir, `hoist creds user`,"
        " and their own subjects); default $HOIST_USER, else the client role (any owner)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the local stack: nats-server, manager, agents, a demo")
    up.add_argument("--runtime", choices=("docker", "dummy"), help="default: docker if reachable")
    up.add_argument("--agents", type=int, default=2, help="how many agents (default 2)")
    up.add_argument(
        "--managers",
        type=int,
        default=1,
        help="how many managers (default 1): one leads, the others take over when it dies",
    )
    up.add_argument(
        "--nats-port",
        type=int,
        help=f"the port of its nats-server (default: the one this data dir's stack last used,"
        f" else {stack.DEFAULT_PORT})",
    )
    up.add_argument(
        "--nats-nodes",
        type=int,
        help="nats-servers to run as one JetStream cluster, every stream on 3 of them (3: the"
        " log survives a node's loss); default: as many as this data dir's stack last ran, else 1",
    )
    up.add_argument(
        "--no-sync-always",
        action="store_true",
        help="let nats-server fsync every 2 minutes instead of before each acknowledgement:"
        " faster appends, but acknowledged events can be lost when the host loses power",
    )
    up.add_argument("--docker-host", help="e.g. unix:///var/run/docker.sock")
    demo_flags = up.add_mutually_exclusive_group()
    demo_flags.add_argument("--no-demo", action="store_true", help="start no demo session")
    demo_flags.add_argument(
        "--demo",
        action="store_true",
        help="start a demo session even if one ran in this data dir (default: the first time)",
    )
    up.add_argument("--demo-image", help="the demo session's image")
    up.add_argument(
        "--dummy-config",
        type=Path,
        help="dummy agents: JSON of DummyConfig fields (default: the demo images)",
    )
    up.add_argument(
        "--slot",
        action="append",
        default=[],
        metavar="NAME=AMOUNT",
        help="a resource slot every agent offers, e.g. gpu=2 (repeatable)",
    )
    up.add_argument("--no-web", action="store_true", help="start no web view")
    up.add_argument(
        "--web-host",
        default="127.0.0.1",
        help="the address the web view binds (default 127.0.0.1: this machine only)",
    )
    up.add_argument("--web-port", type=int, help="the web view's port (default: a free one)")
    up.set_defaults(func=cmd_up)

    creds = sub.add_parser("creds", help="print a NATS URL with a role's credentials")
    creds.add_argument("role", choices=(*credentials.ROLES, "user"))
    creds.add_argument("name", nargs="?", help="for user: which Hoist user (hoist user add)")
    creds.add_argument("--agent-id", help="for role agent: which agent")
    creds.set_defaults(func=cmd_creds)

    for name, module in PROCESSES.items():
        sub.add_parser(
            name,
            help=f"run a{'n' if name[0] in 'aeiou' else ''} {name} process"
            f" (python -m {module}; --help there)",
        )

    run = sub.add_parser("run", help="create a session and show it live until it runs")
    run.add_argument("image")
    run.add_argument("--cluster-size", "-n", type=int, default=1, help="kernels (default 1)")
    run.add_argument(
        "--resource",
        "-r",
        action="append",
        metavar="KEY=VALUE",
        help="per kernel: cpu=CORES, mem=SIZE, SLOT=AMOUNT such as gpu=1 (default cpu=1 mem=512m)",
    )
    run.add_argument("--owner", default=_default_owner())
    run.add_argument("--resource-group", default="default")
    run.add_argument(
        "--max-wait",
        type=_wait_seconds,
        default=0.0,
        help="stop watching after S seconds (0: no limit)",
    )
    run.add_argument("--detach", "-d", action="store_true", help="print the session id, no view")
    add_output_flags(run, "the created session (with -d)")
    kernel_cli.add_run_flags(run)
    run.set_defaults(func=cmd_run, cmd=None)

    watch_p = sub.add_parser("watch", help="show a session live (again), from its current state")
    watch_p.add_argument("session_id", metavar="SESSION", help=_SESSION_HELP)
    watch_p.add_argument("--max-wait", type=_wait_seconds, default=0.0)
    watch_p.set_defaults(func=cmd_watch)

    destroy = sub.add_parser("destroy", help="end sessions")
    destroy.add_argument("session_id", metavar="SESSION", nargs="+", help=_SESSION_HELP)
    destroy.add_argument("--forced", action="store_true", help="record it terminated at once")
    add_output_flags(destroy, "the session")
    destroy.set_defaults(func=cmd_destroy)

    admin = sub.add_parser("admin", help="superadmin commands (admin credentials)")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True)
    cancel = admin_sub.add_parser("cancel-kernel", help="force a not-yet-running kernel CANCELLED")
    cancel.add_argument("kernel_id", metavar="KERNEL", help="a kernel id or its unique prefix")
    cancel.add_argument("--reason")
    add_output_flags(cancel, "the session")
    cancel.set_defaults(func=cmd_cancel_kernel)

    cli_read.add_commands(sub, cmd_read)
    kernel_cli.register(sub, connected, _default_owner())

    history_cli.register(sub)
    describe_cli.register(sub)

    # Commands that live beside what they drive: the audit commands with the projections, the
    # image-fleet commands with the image admin handlers.
    from services.cli import audit as audit_cli
    from services.cli import certs as certs_cli
    from services.cli import dotfiles as dotfile_cli
    from services.cli import groups as group_cli
    from services.cli import images as image_cli
    from services.cli import quotas as quota_cli
    from services.cli import users as user_cli
    from services.cli import web_cmd

    stack_cmds.register(sub)
    web_cmd.register(sub)
    certs_cli.register(sub)
    audit_cli.register(sub)
    image_cli.register(sub)
    quota_cli.register(sub)
    group_cli.register(sub)
    user_cli.register(sub)
    dotfile_cli.register(sub)
    completion.register(sub, parser)
    _accept_data_dir_after(sub)
    return parser


_SESSION_HELP = "a session id or its unique prefix (tables show 12 characters)"


def package_version() -> str:
    try:
        return metadata.version("hoist")
    except metadata.PackageNotFoundError:  # run from a checkout never installed
        return "unknown (not installed)"


def _accept_data_dir_after(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`hoist up --data-dir D` works like `hoist --data-dir D up` (what the error messages and
    the README write); SUPPRESS keeps the top-level value when the option is not repeated."""
    seen: set[int] = set()
    for name, p in sub.choices.items():
        if name in PROCESSES or id(p) in seen:  # processes parse their own options; aliases
            continue
        seen.add(id(p))
        p.add_argument("--data-dir", default=argparse.SUPPRESS, help="as before the command")
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                _accept_data_dir_after(action)


def _default_owner() -> str:
    return cli_nats_login_name()


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops like Ctrl-C: the finally blocks clean up


def run(
    func: Callable[[argparse.Namespace], Coroutine[Any, Any, int | None]],
    args: argparse.Namespace,
    parser: argparse.ArgumentParser | None = None,
) -> int:
    """Run a command; an error ends in one line on stderr (a reply's in the terms of
    ``parser``, the command's own parser: its flags), exit code 1."""
    if threading.current_thread() is threading.main_thread():  # signal.signal refuses others
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return asyncio.run(func(args)) or 0
    except KeyboardInterrupt:
        return 130
    except ReplyError as e:
        print(f"hoist: {in_flag_terms(e, parser, args)}", file=sys.stderr)
        return 1
    except CliError as e:
        print(f"hoist: {output.printable(str(e))}", file=sys.stderr)
        return 1
    except OSError as e:
        if isinstance(e, BrokenPipeError) or e.errno == errno.EPIPE:  # `main` ends it quietly
            raise BrokenPipeError from None
        print(f"hoist: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # e.g. an id that cannot be a subject token
        print(f"hoist: {e}", file=sys.stderr)
        return 1
    except StoreError as e:  # the stream too busy or gone mid-command: one line, not a trace
        print(f"hoist: {e}; try again", file=sys.stderr)
        return 1


# Processes with their own command lines: `hoist agent ...` runs `python -m agent ...`. The agent
# is exec'd, not imported: the manager side never imports agent code.
PROCESSES = {"agent": "agent", "manager": "services.manager"}


def main(argv: list[str] | None = None) -> int:
    """`hoist`.  A closed stdout (`hoist events | head`) ends any command quietly with exit
    code 0, as `run` does when its command's output is closed: the reader has what it wanted
    (0, not 141, so `set -o pipefail` scripts do not fail on a `| head`)."""
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:
        silence_stdout()  # the interpreter's last flush would raise again
        return 0


def _main(argv: list[str]) -> int:
    if argv[:1] == [complete_values.WORD]:  # a shell's TAB: not a command anyone types
        return complete_values.answer(argv[1:])
    # A process parses its own options (its --help too), also after `--data-dir D`.
    first = 0
    if argv[:1] == ["--data-dir"]:
        first = 2
    elif argv and argv[0].startswith("--data-dir="):
        first = 1
    if len(argv) > first and argv[first] in PROCESSES:
        os.execv(sys.executable, [sys.executable, "-m", PROCESSES[argv[first]], *argv[first + 1 :]])
    parser = build_parser()
    # Only `run` and `exec` take a command after `--`; anywhere else `--` is argparse's own
    # (`hoist destroy -- -x`: a SESSION that starts with a dash).
    takes_command = _command_word(parser, argv) in ("run", "exec")
    head, command = kernel_cli.split_command(argv) if takes_command else (argv, None)
    args = parser.parse_args(head)
    if command is not None:
        args.cmd = command
    args.data_dir = str(stack_home.resolve_data_dir(args.data_dir))
    return run(args.func, args, innermost(parser, args))


def _command_word(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (what follows hoist's own options), if any."""
    valued = {  # hoist's own options that take a value (--data-dir, --user)
        s for a in parser._actions if a.option_strings and a.nargs != 0 for s in a.option_strings
    }
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return None
        if word in valued:
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            return word
    return None


if __name__ == "__main__":
    sys.exit(main())
