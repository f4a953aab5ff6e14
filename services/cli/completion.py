"""`hoist completion bash|zsh|fish`: a shell completion script, generated from the argparse
parser by shtab (so it never lags behind a new command or flag), that completes sessions
(names and short ids), agents, images, users and resource groups from the running stack: the
script asks `hoist __complete KIND PREFIX` (services.cli.complete_values) on each TAB.

Install: ``hoist completion bash > ~/.local/share/bash-completion/completions/hoist``; for
zsh ``hoist completion zsh > ~/.zfunc/_hoist`` with ``fpath+=~/.zfunc`` before ``compinit``;
for fish ``hoist completion fish > ~/.config/fish/completions/hoist.fish``."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import shtab

from services.cli.complete_values import KINDS, WORD

SHELLS = ("bash", "zsh", "fish")

# What a value is, by the dest of the argument that takes it (and, for a command's own
# ``name``, by the command: `hoist user disable NAME`, `hoist group rm NAME`).
BY_DEST = {
    "session_id": "sessions",
    "session": "sessions",
    "agent": "agents",
    "agent_id": "agents",
    "image": "images",
    "owner": "users",
    "resource_group": "groups",
}
BY_COMMAND_NAME = {"user": "users", "group": "groups"}

# bash calls the function with the word typed so far and reads the candidates it prints; zsh
# calls it to add them; fish runs the command and filters by itself.
_BASH = "\n".join(
    f'_hoist_complete_{kind}() {{ hoist {WORD} {kind} "$1" 2>/dev/null; }}' for kind in KINDS
)
_ZSH = "\n".join(
    f'_hoist_complete_{kind}() {{ local -a c; c=(${{(f)"$(hoist {WORD} {kind} 2>/dev/null)"}});'
    " compadd -a c; }"
    for kind in KINDS
)


def _complete(kind: str) -> dict[str, str]:
    return {
        "bash": f"_hoist_complete_{kind}",
        "zsh": f"_hoist_complete_{kind}",
        "fish": f"(hoist {WORD} {kind} 2>/dev/null)",
    }


def register(subparsers: Any, parser: argparse.ArgumentParser) -> None:
    """Add `completion`; ``parser`` is the whole `hoist` parser, completed once it is built."""
    p = subparsers.add_parser("completion", help="print a completion script for bash, zsh or fish")
    p.add_argument("shell", choices=SHELLS)

    async def cmd_completion(args: argparse.Namespace) -> None:
        print(script(parser, args.shell), end="")

    p.set_defaults(func=cmd_completion)


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    for path, action in _actions(parser, ()):
        kind = BY_DEST.get(action.dest)
        if action.dest == "name" and path[:1] and path[0] in BY_COMMAND_NAME:
            kind = BY_COMMAND_NAME[path[0]]
        if kind is not None:
            action.complete = _complete(kind)  # type: ignore[attr-defined]
        elif action.dest == "data_dir":
            action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]
    return shtab.complete(parser, shell=shell, preamble={"bash": _BASH, "zsh": _ZSH}.get(shell, ""))


def _actions(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.Action]]:
    """Every argument of ``parser`` and of its subcommands, with the command path to it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, (*path, name))
        else:
            yield path, action
