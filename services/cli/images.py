"""`hoist image preload|unload|job|policy ...` and `hoist sync-agents`: the fleet's images from
the command line (admin credentials).  ``register(subparsers)`` adds them to the `hoist` parser
(services.cli); they send the manager's ``hoist.admin.image.*`` / ``hoist.admin.agent.sync``
requests (services.images_admin, services.prepull, services.agent_sync)."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from typing import Any

from client import connection as cli_nats
from client.connection import CliError
from domain.image_ref import familiar
from domain.subjects import (
    AGENT_SYNC,
    JOB,
    POLICY_LIST,
    POLICY_PLAN,
    POLICY_REMOVE,
    POLICY_SET,
    PRELOAD,
    UNLOAD,
)
from services.cli.output import add_output_flags, print_json, wants_json
from services.cli.stack_url import stack_url

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def register(subparsers: Any) -> None:
    image = subparsers.add_parser("image", help="images across the fleet (admin credentials)")
    sub = image.add_subparsers(dest="image_command", required=True)

    preload = sub.add_parser("preload", help="pull images onto agents ahead of any session")
    preload.add_argument("images", nargs="+")
    _targets(preload)
    preload.add_argument("--parallelism", type=int, default=4, help="agents pulling at once")
    preload.add_argument("--timeout", type=float, default=600.0, help="seconds per agent")
    preload.add_argument("--backoff-limit", type=int, default=3, help="retries per agent")
    preload.add_argument("--detach", "-d", action="store_true", help="print the job id and exit")
    preload.set_defaults(func=cmd_preload)

    job = sub.add_parser("job", help="a preload job's state per agent")
    job.add_argument("job_id")
    add_output_flags(job, "the job")
    job.set_defaults(func=cmd_job)

    unload = sub.add_parser("unload", help="remove images from agents (refused where needed)")
    unload.add_argument("images", nargs="+")
    _targets(unload)
    add_output_flags(unload, "what each agent did")
    unload.set_defaults(func=cmd_unload)

    policy = sub.add_parser("policy", help="prepull policies: which images agents should hold")
    psub = policy.add_subparsers(dest="policy_command", required=True)
    pset = psub.add_parser("set", help="create or replace a policy (then the fleet converges)")
    pset.add_argument("name")
    pset.add_argument(
        "--newest-tags", action="append", default=[], metavar="REPO=N", help="e.g. ml/torch=3"
    )
    pset.add_argument(
        "--large-recent",
        action="append",
        default=[],
        metavar="SIZE,DAYS",
        help="images of at least SIZE used in the last DAYS days, e.g. 2g,7",
    )
    pset.add_argument("--images", action="append", default=[], metavar="A,B", help="these images")
    pset.add_argument("--resource-group", action="append", default=[], help="default: every one")
    pset.add_argument("--priority", type=int, default=0, help="higher first when disks are short")
    pset.add_argument("--dry-run", action="store_true", help="show the plan, record nothing")
    pset.set_defaults(func=cmd_policy_set)
    premove = psub.add_parser("remove", help="remove a policy (its images lose their pins)")
    premove.add_argument("name")
    premove.add_argument("--dry-run", action="store_true")
    premove.set_defaults(func=cmd_policy_remove)
    plist = psub.add_parser("list", help="the policies (JSON lines; -o json: one document)")
    add_output_flags(plist, "the policies")
    plist.set_defaults(func=cmd_policy_list)
    plan = psub.add_parser("plan", help="each agent's plan now")
    add_output_flags(plan, "the plans")
    plan.set_defaults(func=cmd_policy_plan)

    sync = subparsers.add_parser(
        "sync-agents", help="reconcile agents' containers with the manager's view (admin)"
    )
    sync.add_argument("agent_ids", nargs="*", help="default: every live agent")
    add_output_flags(sync, "what each agent did")
    sync.set_defaults(func=cmd_sync)


def _targets(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--agent", action="append", help="an agent id (repeatable)")
    group.add_argument("--resource-group", help="every live agent of this group")
    group.add_argument("--all", action="store_true", help="every live agent")


def _target(args: argparse.Namespace) -> dict[str, Any]:
    if args.agent:
        return {"agents": args.agent}
    if args.resource_group:
        return {"resource_group": args.resource_group}
    return {"all": True}


def parse_size(value: str, what: str) -> int:
    m = _SIZE.match(value)
    if not m:
        raise CliError(f"{what}: {value!r} is not a size like 500m or 2g")
    return int(float(m[1]) * _UNITS[m[2].lower()])


def rules_from(args: argparse.Namespace) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for spec in args.images:
        rules.append({"kind": "images", "images": [i for i in spec.split(",") if i]})
    for spec in args.newest_tags:
        repo, sep, count = spec.rpartition("=")
        if not sep or not repo or not count.isdigit():
            raise CliError(f"--newest-tags {spec!r} is not REPO=N (e.g. ml/torch=3)")
        rules.append({"kind": "newest-tags", "repository": repo, "count": int(count)})
    for spec in args.large_recent:
        size, sep, days = spec.partition(",")
        try:
            day_count = float(days)
        except ValueError:
            day_count = -1.0
        if not sep or day_count <= 0:
            raise CliError(f"--large-recent {spec!r} is not SIZE,DAYS (e.g. 2g,7)")
        rules.append(
            {"kind": "large-recent", "min_bytes": parse_size(size, "--large-recent"),
             "days": day_count}
        )  # fmt: skip
    if not rules:
        raise CliError("give at least one rule: --newest-tags, --large-recent or --images")
    return rules


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.0f} MiB"


async def _ask(subject: str, request: dict[str, Any], args: argparse.Namespace) -> Any:
    return await cli_nats.ask(stack_url(args, "admin"), subject, request, 60)


def print_job(job: dict[str, Any]) -> None:
    o = job["overall"]
    pct = 100 * o["current"] / o["total"] if o["total"] else 0.0
    print(
        f"job {job['job_id']} {job['state']}: {o['succeeded']}/{o['agents']} agents done,"
        f" {o['failed']} failed, {o['pulling']} pulling, {o['waiting']} waiting,"
        f" {_gib(o['current'])} / {_gib(o['total'])} ({pct:.0f} %)"
    )
    for agent_id, a in job["agents"].items():
        line = f"  {agent_id:<16} {a['state']:<10}"
        done = sum(i["current"] for i in a["images"].values())
        total = sum(i["total"] for i in a["images"].values())
        if total:
            line += f" {_gib(done)} / {_gib(total)}"
        if a.get("reason"):
            line += f"  {a['reason']}"
        print(line)


async def cmd_preload(args: argparse.Namespace) -> int:
    request = {
        "images": args.images,
        **_target(args),
        "parallelism": args.parallelism,
        "timeout": args.timeout,
        "backoff_limit": args.backoff_limit,
    }
    job = await _ask(PRELOAD, request, args)
    if args.detach:
        print(job["job_id"])
        return 0
    while job["state"] == "running":
        await asyncio.sleep(1.0)
        job = await _ask(JOB, {"job_id": job["job_id"]}, args)
    print_job(job)
    return 1 if job["overall"]["failed"] else 0


async def cmd_job(args: argparse.Namespace) -> None:
    job = await _ask(JOB, {"job_id": args.job_id}, args)
    if wants_json(args):
        print_json(job)
        return
    print_job(job)


async def cmd_unload(args: argparse.Namespace) -> None:
    reply = await _ask(UNLOAD, {"images": args.images, **_target(args)}, args)
    if wants_json(args):
        print_json(reply)
        return
    for agent_id, images in reply["agents"].items():
        for image, r in images.items():
            what = "removed" if r["removed"] else f"kept: {r.get('reason', '')}"
            print(f"{agent_id:<16} {familiar(image):<40} {what}")


def print_plans(plans: dict[str, Any]) -> None:
    for agent_id, p in plans.items():
        print(
            f"{agent_id:<16} budget {_gib(p['budget'])}, wants {len(p['desired'])} image(s)"
            f" ({_gib(p['bytes'])}), to pull: {', '.join(map(familiar, p['to_pull'])) or 'nothing'}"
        )
        for w in p["desired"]:
            print(f"  + {familiar(w['image'])} ({_gib(w['size_bytes'])}; {w['why']})")
        for s in p["skipped"]:
            print(f"  - {familiar(s['image'])}: {s['why']}")


async def cmd_policy_set(args: argparse.Namespace) -> None:
    request = {
        "name": args.name,
        "rules": rules_from(args),
        "resource_groups": args.resource_group,
        "priority": args.priority,
        "dry_run": args.dry_run,
    }
    reply = await _ask(POLICY_SET, request, args)
    print_plans(reply["plans"])
    print(
        "dry run: nothing recorded, nothing pulled"
        if args.dry_run
        else f"policy {args.name} {'recorded' if reply['recorded'] else 'unchanged'};"
        " agents converge now"
    )


async def cmd_policy_remove(args: argparse.Namespace) -> None:
    reply = await _ask(POLICY_REMOVE, {"name": args.name, "dry_run": args.dry_run}, args)
    print_plans(reply["plans"])
    print("dry run: nothing recorded" if args.dry_run else f"policy {args.name} removed")


async def cmd_policy_list(args: argparse.Namespace) -> None:
    reply = await _ask(POLICY_LIST, {}, args)
    if wants_json(args):
        print_json(reply)
        return
    for p in reply["policies"]:
        print(json.dumps(p))


async def cmd_policy_plan(args: argparse.Namespace) -> None:
    reply = await _ask(POLICY_PLAN, {}, args)
    if wants_json(args):
        print_json(reply)
        return
    print_plans(reply["plans"])
    print("converged" if reply["converged"] else "converging")


async def cmd_sync(args: argparse.Namespace) -> None:
    request = {"agent_ids": args.agent_ids} if args.agent_ids else {}
    reply = await _ask(AGENT_SYNC, request, args)
    if wants_json(args):
        print_json(reply)
        return
    for agent_id, r in reply["agents"].items():
        if "error" in r:
            print(f"{agent_id:<16} not synced: {r['error']}")
            continue
        spared = r.get("spared", [])
        print(
            f"{agent_id:<16} {len(r['running'])} running; ended (container gone):"
            f" {', '.join(r['repaired']) or 'none'}; unknown containers destroyed:"
            f" {', '.join(r['destroyed']) or 'none'}"
            + (f"; kept, created past the manager's view: {', '.join(spared)}" if spared else "")
        )
