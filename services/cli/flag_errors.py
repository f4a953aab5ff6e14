"""Error replies said in the terms of the command line: the manager names the wire field
(``Expected `int` >= 1 - at `$.cluster_size```), the user typed a flag (``-n 0``), so the
field is mapped back to the flag of the command that set it (``-n/--cluster-size must be at
least 1``).  A reply naming no field of the command is printed as it came, with its code."""

from __future__ import annotations

import argparse
import re

from client.connection import ReplyError

# Wire fields named unlike the dest of the flag that sets them.
_DESTS = {
    "resources": "resource",
    "ports": "port",
    "mounts": "volume",
    "kernel_id": "kernel",
    "session_type": "batch",
    "command": "words",
    "agent_id": "agent",
    "labels": "label",
    # hoist quota set
    "max_cpu": "cpu",
    "max_mem": "mem",
    "max_slots": "slot",
    "max_sessions": "sessions",
    "max_kernels_per_session": "kernels",
    "max_lifetime_s": "lifetime",
    "idle_timeout_s": "idle",
}
# "<what> request: <detail> - at `$.<path>`" (msgspec, through domain.rpc.decode)
_AT_PATH = re.compile(r"^(?:\S+ request: )?(?P<detail>.*) - at `\$\.(?P<path>[^`]+)`$", re.S)
# "<path>: <detail>" (InvalidField, RequestError naming its field)
# ("$.resources.mem: ..." too: the create door's per-key checks name the path msgspec's way)
_FIELD_FIRST = re.compile(
    r"^(?:\$\.)?(?P<path>[a-z_][a-z0-9_]*(?:[.\[][^ :]*)?): (?P<detail>.*)$", re.S
)
# "<field> must ..." (the queries' checks)
_FIELD_MUST = re.compile(r"^(?P<path>[a-z_][a-z0-9_]*) (?P<detail>must .*)$", re.S)
# msgspec's constraint words -> ours
_BOUNDS = [
    (re.compile(r"^Expected `\w+` >= (\S+)$"), "must be at least {}"),
    (re.compile(r"^Expected `\w+` > (\S+)$"), "must be more than {}"),
    (re.compile(r"^Expected `\w+` <= (\S+)$"), "must be at most {}"),
    (re.compile(r"^Expected `\w+` < (\S+)$"), "must be less than {}"),
    (re.compile(r"^Expected `\w+` of length >= 1$"), "must not be empty"),
    (re.compile(r"^Expected `\w+` of length >= (\S+)$"), "must be at least {} characters"),
    (re.compile(r"^Expected `\w+` of length <= (\S+)$"), "must be at most {} characters"),
    (re.compile(r"^Expected `\w+` of length >= (\S+) and <= (\S+)$"), "must be {}-{} long"),
    (re.compile(r"^Expected `array` of length <= (\S+)$"), "takes at most {} values"),
    (re.compile(r"^Expected `object` of length <= (\S+)$"), "takes at most {} values"),
    (re.compile(r"^Expected (?!`)(.+)$"), "must be {}"),  # pattern words (domain.rpc._cut)
]


def in_flag_terms(
    error: ReplyError,
    parser: argparse.ArgumentParser | None,
    args: argparse.Namespace | None = None,
) -> str:
    """The line to print for ``error``, a reply to the command ``parser`` parsed (into
    ``args``: a flag left out is not named, as the user never typed it)."""
    for form in (_AT_PATH, _FIELD_FIRST, _FIELD_MUST):
        m = form.match(error.message)
        if m:
            break
    else:
        return str(error)
    path, detail = m["path"], m["detail"]
    head = re.split(r"[.\[]", path, maxsplit=1)[0]
    action = _action(parser, head)
    if action is None:
        return str(error)
    if action.option_strings and args is not None and getattr(args, action.dest, None) is None:
        return str(error)  # the flag was left out: the field was not the user's
    detail = _words(detail)
    # "IMAGE must not be empty", "SESSION is empty: ...", but "IMAGE: invalid reference ..."
    joiner = " " if detail.startswith(("must ", "takes ", "is ", "has ")) else ": "
    if not action.option_strings:  # a positional (SESSION, IMAGE): the detail names it
        if error.code == "not-found":
            return detail
        return f"{(action.metavar or action.dest).upper()}{joiner}{detail}"  # type: ignore[union-attr]
    flag = "/".join(sorted(action.option_strings, key=len))
    # What in the flag's value: -r's key as typed (-r mem), else the innermost field named
    # (mounts[0].path: -v/--volume path).
    names = [n for n in re.split(r"[.\[\]]+", path[len(head) :]) if n and not n.isdigit()]
    if head == "resources" and names:
        flag = f"-r {names[0]}"
    elif names:
        flag = f"{flag} {names[-1]}"
    return f"{flag}{joiner}{detail}"


def _action(parser: argparse.ArgumentParser | None, field: str) -> argparse.Action | None:
    if parser is None:
        return None
    dest = _DESTS.get(field, field)
    for action in parser._actions:
        if action.dest in (field, dest) and action.dest != "help":
            return action
    return None


def _words(detail: str) -> str:
    for pattern, words in _BOUNDS:
        m = pattern.match(detail)
        if m:
            return words.format(*(_number(g) for g in m.groups()))
    return detail


def _number(text: str) -> str:
    """A bound as typed: msgspec says a float bound as ``3600.0``, a user typed ``3600``."""
    return text.removesuffix(".0") if re.fullmatch(r"-?\d+\.0", text) else text
