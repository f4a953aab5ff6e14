"""`hoist web`: the web view in the foreground, against the data dir's stack (or
$HOIST_NATS_URL), as its admin role; `hoist up` already starts one (its URL is in the banner)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from client.connection import CliError
from services.cli.stack_url import stack_url
from services.stack import up as stack
from services.stack.home import start_command


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    web = sub.add_parser("web", help="serve the web view (fleet, sessions, pulls) in a browser")
    web.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    web.add_argument("--port", type=int, default=8642, help="port (default 8642; 0: any free)")
    web.add_argument(
        "--url",
        action="store_true",
        help="print the address of the web view `hoist up` started, with the token that logs"
        " you in as its admin, and serve none",
    )
    web.set_defaults(func=cmd_web)


async def cmd_web(args: argparse.Namespace) -> int:
    if args.url:
        print(web_url(Path(args.data_dir)))
        return 0
    url = stack_url(args, "admin")
    argv = [sys.executable, "-m", "services.web", "--host", args.host, "--port", str(args.port)]
    # The URL (with its password) goes through the environment: none in `ps` output.
    os.execve(sys.executable, argv, {**os.environ, "HOIST_NATS_URL": url})


def web_url(data_dir: Path) -> str:
    """The login address of the web view of the stack in ``data_dir``."""
    info = stack.StackInfo.read(data_dir)
    if info is None or not info.alive():
        raise CliError(
            f"no Hoist stack runs in {data_dir}: start one with `{start_command(data_dir)}`"
            " (it starts the web view)"
        )
    if not info.web_url:
        raise CliError(
            f"the Hoist stack in {data_dir} runs no web view (started with --no-web):"
            " `hoist web` serves one in the foreground"
        )
    return info.web_login(data_dir)
