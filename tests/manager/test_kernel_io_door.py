"""What the kernel I/O commands refuse before asking anyone."""

from __future__ import annotations

from typing import Any, cast

import pytest

from domain.contracts.sessions import SessionExec
from domain.rpc import RequestError
from services.manager.kernel_io import KernelIO


async def test_exec_may_not_set_the_cluster_env() -> None:
    io = KernelIO(cast(Any, None), cast(Any, None))  # refused before the fleet is asked
    request = SessionExec(session_id="s", command=["true"], env={"HOIST_SESSION_ID": "forged"})
    with pytest.raises(RequestError) as e:
        await io.exec(request)
    assert e.value.code == "invalid-request"
    assert "env: HOIST_SESSION_ID" in e.value.message
