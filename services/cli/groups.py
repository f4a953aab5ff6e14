"""`hoist group list|set|rm`: resource groups and who may use each (admin credentials).

Agents join a group with ``hoist agent --resource-group``; a session asks for one with ``hoist
run --resource-group``.  These send the manager's ``hoist.admin.group.*`` requests
(domain.contracts.groups; domain.resource_group says how access applies)."""

from __future__ import annotations

import argparse
from typing import Any

from client import connection as cli_nats
from domain.subjects import GROUP_LIST, GROUP_REMOVE, GROUP_SET
from services.cli.output import add_output_flags, print_json, wants_json
from services.cli.quotas import describe
from services.cli.stack_url import stack_url


def register(subparsers: Any) -> None:
    group = subparsers.add_parser(
        "group", help="resource groups: who may create sessions in each (admin credentials)"
    )
    sub = group.add_subparsers(dest="group_command", required=True)
    ls = sub.add_parser("list", help="every group: who may use it, its live agents")
    add_output_flags(ls, "the groups")
    ls.set_defaults(func=cmd_list)
    gset = sub.add_parser(
        "set",
        help="define who may use a group (replaces its definition; no --user and no --public:"
        " nobody)",
    )
    gset.add_argument("name", help="the group, as agents join it (--resource-group)")
    gset.add_argument(
        "--user",
        action="append",
        default=[],
        dest="members",  # not `user`: that is the top-level --user, who acts
        metavar="USER",
        help="a user (owner) allowed",
    )
    gset.add_argument("--public", action="store_true", help="open to every user")
    gset.add_argument("--description", default="", help="what the group is for")
    gset.set_defaults(func=cmd_set)
    rm = sub.add_parser("rm", help="remove a group's definition: it is open to every user again")
    rm.add_argument("name")
    rm.set_defaults(func=cmd_rm)


async def _ask(subject: str, request: dict[str, Any], args: argparse.Namespace) -> Any:
    return await cli_nats.ask(stack_url(args, "admin"), subject, request, 30)


def access_text(group: dict[str, Any]) -> str:
    if group["access"] == "users":
        return "users " + ", ".join(group["users"])
    if group["access"] == "nobody":
        return "nobody"
    if group["public"]:
        return "everyone (public)"
    if group["removed"]:
        return "everyone (definition removed)"
    return "everyone (not defined)"


def agents_text(group: dict[str, Any]) -> str:
    agents = group["agents"]
    if not agents:
        text = "no live agent"
    else:
        names = ", ".join(a["agent_id"] for a in agents)
        text = f"{len(agents)} live ({names}): {describe(_limits(group['capacity']))}"
    if group["lost_agents"]:
        text += f"; {group['lost_agents']} lost"
    return text


def _limits(capacity: dict[str, Any]) -> dict[str, Any]:
    """A capacity in the shape services.cli.quotas.describe prints."""
    return {"max_cpu": capacity["cpu"], "max_mem": capacity["mem"], "max_slots": capacity["slots"]}


async def cmd_list(args: argparse.Namespace) -> None:
    reply = await _ask(GROUP_LIST, {}, args)
    if wants_json(args):
        print_json(reply)
        return
    if not reply["groups"]:
        print("no group: no agent joined one and no admin defined one")
    for g in reply["groups"]:
        about = f" ({g['description']})" if g["description"] else ""
        print(f"{g['name']}{about}: {access_text(g)}; agents: {agents_text(g)}")


async def cmd_set(args: argparse.Namespace) -> None:
    request: dict[str, Any] = {"name": args.name, "users": args.members, "public": args.public}
    if args.description:
        request["description"] = args.description
    reply = await _ask(GROUP_SET, request, args)
    done = "recorded" if reply["recorded"] else "unchanged"
    print(f"group {args.name} {done}: {access_text(reply['group'])}")


async def cmd_rm(args: argparse.Namespace) -> None:
    await _ask(GROUP_REMOVE, {"name": args.name}, args)
    print(f"group {args.name} removed: open to every user again")
