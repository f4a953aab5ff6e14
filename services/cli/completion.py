"""`hoist completion bash|zsh`: a shell completion script, generated from the argparse parser by
shtab (so it never lags behind a new command or flag).

Install: ``hoist completion bash > ~/.local/share/bash-completion/completions/hoist``, or for
zsh ``hoist completion zsh > ~/.zfunc/_hoist`` with ``fpath+=~/.zfunc`` before ``compinit``."""

from __future__ import annotations

import argparse
from typing import Any

import shtab

SHELLS = ("bash", "zsh")


def register(subparsers: Any, parser: argparse.ArgumentParser) -> None:
    """Add `completion`; ``parser`` is the whole `hoist` parser, completed once it is built."""
    p = subparsers.add_parser("completion", help="print a completion script for bash or zsh")
    p.add_argument("shell", choices=SHELLS)

    async def cmd_completion(args: argparse.Namespace) -> None:
        print(script(parser, args.shell), end="")

    p.set_defaults(func=cmd_completion)
    for action in parser._actions:
        if action.dest == "data_dir":
            action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    return shtab.complete(parser, shell=shell)
