"""What kernels run and what they write: `hoist run`'s flags for the kernel spec (-e, -p, -v,
--workdir), `hoist logs`, `hoist exec`, `hoist volumes` and `hoist volume rm`.

Flags are checked here, so an error names the flag the user typed (``-e``), not the wire
field the manager would name (``env``); the manager checks them again at its door.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from client.connection import CliError, Connection
from domain.limits import (
    ABS_PATH,
    ENV_NAME,
    LABEL_KEY,
    LABEL_VALUE,
    MAX_ENV_NAME,
    SESSION_NAME,
    TOKEN,
)
from domain.subjects import SESSION_EXEC, SESSION_LOGS, VOLUME_LIST, VOLUME_REMOVE
from services.cli import ids, output
from services.cli.output import add_output_flags, print_json, wants_json
from services.cli.streams import interrupt_event, process_exit, read_stream

Connect = Callable[[argparse.Namespace], contextlib.AbstractAsyncContextManager[Connection]]

_ENV_NAME = re.compile(ENV_NAME)
_ABS_PATH = re.compile(ABS_PATH)
_TOKEN = re.compile(TOKEN)
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
MAX_REOPENS = 3  # `hoist logs` opens a lost stream again at most this often without progress


# --- flags ---------------------------------------------------------------------------------------


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``[..., "--", CMD, ...]`` -> (the options before ``--``, the command after it).

    argparse cannot take "everything after IMAGE" without also eating the options that follow
    it, so the command is cut off before parsing."""
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def parse_env(specs: list[str], flag: str = "-e") -> dict[str, str]:
    """``-e K=V`` (or ``-e K``: its value in this environment, as docker does)."""
    env: dict[str, str] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not _ENV_NAME.match(name):
            raise CliError(
                f"{flag} {spec}: {name!r} is not a variable name (letters, digits and '_',"
                " not starting with a digit); write NAME=VALUE"
            )
        if len(name) > MAX_ENV_NAME:
            raise CliError(
                f"{flag} {name[:16]}...: a variable name is at most {MAX_ENV_NAME} characters,"
                f" this one has {len(name)}"
            )
        if name.startswith("HOIST_"):
            raise CliError(f"{flag} {spec}: HOIST_* variables are set by Hoist (cluster info)")
        if not sep:
            if name not in os.environ:
                raise CliError(f"{flag} {spec}: {name} is not set here; write {name}=VALUE")
            value = os.environ[name]
        env[name] = value
    return env


def parse_ports(specs: list[str]) -> list[int]:
    """``-p 8080`` (``8080/tcp`` too): container ports the session view gives addresses for."""
    ports: list[int] = []
    for spec in specs:
        text = spec.removesuffix("/tcp")
        port = int(text) if text.isdigit() else 0
        if not 1 <= port <= 65535:
            raise CliError(f"-p {spec}: a container port is a number from 1 to 65535")
        if port in ports:
            raise CliError(f"-p {spec}: port {port} is given twice")
        ports.append(port)
    return ports


def parse_mounts(specs: list[str]) -> list[dict[str, Any]]:
    """``-v NAME:/path[:ro|rw]``: a named volume of the agent, mounted at ``/path``."""
    mounts: list[dict[str, Any]] = []
    for spec in specs:
        name, _, rest = spec.partition(":")
        path, _, mode = rest.partition(":")
        if not _TOKEN.match(name) or len(name) > 128:
            raise CliError(
                f"-v {spec}: write NAME:/path[:ro]; NAME is 1-128 letters, digits, '_' or '-'"
            )
        if not path:
            raise CliError(f"-v {spec}: no path: write {name}:/path[:ro]")
        if not _ABS_PATH.match(path):
            raise CliError(f"-v {spec}: {path!r} must be an absolute path without '..'")
        if mode not in ("", "ro", "rw"):
            raise CliError(f"-v {spec}: the mode after the path is ro or rw, not {mode!r}")
        if any(m["path"] == path for m in mounts):
            raise CliError(f"-v {spec}: {path} is mounted twice")
        mounts.append({"volume": name, "path": path, "read_only": mode == "ro"})
    return mounts


