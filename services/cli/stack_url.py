"""Where a CLI command connects: the URL of the local stack, with a role's credentials."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from client.connection import CliError, scoped_user
from services.stack import up as stack
from services.stack.home import start_command
from transport import credentials

_USER_ROLES = ("client", "admin")  # what a Hoist user acts as, with their own credentials


def stack_url(args: argparse.Namespace, role: str) -> str:
    """The URL (with `role`'s credentials) of the stack in --data-dir, or $HOIST_NATS_URL.  With
    --user/$HOIST_USER, a client or admin command uses that Hoist user's credentials instead:
    an admin command then works only for a user added with --admin (never the admin role's)."""
    user = getattr(args, "user", None) or os.environ.get("HOIST_USER") or None
    if os.environ.get("HOIST_NATS_URL"):
        url = os.environ["HOIST_NATS_URL"]
        if user and role in _USER_ROLES and scoped_user(url) != user:
            raise CliError(
                f"HOIST_NATS_URL does not log in as user {user!r}: set it to the URL `hoist creds"
                f" user {user}` prints, or unset it to use the data dir's credentials"
            )
        return url
    data_dir = Path(args.data_dir)
    info = stack.StackInfo.read(data_dir)
    if info is None or not info.alive():
        state = "has stopped" if info else "is not running"
        raise CliError(
            f"the Hoist stack in {data_dir} {state}: start it with `{start_command(data_dir)}`"
            " (or set HOIST_NATS_URL)"
        )
    try:
        creds = credentials.load_credentials(data_dir)
    except (FileNotFoundError, ValueError) as e:
        raise CliError(str(e)) from None
    if user and role in _USER_ROLES:
        try:
            return credentials.user_url(info.url, user, creds)
        except KeyError as e:
            raise CliError(str(e.args[0])) from None
    return credentials.role_url(info.url, role, creds)
