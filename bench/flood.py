"""Flood the log's JetStream API from every account but its own (issue 39): on a real `hoist up`
stack (nats-server with the accounts, the manager, two dummy agents), a client, an admin, a
Hoist user and an agent each send JetStream API requests (infos, direct gets) with reply
subjects on every ``hoist.events.>`` family for ``--seconds`` (30). Meanwhile, and before it,
``--creates`` sessions are created one after another and timed until RUNNING.

Prints the aimed requests sent, every record appended in the window by subject (only the
leader's lease renewals and the creates' own records may be there), the records no create
made (must be 0), and the p99 of creates with and without the flood, and their ratio (the
issue asks within 2x). Exits 1 if a record was appended by the flood.

    python bench/flood.py [--seconds 30] [--creates 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nats.js.errors import NotFoundError

from domain import subjects
from services.stack import natsauth
from services.stack.up import DEMO_IMAGE, StackInfo, reload_nats
from tests.hardening.fuzzing import TEMPLATES, FuzzStack
from tests.hardening.test_flood import flood, targets
from transport.client import Client, connect
from transport.credentials import load_credentials, user_url

CREATE = f"{subjects.API}.session.create"
GET = f"{subjects.API}.session.get"
DESTROY = f"{subjects.API}.session.destroy"


async def create_and_wait(nc: Client, n: int, agents: set[str] | None = None) -> float:
    """Seconds from a create's request to its session RUNNING (its agent added to ``agents``)."""
    started = time.monotonic()
    payload = {
        **TEMPLATES[CREATE],
        "image": DEMO_IMAGE["dummy"],  # in the dummy agents' "registry"
        "request_id": f"flood-{n}-{time.time_ns()}",
        "max_wait": 60,
    }
    reply = json.loads((await nc.request(CREATE, json.dumps(payload).encode(), timeout=30)).data)
    if "session_id" not in reply:
        raise RuntimeError(f"create {n} refused: {reply}")
    sid = reply["session_id"]
    while True:
        got = await nc.request(GET, json.dumps({"session_id": sid}).encode(), timeout=30)
        view = json.loads(got.data)
        status = view.get("status")
        if status == "RUNNING":
            took = time.monotonic() - started
            if agents is not None:
                agents.update(k["agent_id"] for k in view["kernels"])
            # Made room for the next: the dummy agents' slots are few.
            destroy = json.dumps({"session_id": sid, "forced": True}).encode()
            await nc.request(DESTROY, destroy, timeout=30)
            return took
        if status in ("ERROR", "TERMINATED", "CANCELLED"):
            raise RuntimeError(f"session {sid} ended {status}: {view}")
        await asyncio.sleep(0.02)


async def creates(nc: Client, count: int, until: float | None = None) -> list[float]:
    out = []
    for n in range(count):
        if until is not None and time.monotonic() > until:
            break
        out.append(await create_and_wait(nc, n))
    return out


async def warm(nc: Client) -> None:
    """Creates until both dummy agents pulled the image: no pull in the creates timed."""
    agents: set[str] = set()
    for n in range(20):
        await create_and_wait(nc, n, agents)
        if len(agents) >= 2:
            return


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] if len(xs) > 1 else xs[0]


def last_seq(fuzz: FuzzStack) -> int:
    js = fuzz.conns["manager"].jetstream()
    return int(fuzz.run(js.stream_info(subjects.EVENT_STREAM)).state.last_seq)


def subjects_of(fuzz: FuzzStack, first: int, last: int) -> list[str | None]:
    """The subject of every record first..last; None for one gone (a lease renewal expires)."""
    js = fuzz.conns["manager"].jetstream()

    async def one(seq: int) -> str | None:
        try:
            return (await js.get_msg(subjects.EVENT_STREAM, seq)).subject
        except NotFoundError:
            return None

    return [fuzz.run(one(seq)) for seq in range(first, last + 1)]


