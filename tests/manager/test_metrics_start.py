"""The session-start durations the manager exports (services.manager.metrics.start_durations):
enqueue to RUNNING with and without the pull, counted once, on the last kernel to run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from domain.status import Kernel, KernelStatus, StatusChange
from services.manager.metrics import start_durations
from transport.metrics import size_bucket

S = KernelStatus
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def kernel(kid: str, *steps: tuple[KernelStatus, float]) -> Kernel:
    k = Kernel(kernel_id=kid)
    k.status_history = [
        StatusChange(status=s, status_info="x", at=T0 + timedelta(seconds=t)) for s, t in steps
    ]
    k.status = steps[-1][0]
    return k


def session(*kernels: Kernel) -> Any:
    return SimpleNamespace(kernels={k.kernel_id: k for k in kernels})


def test_the_pull_is_taken_out_from_the_first_pull_to_the_last_pull_end() -> None:
    a = kernel("a", (S.PENDING, 0), (S.PULLING, 1), (S.PREPARED, 11), (S.RUNNING, 12))
    b = kernel("b", (S.PENDING, 0), (S.PULLING, 2), (S.PREPARED, 14), (S.RUNNING, 15))
    s = session(a, b)
    assert start_durations(s, "b") == (15.0, 2.0)  # 15 s in all, pulls from 1 s to 14 s
    assert start_durations(s, "a") is None  # not the last to run: counted once, on b


def test_a_session_with_a_kernel_not_running_yet_is_not_counted() -> None:
    a = kernel("a", (S.PENDING, 0), (S.RUNNING, 3))
    b = kernel("b", (S.PENDING, 0), (S.PULLING, 1))
    assert start_durations(session(a, b), "a") is None


def test_without_a_pull_both_durations_agree() -> None:
    a = kernel("a", (S.PENDING, 0), (S.SCHEDULED, 0.5), (S.RUNNING, 2))
    assert start_durations(session(a), "a") == (2.0, 2.0)


def test_size_buckets_are_few_and_ordered() -> None:
    mib = 1024**2
    sizes = [size_bucket(n) for n in (0, 99 * mib, 100 * mib, 1024 * mib, 20 * 1024 * mib)]
    assert sizes == ["lt100MiB", "lt100MiB", "100MiB-1GiB", "1-10GiB", "ge10GiB"]
