"""A /metrics port that cannot be bound says so, naming the flag (a process exits 2), never
"cannot connect to NATS" (what an agent of a CI run said when another process took the port
the stack had picked for it; the stack now has each process bind a free one itself)."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry

from transport.connection import run_process
from transport.metrics import MetricsServer


def test_a_taken_metrics_port_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def serve() -> None:
            await MetricsServer(CollectorRegistry(), "127.0.0.1", port).start()

        code = run_process("hoist agent", "WARNING", serve(), "check HOIST_NATS_URL")
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--metrics-port {port}: cannot serve /metrics on 127.0.0.1:{port}" in err, err
    assert "NATS" not in err
