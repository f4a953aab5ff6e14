"""One scheduling pass: the full ``plan`` against ``plan_indexed`` on the kept index.

A synthetic fleet (``--agents``, 16 cores and 64 GiB each, 0-4 cores held, every agent holding
the bench image) and ``--pending`` one-kernel sessions; both planners decide the same sessions
on the same fleet (checked equal), alternating ``--rounds`` times, and the mean time of a pass
of each is printed with their ratio.  The index is built once, outside the timing, as the
manager keeps it between passes.

    python bench/scheduling.py [--agents 1000,20000] [--pending 1,50] [--rounds 20]
"""

from __future__ import annotations

import argparse
import random
import time
from datetime import UTC, datetime, timedelta

from domain.events import Capacity, Resources
from domain.placement_index import AgentIndex
from domain.scheduling import AgentView, Limits, PendingSession, Policy, plan, plan_indexed

GiB = 2**30
IMAGE = "bench/base:1"


def fleet(n: int, rng: random.Random) -> list[AgentView]:
    return [
        AgentView(
            agent_id=f"bench-{i}",
            resource_group="default",
            capacity=Capacity(cpu=16, mem=64 * GiB, disk=100 * GiB),
            reserved_cpu=rng.choice([0, 1, 2, 4]),
            reserved_mem=0,
            images={IMAGE: 100 * 2**20},
            live=True,
        )
        for i in range(n)
    ]


def pending(k: int) -> list[PendingSession]:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        PendingSession(
            session_id=f"s{j}",
            owner=f"u{j % 7}",
            image=IMAGE,
            resources=Resources(cpu=0.1, mem=256 * 2**20),
            cluster_size=1,
            resource_group="default",
            kernel_ids=[f"s{j}-k0"],
            enqueued_at=t0 + timedelta(milliseconds=j),
        )
        for j in range(k)
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", default="1000,20000")
    p.add_argument("--pending", default="1,50")
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args()
    policy = Policy()
    for n in (int(x) for x in args.agents.split(",")):
        agents = fleet(n, random.Random(1))
        index = AgentIndex(policy, agents)
        for k in (int(x) for x in args.pending.split(",")):
            sessions = pending(k)
            plan_indexed(sessions, index, {}, Limits())  # its idle capacities, built once
            full = kept = 0.0
            for _ in range(args.rounds):
                t = time.perf_counter()
                a = plan(sessions, agents, {}, Limits(), policy)
                full += time.perf_counter() - t
                t = time.perf_counter()
                b = plan_indexed(sessions, index, {}, Limits())
                kept += time.perf_counter() - t
                assert a == b, "the planners disagree"
            full, kept = full / args.rounds * 1000, kept / args.rounds * 1000
            print(
                f"{n:,} agents, {k} pending: plan {full:.2f} ms, plan_indexed {kept:.3f} ms"
                f" a pass (x{full / kept:.0f})"
            )


if __name__ == "__main__":
    main()
