"""The web view's process: ``python -m services.web [--host H] [--port P] [--token-file F]``
with the admin role's NATS URL in ``$HOIST_NATS_URL`` (never on the command line: `ps` shows
it).  `hoist up` starts one; `hoist web` runs one in the foreground.

It binds 127.0.0.1 unless ``--host`` says otherwise.  The token is read from ``--token-file``
(`hoist up` writes one, mode 0600, each start) or made anew; the line ``web ready at URL``
(with ``?token=``) is printed once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import uvicorn

from client.connection import CliError, Connection
from services.web.app import Access, make_app
from services.web.serve import quiet_floods, server_config

URL_ENV = "HOIST_NATS_URL"
log = logging.getLogger("web")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hoist web", description="Serve the Hoist web view.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8642, help="port (0: any free one)")
    p.add_argument("--token-file", type=Path, help="read the access token here (else a new one)")
    p.add_argument("--log-level", default="WARNING")
    return p


def token_from(path: Path | None) -> str:
    if path is None:
        return secrets.token_urlsafe(24)
    token = path.read_text().strip()
    if len(token) < 16:
        raise ValueError(f"--token-file {path}: a token of at least 16 characters is needed")
    return token


def page_url(host: str, port: int, token: str) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/?token={token}"


def without_credentials(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], "", "", ""))


async def run(args: argparse.Namespace) -> None:
    url = os.environ.get(URL_ENV)
    if not url:
        raise ValueError(f"no NATS URL: set {URL_ENV} to the admin role's (`hoist creds admin`)")
    token = token_from(args.token_file)
    try:
        conn = await Connection.open(url, name="hoist-web")
    except CliError as e:
        raise ValueError(str(e)) from None
    access = Access(token=token, admin=conn, nats_url=without_credentials(url))
    config = server_config(make_app(access), args.host, args.port, args.log_level)
    server = uvicorn.Server(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if serving.done():
                serving.result()
                raise OSError(f"the web view could not listen on {args.host}:{args.port}")
            await asyncio.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        print(f"web ready at {page_url(args.host, port, token)}", flush=True)
        await serving
    finally:
        server.should_exit = True
        await access.close()
        await conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    quiet_floods()
    try:
        asyncio.run(run(args))
    except (ValueError, OSError) as e:
        print(f"hoist web: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
