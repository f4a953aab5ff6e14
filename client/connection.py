"""The CLI's NATS connection: turns every way a request can fail into one line a person can act
on (CliError), never a traceback.

nats-py reports a permission violation only through its error callback, while the request
itself waits for its timeout; so the callback resolves a future the request races against.

A URL whose NATS user is a Hoist user's (``hoist creds user NAME``; no role's) scopes the
connection to that user: every ``hoist.api.<x>.<y>`` request goes to ``hoist.api.<user>.<x>.<y>``
(the only command subjects that user may publish; the manager takes the owner from it), so do
the queries (``hoist.query.<user>.<name>``; the fleet-wide ones are answered only for an admin
user; ``history`` only there) and the admin commands (``hoist.admin.<user>.<x>.<y>``: only an
admin user may send them, recorded as theirs), and a payload ``owner`` that is the user or the
login name (the CLI's default) is left out, so the manager fills in the user; any other owner
is sent, and refused ``forbidden`` (an admin user's is served: admin users act for any owner
and see every owner's rows).
"""

from __future__ import annotations

import asyncio
import getpass
import re
import socket
import sys
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError, NoServersError
from nats.errors import TimeoutError as NatsTimeoutError

from domain import subjects
from domain.user import RESERVED
from transport.client import Client, connect, server_list

_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"', re.I)


class CliError(Exception):
    """An error the user can act on; printed as one line, exit code 1."""


class NoReply(CliError):
    """Nothing answered the request (no responder, or none within its time)."""


AGAIN_PAUSE_S = 1.0  # between the askings of an idempotent request (Connection.request)
# A read-model query answered ``unavailable`` (the manager's read models restarting, or behind a
# user's latest record) is asked again for this long: a read changes nothing.
READ_AGAIN_FOR_S = 15.0
_READS = (f"{subjects.QUERY}.", subjects.SQL_SUBJECT, subjects.VERIFY_SUBJECT)


class ReplyError(CliError):
    """An error reply: its code and message, which the CLI may say in its flags' terms
    (services.cli.flag_errors)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message


def redact(url: str) -> str:
    """The URL (each server of a comma-separated list) without its password (error messages
    end up in logs and terminals)."""
    out = []
    for server in server_list(url):
        parts = urlsplit(server)
        out.append(f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}")
    return ",".join(out)


def _reachable(url: str) -> tuple[list[str], str]:
    """The servers of ``url`` that accept a TCP connection, in order, and why the last of the
    others did not (nats-py's own connect retries for minutes when nothing listens)."""
    up, why = [], ""
    for server in server_list(url):
        parts = urlsplit(server)
        try:
            with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 4222), 2):
                up.append(server)
        except OSError as e:
            why = str(e.strerror or e)
    return up, why