async def flood_child(spec: dict[str, Any]) -> list[int]:
    """The flooders' process: one connection per URL, each flooding for ``seconds``."""

    async def quiet_errors(_: Exception) -> None:
        pass  # the refused publishes (a user's direct gets): expected, each reported

    conns = [await connect(url, error_cb=quiet_errors) for url in spec["urls"].values()]
    until = time.monotonic() + spec["seconds"]
    # Every family: agent-1's own subject is none of targets()'s.
    sent = await asyncio.gather(*(flood(nc, targets(), spec["seq"], until) for nc in conns))
    for nc in conns:
        await nc.flush(timeout=60)
        await nc.close()
    return list(sent)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--creates", type=int, default=40)
    p.add_argument("--flood-child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.flood_child:
        print(json.dumps(asyncio.run(flood_child(json.loads(args.flood_child)))))
        return 0
    with (
        tempfile.TemporaryDirectory(prefix="hoist-flood-") as tmp,
        FuzzStack(Path(tmp) / "hoist") as fuzz,
    ):
        data_dir = fuzz.stack.data_dir
        natsauth.set_user(data_dir, "flooder")
        info = StackInfo.read(data_dir)
        assert info is not None
        reload_nats(data_dir, info)
        url = fuzz.stack.role_url("client").split("@", 1)[1]
        creds = load_credentials(data_dir)

        client = fuzz.conns["client"]
        fuzz.run(warm(client))
        quiet = fuzz.run(creates(client, args.creates))
        # Something to reflect: the last record of the log.
        seq = before = last_seq(fuzz)
        # The flooders run in a process of their own, as hostile clients would: the creates
        # timed here share no event loop with them.
        flooders = {
            "client": fuzz.stack.role_url("client"),
            "admin": fuzz.stack.role_url("admin"),
            "user flooder": user_url(f"nats://{url}", "flooder", creds),
            "agent agent-1": fuzz.stack.role_url("agent", "agent-1"),
        }

        async def window() -> tuple[list[int], list[float]]:
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--flood-child",
                json.dumps({"urls": flooders, "seq": seq, "seconds": args.seconds}),
                stdout=asyncio.subprocess.PIPE,
            )
            until = time.monotonic() + args.seconds
            out, during = await asyncio.gather(
                child.communicate(), creates(client, args.creates, until)
            )
            await asyncio.sleep(1)  # answers under way land
            return json.loads(out[0]), during

        started = time.monotonic()
        sent, during = fuzz.run(window())
        elapsed = time.monotonic() - started
        after = last_seq(fuzz)
        appended = subjects_of(fuzz, before + 1, after)
        sessions = fuzz.ask("client", f"{subjects.QUERY}.sessions", b"{}")["rows"]
    own = {subjects.session_events(r["session_id"]) for r in sessions}
    lease = f"{subjects.EVENTS}.{subjects.LEASE}."
    placement = (f"{subjects.EVENTS}.{subjects.RESERVATION}.", f"{subjects.EVENTS}.agent.")
    kinds: Counter[str] = Counter()
    stray = 0
    for subject in appended:
        if subject is None or subject.startswith(lease):
            kinds["the leader's lease renewals"] += 1  # gone: a renewal's TTL ran out
        elif subject in own:
            kinds["the creates' sessions"] += 1
        elif subject.startswith(placement):
            kinds["the creates' placements (agents, reservations)"] += 1
        else:
            kinds[f"UNACCOUNTED {subject}"] += 1
            stray += 1
    print(f"flood: {sum(sent)} aimed JetStream requests in {elapsed:.1f} s")
    for name, n in zip(flooders, sent, strict=True):
        print(f"  {name}: {n}")
    print(f"records appended in the window: {len(appended)} (seq {before} -> {after})")
    print(f"  by cause: {dict(kinds) or 'none'}")
    print(f"records appended by the flood: {stray} (must be 0)")
    q, d = p99(quiet), p99(during)
    print(f"creates to RUNNING: {len(quiet)} without the flood, p99 {q * 1000:.0f} ms;")
    print(f"  {len(during)} during it, p99 {d * 1000:.0f} ms; ratio {d / q:.2f} (issue: <= 2)")
    return 1 if stray else 0


if __name__ == "__main__":
    sys.exit(main())
