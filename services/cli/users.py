"""`hoist user add NAME [--admin] | disable NAME | list`: Hoist users (admin credentials).

Each sends the manager's ``hoist.admin.user.*`` request (domain.contracts.users), which records
the event (``hoist.events.user.<name>``).  A user's NATS user (their password, what lets them
connect) lives in the stack's auth config, which only the stack's host can write: the manager
may run elsewhere.  So once the manager recorded an add or a disable, this command, when the
stack in ``--data-dir`` runs here (and HOIST_NATS_URL, if set, names that stack), also writes
the user's NATS user into that stack's credentials.json and auth.conf (or removes it) and has
nats-server reload its users, as ``hoist creds agent`` does: nothing restarts.  Otherwise it
says so; run the same command on the stack's host.  ``hoist creds user NAME`` prints the URL."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from client import connection as cli_nats
from domain.subjects import USER_ADD, USER_DISABLE, USER_LIST
from services.cli.output import add_output_flags, print_json, wants_json
from services.cli.stack_url import stack_url
from services.stack import up as stack
from transport.client import server_list


def register(subparsers: Any) -> None:
    user = subparsers.add_parser("user", help="Hoist users: add, disable, list (admin credentials)")
    sub = user.add_subparsers(dest="user_command", required=True)
    add = sub.add_parser("add", help="add a user, or enable a disabled one again")
    add.add_argument("name", help="letters, digits, '_' and '-' (a NATS subject token)")
    add.add_argument(
        "--admin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="may also send admin commands (--no-admin: may not); left out, a user added before"
        " keeps theirs",
    )
    add.set_defaults(func=cmd_add)
    disable = sub.add_parser("disable", help="disable a user: they may no longer connect")
    disable.add_argument("name")
    disable.set_defaults(func=cmd_disable)
    ls = sub.add_parser("list", help="every user, disabled ones too")
    add_output_flags(ls, "the users")
    ls.set_defaults(func=cmd_list)


async def _ask(subject: str, request: dict[str, Any], args: argparse.Namespace) -> Any:
    return await cli_nats.ask(stack_url(args, "admin"), subject, request, 30)


def user_text(user: dict[str, Any]) -> str:
    role = "admin" if user["admin"] else "user"
    state = "enabled" if user["enabled"] else "disabled"
    return f"{user['name']}: {role}, {state} (by {user['by']})"


async def cmd_add(args: argparse.Namespace) -> None:
    request = {"name": args.name} | ({} if args.admin is None else {"admin": args.admin})
    reply = await _ask(USER_ADD, request, args)
    print(f"user {_what_add_did(reply)}: {user_text(reply['user'])}")
    print(_apply_to_local_stack(args, args.name, reply["user"]["admin"]))


def _what_add_did(reply: dict[str, Any]) -> str:
    before = reply.get("before")  # None from a manager before it was sent, too
    if not reply["recorded"]:
        return "unchanged"
    if before is None:
        return "added"
    if before["enabled"]:
        return "changed"
    return "enabled again" + (
        ", admin flag changed" if before["admin"] != reply["user"]["admin"] else ""
    )


async def cmd_disable(args: argparse.Namespace) -> None:
    reply = await _ask(USER_DISABLE, {"name": args.name}, args)
    print(f"user disabled: {user_text(reply['user'])}")
    print(_apply_to_local_stack(args, args.name, None))


def _apply_to_local_stack(args: argparse.Namespace, name: str, admin: bool | None) -> str:
    """Write (``admin`` a bool) or remove (None) the user's NATS user on the stack in the data
    dir when it runs here and is the one the command went to; what was done, as a line."""
    data_dir = Path(args.data_dir)
    info = stack.StackInfo.read(data_dir)
    env = os.environ.get("HOIST_NATS_URL")
    if info is None or not info.alive() or (env and not _same_server(env, info.url)):
        return (
            f"NATS user: unchanged (no stack of this NATS server runs in {data_dir}): run this"
            " on the stack's host with its --data-dir"
        )
    if admin is None:
        stack.remove_hoist_user(data_dir, info, name)
        return "NATS user: removed, nats-server reloaded (its connections are closed)"
    stack.set_hoist_user(data_dir, info, name, admin)
    return f"NATS user: written, nats-server reloaded; its URL: hoist creds user {name}"


def _same_server(a: str, b: str) -> bool:
    def servers(url: str) -> set[tuple[str | None, int]]:
        return {(p.hostname, p.port or 4222) for p in map(urlsplit, server_list(url))}

    return bool(servers(a) & servers(b))  # one server in common: the same cluster


async def cmd_list(args: argparse.Namespace) -> None:
    reply = await _ask(USER_LIST, {}, args)
    if wants_json(args):
        print_json(reply)
        return
    if not reply["users"]:
        print("no user: add one with `hoist user add NAME`")
    for u in reply["users"]:
        print(user_text(u))
