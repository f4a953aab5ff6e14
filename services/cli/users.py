"""`hoist user add NAME [--admin] | disable NAME | list`: Hoist users (admin credentials).

Each sends the manager's ``hoist.admin.user.*`` request (domain.contracts.users), which records
the event (``hoist.events.user.<name>``).  A user's NATS user (their password, what lets them
connect) is the stack's: see ``hoist creds user NAME``."""

from __future__ import annotations

import argparse
from typing import Any

from domain.subjects import USER_ADD, USER_DISABLE, USER_LIST
from services.cli import connection as cli_nats
from services.cli.stack_url import stack_url


def register(subparsers: Any) -> None:
    user = subparsers.add_parser("user", help="Hoist users: add, disable, list (admin credentials)")
    sub = user.add_subparsers(dest="user_command", required=True)
    add = sub.add_parser("add", help="add a user, or enable a disabled one again")
    add.add_argument("name", help="letters, digits, '_' and '-' (a NATS subject token)")
    add.add_argument("--admin", action="store_true", help="may also send admin commands")
    add.set_defaults(func=cmd_add)
    disable = sub.add_parser("disable", help="disable a user: they may no longer connect")
    disable.add_argument("name")
    disable.set_defaults(func=cmd_disable)
    ls = sub.add_parser("list", help="every user, disabled ones too")
    ls.set_defaults(func=cmd_list)


async def _ask(subject: str, request: dict[str, Any], args: argparse.Namespace) -> Any:
    return await cli_nats.ask(stack_url(args, "admin"), subject, request, 30)


def user_text(user: dict[str, Any]) -> str:
    role = "admin" if user["admin"] else "user"
    state = "enabled" if user["enabled"] else "disabled"
    return f"{user['name']}: {role}, {state} (by {user['by']})"


async def cmd_add(args: argparse.Namespace) -> None:
    reply = await _ask(USER_ADD, {"name": args.name, "admin": args.admin}, args)
    done = "added" if reply["recorded"] else "unchanged"
    print(f"user {done}: {user_text(reply['user'])}")


async def cmd_disable(args: argparse.Namespace) -> None:
    reply = await _ask(USER_DISABLE, {"name": args.name}, args)
    print(f"user disabled: {user_text(reply['user'])}")


async def cmd_list(args: argparse.Namespace) -> None:
    reply = await _ask(USER_LIST, {}, args)
    if not reply["users"]:
        print("no user: add one with `hoist user add NAME`")
    for u in reply["users"]:
        print(user_text(u))
