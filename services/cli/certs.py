"""`hoist certs rotate`: new route certificates for the cluster stack of the data dir, which
its nodes reload without a restart (services/stack/certs.py; docs/cluster.md)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from client.connection import CliError
from services.stack.certs import rotate_route_certs
from services.stack.up import StackError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = sub.add_parser("certs", help="the route certificates of a cluster stack")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True)
    rotate = certs_sub.add_parser(
        "rotate",
        help="issue new route certificates (a new CA) and have every node reload them: no "
        "restart, no route dropped",
    )
    rotate.set_defaults(func=cmd_rotate)


async def cmd_rotate(args: argparse.Namespace) -> int:
    try:
        done = await asyncio.to_thread(
            rotate_route_certs, Path(args.data_dir), lambda line: print(line, flush=True)
        )
    except (StackError, OSError) as e:
        raise CliError(str(e)) from None
    print(
        f"done: every node presents route certificate {done.new_serial:x} (valid from "
        f"{done.not_before:%Y-%m-%d %H:%M} UTC) and trusts its new CA only; a route that "
        f"connects from now on with the old certificate ({done.old_serial:x}) is refused, "
        "and the routes that were up stayed up"
    )
    return 0
