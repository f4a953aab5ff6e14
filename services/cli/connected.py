"""The connection a CLI command opens to the stack (its URL from services.cli.stack_url)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

from client.connection import Connection
from services.cli.stack_url import stack_url


@contextlib.asynccontextmanager
async def connected(args: argparse.Namespace, role: str = "client") -> AsyncIterator[Connection]:
    conn = await Connection.open(stack_url(args, role))
    try:
        yield conn
    finally:
        await conn.close()