def parse_workdir(workdir: str | None) -> str | None:
    if workdir is not None and not _ABS_PATH.match(workdir):
        raise CliError(f"--workdir {workdir}: must be an absolute path without '..'")
    return workdir


def kernel_spec(args: argparse.Namespace, command: list[str] | None) -> dict[str, Any]:
    """The create request's fields for what the kernels run (unset ones left out)."""
    spec: dict[str, Any] = {
        "session_type": "batch" if args.batch else "interactive",
        "cluster_mode": args.cluster_mode,
    }
    if args.batch and not command:
        raise CliError("--batch needs a command: hoist run IMAGE --batch -- CMD ...")
    if command:
        spec["command"] = command
    if env := parse_env(args.env or []):
        spec["env"] = env
    if workdir := parse_workdir(args.workdir):
        spec["workdir"] = workdir
    if ports := parse_ports(args.port or []):
        spec["ports"] = ports
    if mounts := parse_mounts(args.volume or []):
        spec["mounts"] = mounts
    if args.name is not None:
        if not re.match(SESSION_NAME, args.name):
            raise CliError(
                f"--name {args.name}: 1-63 letters, digits, '_', '.' or '-', starting with a"
                " letter or digit"
            )
        spec["name"] = args.name
    if labels := parse_labels(args.label or [], "--label"):
        spec["labels"] = labels
    return spec


def parse_labels(specs: list[str], flag: str) -> dict[str, str]:
    """``k=v`` items (repeated) -> a dict; what a key or value may hold the manager checks."""
    labels: dict[str, str] = {}
    for item in specs:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise CliError(f"{flag} {item}: give key=value (e.g. {flag} team=ml)")
        if not re.match(LABEL_KEY, key):
            raise CliError(
                f"{flag} {item}: the key is 1-63 letters, digits, '_', '.', '/' or '-',"
                " starting with a letter or digit"
            )
        if not re.match(LABEL_VALUE, value):
            raise CliError(
                f"{flag} {item}: the value is at most 63 letters, digits, '_', '.' or '-'"
            )
        if key in labels and labels[key] != value:
            raise CliError(f"{flag} {item}: {key} is given twice")
        labels[key] = value
    return labels


def port_lines(view: dict[str, Any]) -> list[str]:
    """``main1: 8080 -> 10.0.0.5:32768`` per published port of a session view."""
    return [
        f"{k.get('hostname') or k['kernel_id'][:12]}: {p['port']} -> {p['host']}:{p['host_port']}"
        for k in view.get("kernels", [])
        for p in k.get("ports") or []
    ]


# --- logs, exec ----------------------------------------------------------------------------------


async def cmd_logs(conn: Connection, args: argparse.Namespace) -> int:
    stop = interrupt_event()
    payload: dict[str, Any] = {"session_id": args.session_id, "follow": args.follow}
    if args.kernel:
        payload["kernel_id"] = args.kernel
    if args.tail is not None:
        if args.tail < 0:
            raise CliError(f"--tail {args.tail}: a number of lines >= 0")
        payload["tail"] = args.tail
    opened = await conn.request(SESSION_LOGS, payload)
    printed, stalled = 0, 0  # bytes of the logs printed (or dropped); reopens without progress
    while True:
        end = await read_stream(conn, opened, stop, skip=printed)
        if end.lost is None:
            break
        # The agent expired or evicted the stream: open it again where that gives the same
        # bytes (all the logs, not followed: skip what was printed), else say what is lost.
        stalled = stalled + 1 if end.cursor <= printed else 0
        if stalled >= MAX_REOPENS:
            raise CliError(f"logs of kernel {opened['kernel_id']}: {end.lost}")
        if args.follow:
            print(
                f"hoist: the log stream of kernel {opened['kernel_id']} was lost on its agent"
                " (unread for a while, or evicted to make room): output may be missing here;"
                " following new output",
                file=sys.stderr,
                flush=True,
            )
            payload["tail"], printed = 0, 0
        elif args.tail is None:
            printed = max(printed, end.cursor)
        else:
            raise CliError(
                f"logs of kernel {opened['kernel_id']}: the stream was lost on its agent after"
                f" {end.cursor} bytes (unread for a while, or evicted to make room), and the"
                f" last {args.tail} lines may differ now: run `hoist logs` again"
            )
        payload["kernel_id"] = opened["kernel_id"]  # the same kernel
        opened = await conn.request(SESSION_LOGS, payload)
    if end.interrupted:
        return INTERRUPTED
    if end.reason and not end.pipe_closed:
        raise CliError(f"logs of kernel {opened['kernel_id']}: {end.reason}")
    return 0


