"""`hoist describe SESSION` (also `hoist inspect`): one session whole, as `kubectl describe`
and `docker inspect` show theirs: the spec, each kernel (where, status and why, exit code, how
long it ran, container, published ports, the HOIST_* variables it gets, its pull and how far it
is), the owner's quota use, and the session's last events with who caused them.  ``-o json``:
the same as one document.

Each part comes from where it is kept: the session from the manager (what the log holds), a
pull's progress from the progress stream, the events from the log; a part that cannot be had
(the quota, asked with credentials that may not) is said, and the rest is still shown."""

from __future__ import annotations

import argparse
import shlex
from collections import deque
from typing import Any

import msgspec

from client import session_log
from client.connection import CliError, Connection
from client.events import describe as describe_event
from domain.session import hoist_env
from domain.subjects import QUOTA_MINE, SESSION_GET
from services.cli import ids
from services.cli.connected import connected
from services.cli.history import format_event
from services.cli.kernels import port_lines
from services.cli.output import add_output_flags, human_bytes, print_json, wants_json
from services.cli.quotas import owner_line
from transport import progress as progress_stream

LAST_EVENTS = 10
MAX_EVENTS = 10_000


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "describe",
        aliases=["inspect"],
        help="one session whole: spec, kernels, quota use, last events",
    )
    p.add_argument("session_id", metavar="SESSION", help="a session id or its prefix")
    p.add_argument(
        "--events",
        type=int,
        default=LAST_EVENTS,
        metavar="N",
        help=f"how many of its last events to show (default {LAST_EVENTS})",
    )
    add_output_flags(p, "the session")
    p.set_defaults(func=cmd_describe)


async def cmd_describe(args: argparse.Namespace) -> None:
    if not 0 <= args.events <= MAX_EVENTS:
        raise CliError(f"--events {args.events}: a number of events from 0 to {MAX_EVENTS}")
    async with connected(args) as conn:
        session_id = await ids.session_id(conn, args.session_id)
        doc = await gather(conn, session_id, args.events)
    if wants_json(args):
        print_json(doc)
    else:
        print("\n".join(text_lines(doc)))


async def gather(conn: Connection, session_id: str, last: int) -> dict[str, Any]:
    """The describe document: the manager's session view, each kernel with its HOIST_* env
    and its pull's last progress, the owner's quota row, and the last ``last`` events."""
    view: dict[str, Any] = await conn.request(SESSION_GET, {"session_id": session_id})
    hostnames = {k["kernel_id"]: k["hostname"] for k in view["kernels"]}
    js = conn.nc.jetstream()
    for kernel in view["kernels"]:
        kid = kernel["kernel_id"]
        kernel["env"] = hoist_env(session_id, kid, view["cluster_mode"], hostnames)
        kernel["pull"] = None
        if kernel["status"] == "PULLING" and kernel["agent_id"] and kernel["pull_task_id"]:
            try:
                progress = await progress_stream.latest(
                    js, kernel["agent_id"], kernel["pull_task_id"]
                )
            except Exception as e:  # the rest is still worth showing
                kernel["pull"] = {"error": f"progress not available: {e}"}
            else:
                kernel["pull"] = None if progress is None else msgspec.to_builtins(progress)
    try:
        quota: dict[str, Any] | None = await conn.request(QUOTA_MINE, {"owner": view["owner"]})
        quota_error = None
    except CliError as e:
        quota, quota_error = None, str(e)
    events: deque[dict[str, Any]] = deque(maxlen=last) if last else deque(maxlen=0)
    lines: deque[str] = deque(maxlen=last) if last else deque(maxlen=0)
    count = 0
    async for rec in session_log.records(conn, session_id, follow=False):
        count += 1
        events.append(describe_event(rec))
        lines.append(format_event(rec))
    return {
        **view,
        "quota": quota,
        "quota_error": quota_error,
        "events_total": count,
        "events": list(events),
        "event_lines": list(lines),
    }


