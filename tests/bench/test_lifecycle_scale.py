"""A smoke run of ``bench/lifecycle.py --scale`` at tiny sizes: it must print one full row per
size (no failure cell), with the live count the manager agrees with (the bench checks that),
and, with ``--verify``, the read models matching a rebuild after each row; with ``--steps``,
each row's steady creates broken into steps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(60)
def test_scale_mode_prints_one_row_per_size() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["--scale", "--agents", "20", "--agent-procs", "2", "--live", "60,100"]
    args += ["--rate", "20", "--seconds", "1", "--verify", "--steps"]
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "lifecycle.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=55,
        check=True,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| 20 |")]
    assert len(rows) == 2, out
    assert all("failed" not in row for row in rows), out
    cells = [row.strip("|").split("|") for row in rows]
    assert all(len(c) == 12 for c in cells), out
    # cores at the steady rate (manager / read models / nats-server / agents): four shares,
    # each a number of cores this machine has; then the share the host's other guests took
    used, stolen = zip(*(c[11].split("; stolen ") for c in cells), strict=True)
    shares = [[float(x) for x in u.split("/")] for u in used]
    assert all(len(s) == 4 and all(0 <= x <= (os.cpu_count() or 1) for x in s) for s in shares)
    assert all(0 <= float(x) <= (os.cpu_count() or 1) for x in stolen), out
    assert all(s[0] > 0 for s in shares), out  # the manager worked at the steady rate
    assert all(s[1] > 0 for s in shares), out  # ... and its read models' child process
    # KiB a live session: the manager's while running and after a restart; its read models'
    kib = [c[5].replace(";", ",").split(",") for c in cells]
    assert all(len(k) == 3 and all(float(x) == float(x) for x in k) for k in kib), out
    # live: the size, plus the steady sessions (20/s for 1 s) that stay live
    assert [c[1].strip() for c in cells] == ["80", "120"], out
    assert "in 2 processes" in out, out
    assert "hoist verify at 80 live: match" in out and "at 120 live: match" in out, out
    # --steps: where each row's steady creates spent their time, from the request to the reply
    steps = [line for line in out.splitlines() if line.startswith("steps at ")]
    assert [line.split(" live")[0] for line in steps] == ["steps at 80", "steps at 120"], out
    for line in steps:
        cells = line.split(": ", 1)[1].split("; ")
        assert cells[0].startswith("request→SessionEnqueued "), line
        assert cells[-1].split()[0].endswith("→reply"), line
        assert all(float(x) >= 0 for c in cells for x in c.split()[-1].split("/")), line
    assert out.count("the 10 slowest creates left at") == 2, out