async def cmd_exec(conn: Connection, args: argparse.Namespace) -> int:
    if args.cmd is not None and args.words:
        raise CliError("give the command once: after SESSION, or after `--` when it has options")
    command = args.cmd if args.cmd is not None else args.words
    if not command:
        raise CliError("exec needs a command: hoist exec SESSION [--kernel K] -- CMD ...")
    if not args.timeout > 0:
        raise CliError(f"--timeout {args.timeout:g}: a number of seconds > 0")
    stop = interrupt_event()
    payload: dict[str, Any] = {
        "session_id": args.session_id,
        "command": command,
        "timeout": args.timeout,
    }
    if args.kernel:
        payload["kernel_id"] = args.kernel
    if env := parse_env(args.env or []):
        payload["env"] = env
    if workdir := parse_workdir(args.workdir):
        payload["workdir"] = workdir
    # The agent runs it for up to --timeout: wait for the stream's opening a bit longer.
    opened = await conn.request(SESSION_EXEC, payload, wait_s=30)
    end = await read_stream(conn, opened, stop)
    if end.interrupted:
        # Unread, the stream expires after idle_s and the agent kills the command then.
        print(
            f"hoist: interrupted; the command is killed when its stream expires"
            f" ({opened.get('idle_s', 30):g}s unread)",
            file=sys.stderr,
        )
        return INTERRUPTED
    if end.pipe_closed:
        return 0
    if end.lost is not None:
        # Closing the stream killed the command: its further output and exit code are gone.
        raise CliError(
            f"exec: the output stream was lost on the agent before the command ended (unread"
            f" for {opened.get('idle_s', 30):g}s, or evicted to make room): the rest of the"
            f" output and the exit code are lost, and the command was killed with its stream"
            f" ({end.lost})"
        )
    if end.reason:
        print(f"hoist: exec: {end.reason}", file=sys.stderr)
    if end.exit_code is None:
        return 1 if end.reason else 0
    return process_exit(end.exit_code)


# --- volumes -------------------------------------------------------------------------------------


async def cmd_volumes(conn: Connection, args: argparse.Namespace) -> int:
    payload = {"owner": args.owner} if args.owner else {}
    reply = await conn.request(VOLUME_LIST, payload, wait_s=20)
    if wants_json(args):
        print_json(reply)
        return 0
    from services.cli.read import _table

    rows = [
        [v["agent_id"], v["name"], v["owner"], ", ".join(k[:12] for k in v["used_by"]) or "-"]
        for v in reply["volumes"]
    ]
    console = output.console()
    console.print(_table(["agent", "name", "owner", "used by"], rows))
    note = f"{len(rows)} volume(s)"
    if reply.get("unreachable"):
        note += f"; not answering: {', '.join(reply['unreachable'])}"
    console.print(f"[dim]{note}[/dim]")
    return 0


async def cmd_volume_rm(conn: Connection, args: argparse.Namespace) -> int:
    payload: dict[str, Any] = {"name": args.name, "owner": args.owner}
    if args.agent:
        payload["agent_id"] = args.agent
    reply = await conn.request(VOLUME_REMOVE, payload, wait_s=20)
    if reply["removed"]:
        print(f"volume {args.name} removed from {', '.join(reply['removed'])}")
    for agent_id, why in sorted(reply["refused"].items()):
        print(f"hoist: volume {args.name} not removed from {agent_id}: {why}", file=sys.stderr)
    return 0 if reply["removed"] and not reply["refused"] else 1