class Connection:
    """One NATS connection of a CLI command."""

    def __init__(self, nc: Client, url: str, violations: asyncio.Queue[str]) -> None:
        self.nc = nc
        self.url = url
        self.user = scoped_user(url)  # a Hoist user's URL: their own subjects
        self._violations = violations

    @classmethod
    async def open(cls, url: str, name: str = "hoist-cli") -> Connection:
        # A plain TCP probe first: nats-py's own connect retries for minutes when nothing listens.
        servers, why = _reachable(url)
        if not servers:
            raise CliError(
                f"cannot reach NATS at {redact(url)} ({why}): is the stack running?"
                " start it with `hoist up`"
            ) from None
        violations: asyncio.Queue[str] = asyncio.Queue()

        async def on_error(err: Exception) -> None:  # replaces nats-py's traceback printer
            m = _VIOLATION.search(str(err))
            if m:
                violations.put_nowait(m.group(2))

        try:
            # One server: no reconnect (a command fails fast, and says so). A cluster: ride
            # out a server's loss on another (the first reachable one logs in).
            several = len(server_list(url)) > 1
            nc = await connect(
                servers,
                name=name,
                connect_timeout=3,
                allow_reconnect=several,
                max_reconnect_attempts=3 if several else 0,
                reconnect_time_wait=0.5,
                error_cb=on_error,
            )
        except NatsError as e:
            if "authorization" in str(e).lower():
                raise CliError(
                    f"NATS at {redact(url)} refused the credentials: print current ones with"
                    " `hoist creds client` (the stack's data dir) or fix HOIST_NATS_URL"
                ) from None
            raise CliError(f"cannot connect to NATS at {redact(url)}: {e}") from None
        except (TimeoutError, NoServersError, OSError) as e:
            raise CliError(
                f"cannot reach NATS at {redact(url)} ({type(e).__name__}): is the stack running?"
                " start it with `hoist up`"
            ) from None
        return cls(nc, url, violations)

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.close()

    def check_violations(self) -> None:
        """Raise for a permission violation the server reported since the last check."""
        if not self._violations.empty():
            raise permission_denied(self._violations.get_nowait())

    async def request(
        self,
        subject: str,
        payload: dict[str, Any],
        wait_s: float = 10.0,
        *,
        again_for_s: float = 0.0,
        read_again: bool = True,
    ) -> Any:
        """Send a request; the decoded JSON reply, or CliError for an error reply.

        ``again_for_s``: an idempotent request (it carries a ``request_id``) is asked again,
        saying so, after no reply, no responder or an ``unavailable`` reply, until that long
        has passed: a manager failing over or a stream electing its leader answers the same
        request once, and never does it twice.  A read-model query is asked again after an
        ``unavailable`` reply for READ_AGAIN_FOR_S at least, unless ``read_again`` is False (a
        caller that asks again on its own, or shows why at once)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + again_for_s
        said = ""
        reads_until = loop.time() + (
            READ_AGAIN_FOR_S if read_again and subject.startswith(_READS) else 0
        )
        while True:
            try:
                return await self._request_once(subject, payload, wait_s)
            except (NoReply, ReplyError) as e:
                unavailable = isinstance(e, ReplyError) and e.code == "unavailable"
                if isinstance(e, ReplyError) and not unavailable:
                    raise
                if loop.time() + AGAIN_PAUSE_S > (
                    max(deadline, reads_until) if unavailable else deadline
                ):
                    raise
                if str(e) != said:  # once, and again only when the answer changes
                    said = str(e)
                    print(f"{e}; asking again (the same request)", file=sys.stderr, flush=True)
                await asyncio.sleep(AGAIN_PAUSE_S)

    async def _request_once(self, subject: str, payload: dict[str, Any], wait_s: float) -> Any:
        self.check_violations()
        if self.user is not None:
            subject, payload = scoped(self.user, subject, payload)
        data = msgspec.json.encode(payload, enc_hook=str)  # a LoginName owner: its text
        req = asyncio.ensure_future(self.nc.request(subject, data, timeout=wait_s))
        denied = asyncio.ensure_future(self._violations.get())
        try:
            done, _ = await asyncio.wait({req, denied}, return_when=asyncio.FIRST_COMPLETED)
            if denied in done:
                raise permission_denied(denied.result())
            msg = req.result()
        except NoRespondersError:
            raise NoReply(
                f"nothing answers {subject}: the manager is not running; `hoist status` says"
                " what is down (a stack whose manager died: `hoist down`, then `hoist up`)"
            ) from None
        except NatsTimeoutError:
            raise NoReply(
                f"no reply on {subject} within {wait_s:g}s: the manager is busy or stuck;"
                " see its log in the stack's data dir"
            ) from None
        finally:
            for fut in (req, denied):
                if not fut.done():
                    fut.cancel()
        reply = msgspec.json.decode(msg.data or b"null")
        if isinstance(reply, dict) and isinstance(reply.get("error"), dict):
            err = reply["error"]
            raise ReplyError(str(err.get("code", "error")), str(err.get("message", err)))
        return reply


async def ask(url: str, subject: str, payload: dict[str, Any], wait_s: float = 10.0) -> Any:
    """One request on a connection of its own, for a command that sends just one."""
    conn = await Connection.open(url)
    try:
        return await conn.request(subject, payload, wait_s)
    finally:
        await conn.close()


def scoped_user(url: str) -> str | None:
    """The Hoist user a URL logs in as (None: a role's user, or no user)."""
    name = urlsplit(server_list(url)[0]).username
    if not name:
        return None
    name = unquote(name)
    if name in RESERVED or name.startswith("agent-"):
        return None
    return name


class LoginName(str):
    """The login name as the default ``owner`` (not typed): a Hoist user's request leaves it
    out, as the manager takes the owner from the subject; a typed ``--owner`` is sent as it is
    (and refused when it is another user), even when it equals the login name."""


def login_name() -> LoginName:
    """Who runs the CLI: the default ``owner`` of what it creates."""
    try:
        return LoginName(getpass.getuser())
    except (KeyError, OSError):
        return LoginName("user")


def scoped(user: str, subject: str, payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``user``'s own subject for a ``hoist.api.``, ``hoist.admin.`` (an admin user's) or owned
    ``hoist.query.`` request, its payload without a default owner."""
    for prefix in ("hoist.api.", "hoist.query.", "hoist.admin."):
        if subject.startswith(prefix):
            rest = subject[len(prefix) :]
            break
    else:
        return subject, payload
    owner = payload.get("owner")
    if owner == user or isinstance(owner, LoginName):
        payload = {k: v for k, v in payload.items() if k != "owner"}
    return f"{prefix}{user}.{rest}", payload


def permission_denied(subject: str) -> CliError:
    if subject.startswith("hoist.admin."):
        return CliError(
            f"permission denied for {subject}: the admin role is needed; use `hoist creds admin`"
            " (e.g. HOIST_NATS_URL=$(hoist creds admin) hoist ...)"
        )
    return CliError(
        f"permission denied for {subject}: these credentials' role may not use it;"
        " see `hoist creds --help` for the roles"
    )
