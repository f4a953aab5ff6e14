"""`hoist dotfile add PATH --from FILE | list | rm PATH`: the dotfiles each of your kernels
finds in its home at start (domain.dotfiles).

They send the manager's ``hoist.api.dotfile.*`` requests (domain.contracts.dotfiles) on your
own subject; the client and admin roles name any owner with ``--owner``.  A file over 64 KiB is
refused here, before it is sent (a NATS message holds about 1 MB)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from client.connection import CliError, login_name
from domain.dotfiles import DEFAULT_MODE
from domain.limits import MAX_DOTFILE, MAX_DOTFILES, MAX_DOTFILES_BYTES
from domain.subjects import DOTFILE_LIST, DOTFILE_REMOVE, DOTFILE_SET
from services.cli.connected import connected
from services.cli.output import add_output_flags, print_json, wants_json

_OWNER_HELP = "whose (the client and admin roles; default: you)"


def register(subparsers: Any) -> None:
    dotfile = subparsers.add_parser(
        "dotfile",
        aliases=["dotfiles"],
        help=(
            f"files each of your kernels finds in its home at start (at most {MAX_DOTFILES},"
            f" {MAX_DOTFILE // 1024} KiB each, {MAX_DOTFILES_BYTES // 1024} KiB in all)"
        ),
    )
    sub = dotfile.add_subparsers(dest="dotfile_command", metavar="COMMAND", required=True)
    add = sub.add_parser("add", help="keep a file (or replace one) for your kernels' home")
    add.add_argument("path", help="relative to the home, e.g. .bashrc or .config/git/config")
    add.add_argument(
        "--from", dest="source", required=True, metavar="FILE", help="the file to read ('-': stdin)"
    )
    add.add_argument(
        "--mode", type=_mode, default=DEFAULT_MODE, help="permission bits in octal (default 644)"
    )
    add.add_argument("--owner", help=_OWNER_HELP)
    add.set_defaults(func=cmd_add)
    ls = sub.add_parser("list", aliases=["ls"], help="the dotfiles you keep")
    ls.add_argument("--owner", help=_OWNER_HELP)
    add_output_flags(ls, "the dotfiles")
    ls.set_defaults(func=cmd_list)
    rm = sub.add_parser("rm", aliases=["remove"], help="stop giving your kernels a dotfile")
    rm.add_argument("path", help="as added")
    rm.add_argument("--owner", help=_OWNER_HELP)
    rm.set_defaults(func=cmd_rm)


def _mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is no octal mode like 644 or 600") from None
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"{text!r}: permission bits go from 000 to 777")
    return mode


def read_source(source: str) -> bytes:
    """The file's bytes, or CliError naming --from (missing, unreadable, over 64 KiB)."""
    try:
        if source == "-":
            content = sys.stdin.buffer.read(MAX_DOTFILE + 1)
        else:
            with Path(source).open("rb") as f:
                content = f.read(MAX_DOTFILE + 1)
    except OSError as e:
        raise CliError(f"--from {source}: {e.strerror or e}") from None
    if len(content) > MAX_DOTFILE:
        raise CliError(
            f"--from {source}: more than {MAX_DOTFILE} bytes ({MAX_DOTFILE // 1024} KiB),"
            " the most a dotfile may hold"
        )
    return content


def _owner(args: argparse.Namespace) -> str:
    return args.owner or login_name()  # LoginName kept: a typed --owner is sent as typed


async def cmd_add(args: argparse.Namespace) -> None:
    content = read_source(args.source)
    request = {"owner": _owner(args), "path": args.path, "content": content, "mode": args.mode}
    async with connected(args) as conn:  # a user's own subject: the manager fills in owner
        reply = await conn.request(DOTFILE_SET, request)
    f = reply["dotfile"]
    done = "added" if reply["recorded"] else "unchanged"
    print(f"dotfile {f['path']} {done} ({f['size']} bytes, mode {f['mode']:03o})")


async def cmd_list(args: argparse.Namespace) -> None:
    async with connected(args) as conn:
        reply = await conn.request(DOTFILE_LIST, {"owner": _owner(args)})
    if wants_json(args):
        print_json(reply)
        return
    if not reply["dotfiles"]:
        print(f"{reply['owner']} keeps no dotfiles (hoist dotfile add PATH --from FILE)")
    for f in reply["dotfiles"]:
        print(f"{f['mode']:03o}  {f['size']:>6}  {f['path']}")


async def cmd_rm(args: argparse.Namespace) -> None:
    async with connected(args) as conn:
        await conn.request(DOTFILE_REMOVE, {"owner": _owner(args), "path": args.path})
    print(f"dotfile {args.path} removed")
