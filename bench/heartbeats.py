"""Heartbeat handling on the manager: a beat that lists every kernel of its agent against one
that carries the changes since the acknowledged full beat (domain.beats), side by side.

For each kernel count, the manager's liveness watcher takes the same agent's beats, first as
full lists (no acknowledgement), then as changes (none here: a quiet agent), and the time per
beat and its size on the wire are printed with their ratio.  No nats-server: the handler is
called directly with encoded beats.

    python bench/heartbeats.py [--beats 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from domain import rpc
from domain.beats import BeatSender
from services.manager.liveness import LivenessWatcher


class _Msg:
    def __init__(self, data: bytes) -> None:
        self.subject = "hoist.heartbeat.a1"
        self.data = data
        self.headers = {rpc.BEAT_HEADER: "1"}


def _kernel() -> rpc.LiveKernel:
    u = uuid.uuid4().hex
    return rpc.LiveKernel(
        kernel_id=f"k-{u}", session_id=f"s-{u}", container_id=u * 2, status="running"
    )


async def per_beat(kernels: int, acknowledged: bool, beats: int) -> tuple[float, int]:
    """Microseconds per beat handled, and the bytes of one beat."""
    watcher = LivenessWatcher(None, None, agents=object() if acknowledged else None)  # type: ignore[arg-type]

    async def no_ack(*_: Any) -> None:
        pass

    watcher._acknowledge = no_ack  # type: ignore[method-assign]  # no agent to tell
    sender = BeatSender("be47")
    listed = [_kernel() for _ in range(kernels)]

    def beat() -> _Msg:
        body = sender.body(listed)
        return _Msg(
            rpc.encode(
                rpc.Heartbeat(
                    agent_id="a1",
                    sent_at=datetime.now(UTC),
                    kernels=body.kernels,
                    epoch=sender.epoch,
                    seq=body.seq,
                    base=body.base,
                    gone=body.gone,
                    free=rpc.FreeCapacity(cpu=1, mem=1, disk=1),
                    images=["bench/base:1"],
                    pulls={},
                )
            )
        )

    await watcher._on_heartbeat(beat())  # type: ignore[arg-type]
    if acknowledged:
        sender.acked(rpc.BeatsAcked(epoch=sender.epoch, seq=1))
    msgs = [beat() for _ in range(100)]
    start = time.perf_counter()
    for i in range(beats):
        await watcher._on_heartbeat(msgs[i % 100])  # type: ignore[arg-type]
    return (time.perf_counter() - start) / beats * 1e6, len(msgs[0].data)


async def main(args: argparse.Namespace) -> None:
    print("| kernels on the agent | full beat us (bytes) | changes us (bytes) | ratio |")
    print("| --- | --- | --- | --- |")
    for kernels in (2, 6, 21, 100):
        full, full_bytes = await per_beat(kernels, False, args.beats)
        changes, changes_bytes = await per_beat(kernels, True, args.beats)
        print(
            f"| {kernels} | {full:.1f} ({full_bytes:,}) | {changes:.1f} ({changes_bytes:,}) |"
            f" {changes / full:.2f} |"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--beats", type=int, default=20000)
    asyncio.run(main(p.parse_args()))
