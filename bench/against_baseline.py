"""Issue 16's throughput target side by side: "at least today's 500 sessions/s" was the burst
a small fleet made on the code of the day the issue was filed (``--commit``, be1aecf), on the
machine of that day.  Absolute rates move with the host's load by more than the changes do, so
this runs, alternating in one invocation on the same host:

1. the baseline: that commit's own ``bench/lifecycle.py`` (its tree taken with ``git archive``
   into a temp dir, run there with this interpreter), 50 agents, a burst of 2,000 at once;
2. today's code on the same small fleet (the same command);
3. today's code at scale: ``bench/lifecycle.py --scale`` with 1,000 agents up to ``--live``
   sessions (one row; its burst keeps ``--window`` creates waiting at a time, 100 unless told).

and prints each round's bursts (sessions/s, create -> RUNNING) and p99 at the steady rate,
then the ratios of today's small and scale bursts to the baseline's, per round and over the
rounds (geometric mean), and the p99 at scale over today's small fleet's.  A burst ratio >= 1
at scale: sessions go through at 1,000 agents and 20,000 live at least as fast as they did on
50 agents and 2,000 on the day the issue was filed.

    python bench/against_baseline.py [--rounds 3] [--live 21000] [--seconds 30]
                                     [--commit be1aecf]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "be1aecf"  # the code issue 16 was filed against (2026-12-01)
_THROUGHPUT = re.compile(r"at (\d+) sessions/s")
_P99 = re.compile(r"p99 ([\d.]+) ms")


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """The command's output; its failure stops the bench with what it printed."""
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def small_fleet(tree: Path, env: dict[str, str] | None = None) -> tuple[float, float]:
    """(burst sessions/s, steady p99 ms): 50 agents, 2,000 at once, then 50/s for 10 s."""
    args = ["--agents", "50", "--burst", "2000", "--rate", "50", "--seconds", "10"]
    out = run([sys.executable, "bench/lifecycle.py", *args], tree, env)
    burst = _THROUGHPUT.search(out)
    p99 = _P99.search(out)
    if burst is None or p99 is None:
        sys.exit(f"no throughput or p99 line in {tree}/bench/lifecycle.py's output:\n{out}")
    return float(burst.group(1)), float(p99.group(1))


def at_scale(args: argparse.Namespace) -> tuple[float, float]:
    """(burst sessions/s, steady p99 ms) of one ``--scale`` row with 1,000 agents."""
    cmd = [sys.executable, "bench/lifecycle.py", "--scale", "--agents", "1000"]
    cmd += ["--live", str(args.live), "--rate", "50", "--seconds", str(args.seconds)]
    out = run([*cmd, "--window", str(args.window)], ROOT)
    rows = [line for line in out.splitlines() if line.startswith("| 1,000 |")]
    if not rows:
        sys.exit(f"no row in bench/lifecycle.py --scale's output:\n{out}")
    cells = [c.strip() for c in rows[-1].strip("|").split("|")]
    return float(cells[2].replace(",", "")), float(cells[4])


def checkout(commit: str, into: Path) -> Path:
    """The commit's tree under ``into`` (from this clone's history)."""
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=False)
    if archive.returncode != 0:
        sys.exit(f"git archive {commit} failed: {archive.stderr.decode().strip()} (a full clone?)")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--commit", default=BASELINE, help="the baseline's code (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--live", type=int, default=21000, help="the scale row's live sessions")
    p.add_argument("--seconds", type=float, default=30, help="the scale row's steady phase")
    p.add_argument("--window", type=int, default=100, help="the scale burst's creates at a time")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="hoist-baseline-") as tmp:
        old = checkout(args.commit, Path(tmp))
        # Its own packages, not this checkout's (the venv may have this one on its path).
        env = {**os.environ, "PYTHONPATH": str(old)}
        print(
            f"baseline: {args.commit}'s bench/lifecycle.py, 50 agents, 2,000 at once; today: the"
            f" same, and --scale with 1,000 agents to {args.live:,} live ({args.window} creates"
            " waiting at a time); sessions/s create -> RUNNING, p99 ms at 50/s",
            flush=True,
        )
        print(
            "| round | baseline /s | today small /s | today 1,000 agents /s | p99 ms"
            " (baseline / small / scale) | ratio small | ratio scale |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
        small_ratios: list[float] = []
        scale_ratios: list[float] = []
        p99_ratios: list[float] = []  # at scale / today's small fleet: growth with the fleet
        for r in range(1, args.rounds + 1):
            base, base_p99 = small_fleet(old, env)
            small, small_p99 = small_fleet(ROOT)
            scale, scale_p99 = at_scale(args)
            small_ratios.append(small / base)
            scale_ratios.append(scale / base)
            p99_ratios.append(scale_p99 / small_p99)
            print(
                f"| {r} | {base:.0f} | {small:.0f} | {scale:.0f} | {base_p99:.1f} /"
                f" {small_p99:.1f} / {scale_p99:.1f} | {small / base:.2f} | {scale / base:.2f} |",
                flush=True,
            )
    print(
        f"geometric mean over {args.rounds} rounds: today small / baseline"
        f" {geomean(small_ratios):.2f}, today at 1,000 agents and {args.live:,} live / baseline"
        f" {geomean(scale_ratios):.2f} (target >= 1.00: at least the day's throughput);"
        f" p99 at 1,000 agents / today small {geomean(p99_ratios):.2f} (1.00: a create's"
        " latency does not grow with the fleet)"
    )


if __name__ == "__main__":
    main()
