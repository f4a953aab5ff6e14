"""Issue 16's throughput target side by side: "at least today's 500 sessions/s" was the burst
a small fleet made on the code of the day the issue was filed (``--commit``, be1aecf), on the
host of that day.  Absolute rates move with the host's load by more than the changes do, so
this runs, alternating in one invocation on the same host:

1. the baseline: that commit's own ``bench/lifecycle.py`` (its tree taken with ``git archive``
   into a temp dir, run there with this interpreter), 50 agents, a burst of 2,000 at once,
   then 50 sessions/s for ``--seconds``;
2. this checkout's code on the same small fleet (the same command);
3. this checkout's code at scale: one ``bench/lifecycle.py --scale`` row, 1,000 agents, a burst
   up to ``--live`` sessions (``--window`` creates waiting at a time, 100 unless told; the
   small fleet's 2,000 go all at once), then 50/s for ``--seconds`` (the row ends with
   ``--live`` + 50 x ``--seconds`` live);

and prints each round's bursts (sessions/s, create -> RUNNING) and p99 at the steady rate,
then the ratios of this code's small and scale bursts to the baseline's, per round and over
the rounds (geometric mean), and the p99 at scale over this code's small fleet's.  A burst
ratio >= 1 at scale: sessions go through at 1,000 agents and 20,000 live at least as fast as
they did on 50 agents and 2,000 on the day the issue was filed.

    python bench/against_baseline.py [--rounds 3] [--live 21000] [--seconds 30]
                                     [--window 100] [--commit be1aecf]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "be1aecf"  # the code issue 16 was filed against (2026-12-01)
RUN_TIMEOUT_S = 1800
WARM = 50  # sessions bench/lifecycle.py --scale creates before its first row
_THROUGHPUT = re.compile(r"at (\d+) sessions/s")
_P99 = re.compile(r"p99 ([\d.]+) ms")


def run(cmd: list[str], tree: Path) -> str:
    """The output of ``cmd`` run in ``tree`` on ``tree``'s own packages (the venv's editable
    install may point at another checkout); its failure or a timeout stops the bench with what
    it printed, and takes its processes (nats-server, manager, agents) with it."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with subprocess.Popen(
        cmd, cwd=tree, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    ) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            sys.exit(f"{' '.join(cmd)} took over {RUN_TIMEOUT_S} s: stopped (is the host busy?)")
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out}\n{err}")
    for line in out.splitlines():
        if "ERROR" in line or "Traceback" in line:
            print(f"  ({tree.name}: {line.strip()})", flush=True)  # ratios from a run that erred
    return out


def small_fleet(tree: Path, seconds: float) -> tuple[float, float]:
    """(burst sessions/s, steady p99 ms): 50 agents, 2,000 at once, then 50/s."""
    args = ["--agents", "50", "--burst", "2000", "--rate", "50", "--seconds", f"{seconds:g}"]
    out = run([sys.executable, "bench/lifecycle.py", *args], tree)
    burst = _THROUGHPUT.search(out)
    p99 = _P99.search(out)
    if burst is None or p99 is None:
        sys.exit(f"no throughput or p99 line in {tree}/bench/lifecycle.py's output:\n{out}")
    return float(burst.group(1)), float(p99.group(1))


def at_scale(args: argparse.Namespace) -> tuple[float, float]:
    """(burst sessions/s, steady p99 ms) of one ``--scale`` row with 1,000 agents."""
    cmd = [sys.executable, "bench/lifecycle.py", "--scale", "--agents", "1000"]
    cmd += ["--live", str(args.live), "--rate", "50", "--seconds", f"{args.seconds:g}"]
    out = run([*cmd, "--window", str(args.window)], ROOT)
    rows = [line for line in out.splitlines() if line.startswith("| 1,000 |")]
    cells = [c.strip() for c in rows[-1].strip("|").split("|")] if rows else []
    try:
        return float(cells[2].replace(",", "")), float(cells[4])
    except (IndexError, ValueError):  # a row that failed says why in its cells
        sys.exit(f"no figures in bench/lifecycle.py --scale's row:\n{out}")


def checkout(commit: str, into: Path) -> Path:
    """The commit's tree under ``into`` (from this clone's history)."""
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=False)
    if archive.returncode != 0:
        shallow = (ROOT / ".git" / "shallow").exists()
        hint = "; this clone is shallow: git fetch --unshallow" if shallow else ""
        sys.exit(f"git archive {commit} failed: {archive.stderr.decode().strip()}{hint}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--commit", default=BASELINE, help="the baseline's code (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="baseline, small, scale: alternating")
    p.add_argument("--live", type=int, default=21000, help="the scale row's burst brings it here")
    p.add_argument("--seconds", type=float, default=30, help="each run's steady phase at 50/s")
    p.add_argument("--window", type=int, default=100, help="the scale burst's creates at a time")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if not args.seconds > 0:
        p.error(f"--seconds must be > 0 (the p99 needs a steady phase), got {args.seconds:g}")
    if args.live <= WARM:
        p.error(f"--live must be over {WARM} (the sessions made before the row), got {args.live}")
    if args.window < 0:
        p.error(f"--window must be >= 0 (0: all at once), got {args.window}")
    return args


def main() -> None:
    args = parse()
    window = f"{args.window} creates waiting at a time" if args.window else "all at once"
    with tempfile.TemporaryDirectory(prefix="hoist-baseline-") as tmp:
        old = checkout(args.commit, Path(tmp))
        print(
            f"baseline: {args.commit}'s bench/lifecycle.py, 50 agents, 2,000 at once; this code:"
            f" the same, and --scale with 1,000 agents to {args.live:,} live ({window});"
            f" sessions/s create -> RUNNING, p99 ms at 50/s over {args.seconds:g} s",
            flush=True,
        )
        print(
            "| round | baseline /s | this code, 50 agents /s | this code, 1,000 agents /s | p99 ms"
            " (baseline / small / scale) | ratio small | ratio scale |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
        small_ratios: list[float] = []
        scale_ratios: list[float] = []
        p99_ratios: list[float] = []  # at scale / this code's small fleet: growth with the fleet
        for r in range(1, args.rounds + 1):
            base, base_p99 = small_fleet(old, args.seconds)
            small, small_p99 = small_fleet(ROOT, args.seconds)
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
        f"geometric means over {args.rounds} rounds: small / baseline"
        f" {geomean(small_ratios):.2f}, 1,000 agents and {args.live:,} live / baseline"
        f" {geomean(scale_ratios):.2f} (target >= 1.00: at least the day's throughput);"
        f" p99 at 1,000 agents / small {geomean(p99_ratios):.2f} (1.00: a create's latency"
        " does not grow with the fleet)"
    )


if __name__ == "__main__":
    main()