def text_lines(doc: dict[str, Any]) -> list[str]:
    """What a person reads: a heading per part, a field per line."""
    spec = doc["spec"]
    res = doc["resources"]
    out = [
        f"Session:     {doc['session_id']}",
        f"Name:        {doc.get('name') or '-'}",
        "Labels:      "
        + (",".join(f"{k}={v}" for k, v in sorted((doc.get("labels") or {}).items())) or "-"),
        f"Owner:       {doc['owner']}",
        f"Status:      {doc['status']}  ({doc['status_info']})",
        f"Image:       {doc['image']}",
        f"Type:        {doc['session_type']}, cluster {doc['cluster_mode']} of"
        f" {doc['cluster_size']} kernel(s), resource group {doc['resource_group']}",
        f"Resources:   {_resources(res)} (each kernel)",
        "Command:     " + (shlex.join(spec["command"]) if spec.get("command") else "(the image's)"),
    ]
    if spec.get("workdir"):
        out.append(f"Workdir:     {spec['workdir']}")
    env = spec.get("env") or {}
    out.append("Env:         " + (" ".join(f"{k}={v}" for k, v in sorted(env.items())) or "-"))
    ports = spec.get("ports") or []
    out.append("Ports:       " + (" ".join(str(p) for p in ports) or "-"))
    mounts = spec.get("mounts") or []
    out.append(
        "Volumes:     "
        + (
            " ".join(
                f"{m['volume']}:{m['path']}{':ro' if m.get('read_only') else ''}" for m in mounts
            )
            or "-"
        )
    )
    if doc.get("request_id"):
        out.append(f"Request id:  {doc['request_id']}")
    out.append("Kernels:")
    published = port_lines(doc)
    for k in doc["kernels"]:
        out.append(
            f"  {k['hostname']:<6} {k['kernel_id']}  on {k['agent_id'] or '(not placed)'}"
            f"  {k['status']}  ({k['status_info']})"
        )
        if k.get("container_id"):
            out.append(f"         container {k['container_id'][:12]}")
        if k.get("exit_code") is not None or k.get("ran_s") is not None:
            ended = []
            if k.get("exit_code") is not None:
                ended.append(f"exit code {k['exit_code']}")
            if k.get("ran_s") is not None:
                ended.append(f"ran {k['ran_s']:.1f} s")
            out.append("         " + ", ".join(ended))
        for line in published:
            if line.startswith(f"{k['hostname']}:"):
                out.append(f"         port {line.split(': ', 1)[1]}")
        if k["status"] == "PULLING" and k.get("pull_task_id"):
            out.append(f"         pull {k['pull_task_id']}{_pull(k.get('pull'))}")
        out.append("         " + " ".join(f"{n}={v}" for n, v in k["env"].items()))
    out.append("Quota:")
    if doc["quota"] is not None:
        out.append(f"  {owner_line(doc['quota'])}")
    else:
        out.append(f"  not available: {doc['quota_error']}")
    shown = len(doc["event_lines"])
    out.append(f"Events (the last {shown} of {doc['events_total']}; all: hoist history):")
    out.extend(f"  {line}" for line in doc["event_lines"])
    return out


def _resources(res: dict[str, Any]) -> str:
    parts = [f"cpu={res['cpu']:g}", f"mem={human_bytes(res['mem'])}"]
    parts += [f"{name}={amount:g}" for name, amount in sorted((res.get("slots") or {}).items())]
    return " ".join(parts)


def _pull(progress: dict[str, Any] | None) -> str:
    if progress is None:
        return ": no progress yet"
    if "error" in progress and "total" not in progress:
        return f": {progress['error']}"
    current, total = progress["current"], progress["total"]
    pct = f" ({100 * current / total:.1f} %)" if total else ""
    state = " done" if progress.get("done") else ""
    return f": {human_bytes(current)} / {human_bytes(total)}{pct}{state}"