async def _resolve_ids(conn: Connection, args: argparse.Namespace) -> None:
    """A session (and ``--kernel``) given by a unique prefix -> the whole id."""
    if getattr(args, "session_id", None):
        args.session_id = await ids.session_id(conn, args.session_id)
        if getattr(args, "kernel", None):
            args.kernel = await ids.kernel_id(conn, args.kernel, args.session_id)


# --- the parser ----------------------------------------------------------------------------------


def add_run_flags(run: argparse.ArgumentParser) -> None:
    """`hoist run`'s flags for what the kernels run (the rest are in main.build_parser)."""
    run.add_argument(
        "words",
        nargs="*",
        metavar="CMD",
        help="the command (after `--` when it has options: hoist run IMAGE -- sh -c '...')",
    )
    run.add_argument("--env", "-e", action="append", metavar="K=V", help="environment (repeat)")
    run.add_argument(
        "--port", "-p", action="append", metavar="PORT", help="a container port to publish"
    )
    run.add_argument(
        "--volume",
        "-v",
        action="append",
        metavar="NAME:/path[:ro]",
        help="a named volume on the agent (created on first use, kept)",
    )
    run.add_argument("--workdir", "-w", help="the command's working directory")
    run.add_argument(
        "--name",
        help="a name for the session, unique among yours that have not ended; every command"
        " that takes a session id takes it too",
    )
    run.add_argument(
        "--label",
        "-l",
        action="append",
        metavar="K=V",
        help="a label (repeat); shown by describe, filtered by ps -l and sessions -l",
    )
    run.add_argument(
        "--batch",
        action="store_true",
        help="run the command to completion; the session ends with it",
    )
    run.add_argument(
        "--cluster-mode",
        choices=("single-node", "multi-node"),
        default="multi-node",
        help="single-node: all kernels on one agent, on a private network (default multi-node)",
    )


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    connect: Connect,
    default_owner: str,
) -> None:
    def wrap(
        fn: Callable[[Connection, argparse.Namespace], Any],
    ) -> Callable[[argparse.Namespace], Any]:
        async def run(args: argparse.Namespace) -> int:
            async with connect(args) as conn:
                await _resolve_ids(conn, args)
                return int(await fn(conn, args))

        return run

    logs = sub.add_parser("logs", help="a kernel's output (stdout and stderr)")
    logs.add_argument("session_id", metavar="SESSION", help="a session id or its unique prefix")
    logs.add_argument(
        "--kernel", "-k", help="kernel id (or prefix) or hostname (main1, sub1); default main1"
    )
    logs.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    logs.set_defaults(func=wrap(cmd_logs))

    exec_p = sub.add_parser("exec", help="run a command in a running kernel: hoist exec S -- CMD")
    exec_p.add_argument("session_id", metavar="SESSION", help="a session id or its unique prefix")
    exec_p.add_argument("words", nargs="*", metavar="CMD", help="the command (after `--`)")
    exec_p.add_argument(
        "--kernel", "-k", help="kernel id (or prefix) or hostname (main1, sub1); default main1"
    )
    exec_p.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    exec_p.add_argument("--env", "-e", action="append", metavar="K=V")
    exec_p.add_argument("--workdir", "-w")
    exec_p.set_defaults(func=wrap(cmd_exec), cmd=None)

    volumes = sub.add_parser("volumes", help="the agents' named volumes")
    volumes.add_argument("--owner", help="only this owner's")
    add_output_flags(volumes, "the volumes")
    volumes.set_defaults(func=wrap(cmd_volumes))

    volume = sub.add_parser("volume", help="volume commands: rm")
    volume_sub = volume.add_subparsers(dest="volume_command", required=True)
    rm = volume_sub.add_parser("rm", help="remove a named volume no kernel uses")
    rm.add_argument("name")
    rm.add_argument("--agent", help="only on this agent (default: every live agent)")
    rm.add_argument(
        "--owner",
        default=default_owner,
        help=f"whose volume (default {default_owner}); refused where it is another owner's",
    )
    rm.set_defaults(func=wrap(cmd_volume_rm))
