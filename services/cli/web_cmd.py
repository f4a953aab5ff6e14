"""`hoist web`: the web view in the foreground, against the data dir's stack (or
$HOIST_NATS_URL), as its admin role; `hoist up` already starts one (its URL is in the banner)."""

from __future__ import annotations

import argparse
import os
import sys

from services.cli.stack_url import stack_url


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    web = sub.add_parser("web", help="serve the web view (fleet, sessions, pulls) in a browser")
    web.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    web.add_argument("--port", type=int, default=8642, help="port (default 8642; 0: any free)")
    web.set_defaults(func=cmd_web)


async def cmd_web(args: argparse.Namespace) -> int:
    url = stack_url(args, "admin")
    argv = [sys.executable, "-m", "services.web", "--host", args.host, "--port", str(args.port)]
    # The URL (with its password) goes through the environment: none in `ps` output.
    os.execve(sys.executable, argv, {**os.environ, "HOIST_NATS_URL": url})
