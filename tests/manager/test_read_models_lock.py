"""A second manager on a data dir whose read models another process holds says so in one line."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from services.manager.read_models import ReadModels


async def test_a_read_models_file_held_by_another_process_is_named_with_what_to_do(
    tmp_path: Path,
) -> None:
    path = tmp_path / "readmodels.duckdb"
    hold = f"import duckdb, time; c = duckdb.connect({str(path)!r}); print('held', flush=True);"
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", hold + " time.sleep(30)", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and (await holder.stdout.readline()).strip() == b"held"
        with pytest.raises(ValueError, match=r"is in use .*another manager running"):
            await ReadModels(None, None, path).start()  # type: ignore[arg-type]
    finally:
        holder.kill()
        await holder.wait()
