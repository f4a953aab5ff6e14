"""A second manager on a data dir whose read models another process holds says so in one line,
whether the read models run in its process or in its child."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from services.manager.read_models import ReadModels
from services.stack.natsserver import NatsServer
from tests.manager.harness import manager
from transport.client import Client

IN_USE = r"is in use .*another manager running"


@asynccontextmanager
async def held(path: Path) -> AsyncIterator[None]:
    """``path`` opened by DuckDB in another process meanwhile."""
    hold = f"import duckdb, time; c = duckdb.connect({str(path)!r}); print('held', flush=True);"
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", hold + " time.sleep(60)", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and (await holder.stdout.readline()).strip() == b"held"
        yield
    finally:
        holder.kill()
        await holder.wait()


async def test_a_read_models_file_held_by_another_process_is_named_with_what_to_do(
    tmp_path: Path,
) -> None:
    path = tmp_path / "readmodels.duckdb"
    async with held(path):
        with pytest.raises(ValueError, match=IN_USE):
            await ReadModels(None, None, path).start()  # type: ignore[arg-type]


async def test_a_held_file_fails_the_managers_start_with_its_childs_words(
    nats_server: NatsServer, nc: Client, tmp_path: Path
) -> None:
    path = tmp_path / "readmodels.duckdb"
    async with held(path):
        with pytest.raises(ValueError, match=IN_USE):
            async with manager(nc, read_models_url=nats_server.url, read_models=path):
                pass
