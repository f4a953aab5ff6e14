"""`hoist quota show|set|rm`: resource policies and per-user quotas (admin credentials).

Named ``quota`` so it is never taken for ``hoist image policy`` (prepull policies).  They send
the manager's ``hoist.admin.quota.*`` requests (domain.contracts.quotas)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from client import connection as cli_nats
from client.connection import CliError, login_name
from domain.subjects import QUOTA_MINE, QUOTA_REMOVE, QUOTA_SET, QUOTA_SHOW
from services.cli.connected import connected
from services.cli.images import parse_size
from services.cli.output import add_output_flags, print_json, wants_json
from services.cli.stack_url import stack_url

_LIMITS = (
    "max_cpu",
    "max_mem",
    "max_slots",
    "max_sessions",
    "max_kernels_per_session",
    "max_lifetime_s",
    "idle_timeout_s",
)


def register(subparsers: Any) -> None:
    # ``policy``: the name a keypair's resource policy goes by in Backend.AI
    quota = subparsers.add_parser(
        "quota",
        aliases=["policy"],
        help="resource policies: per-user quotas (admin credentials; mine: any user)",
    )
    sub = quota.add_subparsers(dest="quota_command", required=True)
    show = sub.add_parser("show", help="the policies, and each user's effective policy and usage")
    show.add_argument("owner", nargs="?", help="one user (default: every user holding or waiting)")
    add_output_flags(show, "the policies and usage")
    show.set_defaults(func=cmd_show)
    mine = sub.add_parser("mine", help="your own quota and usage (any user)")
    mine.add_argument("--owner", help="whose (the client role only; default: you)")
    add_output_flags(mine, "the quota and usage")
    mine.set_defaults(func=cmd_mine)
    qset = sub.add_parser(
        "set", help="create or replace a user's policy, or 'default' (unset limits: unlimited)"
    )
    qset.add_argument("name", help="a user (letters, digits, '_' or '-') or default")
    qset.add_argument("--cpu", type=_amount, help="cores held at once")
    qset.add_argument("--mem", help="memory held at once, e.g. 8g")
    qset.add_argument(
        "--slot", action="append", default=[], metavar="NAME=AMOUNT", help="e.g. gpu=1"
    )
    qset.add_argument("--sessions", type=int, help="sessions holding resources at once")
    qset.add_argument("--kernels", type=int, help="kernels per session")
    qset.add_argument("--lifetime", type=float, help="seconds an interactive session may run")
    qset.add_argument(
        "--idle",
        type=float,
        metavar="SECONDS",
        help="seconds an interactive session may go unused (no get, logs, exec, stream read)",
    )
    qset.set_defaults(func=cmd_set)
    rm = sub.add_parser("rm", help="remove a policy (the user falls back to default)")
    rm.add_argument("name")
    rm.set_defaults(func=cmd_rm)


def request_from(args: argparse.Namespace) -> dict[str, Any]:
    slots: dict[str, float] = {}
    for item in args.slot:
        name, sep, amount = item.partition("=")
        try:
            slots[name.strip()] = _amount(amount)
        except argparse.ArgumentTypeError:
            sep = ""
        if not sep or not name.strip():
            raise CliError(f"--slot {item}: give NAME=AMOUNT with a finite AMOUNT, e.g. gpu=1")
        if name.strip() in ("cpu", "mem"):
            raise CliError(f"--slot {item}: cpu and mem have their own flags, --cpu and --mem")
    out: dict[str, Any] = {
        "name": args.name,
        "max_cpu": args.cpu,
        "max_mem": None if args.mem is None else parse_size(args.mem, "--mem"),
        "max_slots": slots,
        "max_sessions": args.sessions,
        "max_kernels_per_session": args.kernels,
        "max_lifetime_s": args.lifetime,
        "idle_timeout_s": args.idle,
    }
    return {k: v for k, v in out.items() if v is not None}


async def _ask(subject: str, request: dict[str, Any], args: argparse.Namespace) -> Any:
    return await cli_nats.ask(stack_url(args, "admin"), subject, request, 30)


def describe(limits: dict[str, Any] | None) -> str:
    if limits is None:
        return "unlimited"
    parts = []
    if limits.get("max_cpu") is not None:
        parts.append(f"cpu {limits['max_cpu']:g}")
    if limits.get("max_mem") is not None:
        parts.append(f"mem {_size(limits['max_mem'])}")
    parts += [f"{k} {v:g}" for k, v in sorted((limits.get("max_slots") or {}).items())]
    if limits.get("max_sessions") is not None:
        parts.append(f"sessions {limits['max_sessions']}")
    if limits.get("max_kernels_per_session") is not None:
        parts.append(f"kernels/session {limits['max_kernels_per_session']}")
    if limits.get("max_lifetime_s") is not None:
        parts.append(f"lifetime {limits['max_lifetime_s']:g}s")
    if limits.get("idle_timeout_s") is not None:
        parts.append(f"idle {limits['idle_timeout_s']:g}s")
    return ", ".join(parts) or "unlimited"


def _size(n: int) -> str:
    for unit, name in ((2**40, "T"), (2**30, "G"), (2**20, "M"), (2**10, "K")):
        if n >= unit:
            return f"{round(n / unit, 2):g}{name}"
    return f"{n}B"


def usage_line(usage: dict[str, Any]) -> str:
    parts = [f"cpu {usage['cpu']:g}", f"mem {_size(usage['mem'])}"]
    parts += [f"{k} {v:g}" for k, v in sorted(usage["slots"].items())]
    parts.append(f"sessions {usage['sessions']}")
    return ", ".join(parts)


async def cmd_show(args: argparse.Namespace) -> None:
    reply = await _ask(QUOTA_SHOW, {} if args.owner is None else {"owner": args.owner}, args)
    if wants_json(args):
        print_json(reply)
        return
    print("policies:")
    for p in reply["policies"]:
        state = " (removed)" if p["removed"] else ""
        print(f"  {p['name']}{state}: {describe(p)}")
    if not reply["policies"]:
        print("  none (every user is unlimited)")
    for row in reply["owners"]:
        print(owner_line(row))


async def cmd_mine(args: argparse.Namespace) -> None:
    async with connected(args) as conn:  # a user's own subject: the manager fills in owner
        reply = await conn.request(QUOTA_MINE, {"owner": args.owner or login_name()})
    if wants_json(args):
        print_json(reply)
        return
    print(owner_line(reply))


def owner_line(row: dict[str, Any]) -> str:
    policy = row["policy"] or "none"
    return (
        f"{row['owner']}: policy {policy} ({describe(row['quota'])});"
        f" using {usage_line(row['usage'])}; {row['pending']} pending"
    )


async def cmd_set(args: argparse.Namespace) -> None:
    reply = await _ask(QUOTA_SET, request_from(args), args)
    done = "recorded" if reply["recorded"] else "unchanged"
    print(f"quota {args.name} {done}: {describe(reply['policy'])}")


async def cmd_rm(args: argparse.Namespace) -> None:
    await _ask(QUOTA_REMOVE, {"name": args.name}, args)
    print(f"quota {args.name} removed")


def _amount(text: str) -> float:
    """A finite number: ``nan`` or ``inf`` would reach the manager as no limit at all."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is no limit: give a finite number")
    return value
