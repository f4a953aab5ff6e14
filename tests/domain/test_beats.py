"""domain.beats: heartbeats that carry changes. Whatever is lost, delayed or restarted, a beat
the manager applies lists exactly what the agent listed; and once acknowledged, beats carry
changes only."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.beats import MIN_CHANGES, BeatReceiver, BeatSender
from domain.rpc import BeatsAcked, FreeCapacity, Heartbeat, LiveKernel

KERNELS = [f"k{i}" for i in range(40)]


def kernel(kid: str, status: Any = "running") -> LiveKernel:
    return LiveKernel(kernel_id=kid, session_id="s-" + kid, container_id="c-" + kid, status=status)


def beat(sender: BeatSender, kernels: list[LiveKernel]) -> Heartbeat:
    body = sender.body(kernels)
    return Heartbeat(
        agent_id="a1",
        sent_at=datetime.now(UTC),
        kernels=body.kernels,
        free=FreeCapacity(cpu=1, mem=1, disk=1),
        images=[],
        pulls={},
        epoch=sender.epoch,
        seq=body.seq,
        base=body.base,
        gone=body.gone,
    )


def listed(kernels: list[LiveKernel]) -> dict[str, LiveKernel]:
    return {k.kernel_id: k for k in kernels}


steps = st.one_of(
    st.tuples(st.just("set"), st.sets(st.sampled_from(KERNELS), max_size=30), st.booleans()),
    st.tuples(st.just("beat"), st.booleans()),  # delivered or lost
    st.tuples(st.just("deliver-acks"), st.integers(0, 3)),  # how many of the oldest
    st.tuples(st.just("drop-acks"), st.just(0)),
    st.tuples(st.just("restart-agent"), st.just(0)),
    st.tuples(st.just("restart-manager"), st.just(0)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(steps, max_size=60))
def test_an_applied_beat_lists_what_the_agent_listed(ops: list[tuple[Any, ...]]) -> None:
    epochs = iter(f"{n:04x}" for n in range(1000))
    sender, receiver = BeatSender(next(epochs)), BeatReceiver()
    now: list[LiveKernel] = []
    acks: list[BeatsAcked] = []  # in flight to the agent, in order
    for op, arg, *more in ops:
        if op == "set":
            now = [kernel(k, "exited" if more[0] and k < "k2" else "running") for k in sorted(arg)]
        elif op == "beat":
            sent = beat(sender, now)
            if not arg:
                continue  # lost on the way
            applied, ack = receiver.receive(sent)
            if ack is not None:
                acks.append(ack)
            if applied is not None:
                assert listed(applied.kernels) == listed(now)
                assert applied.base is None and applied.gone == []
        elif op == "deliver-acks":
            for ack in acks[:arg]:
                sender.acked(ack)
            del acks[:arg]
        elif op == "drop-acks":
            acks.clear()
        elif op == "restart-agent":
            sender = BeatSender(next(epochs))
        else:
            receiver = BeatReceiver()


def test_once_acknowledged_a_beat_carries_the_changes_only() -> None:
    sender, receiver = BeatSender("ab"), BeatReceiver()
    kernels = [kernel(k) for k in KERNELS[:20]]
    full = beat(sender, kernels)
    assert full.base is None and len(full.kernels) == 20
    _, ack = receiver.receive(full)
    assert ack == BeatsAcked(epoch="ab", seq=full.seq)
    assert sender.acked(ack) == full.seq
    quiet = beat(sender, kernels)
    assert (quiet.base, quiet.kernels, quiet.gone) == (full.seq, [], [])
    kernels = [*kernels[1:], kernel("k30"), kernel("k5", "exited")]
    kernels = [k for k in kernels if not (k.kernel_id == "k5" and k.status == "running")]
    changed = beat(sender, kernels)
    assert changed.base == full.seq
    assert {k.kernel_id for k in changed.kernels} == {"k30", "k5"}
    assert changed.gone == ["k0"]
    applied, ack = receiver.receive(changed)
    assert ack is None and applied is not None and listed(applied.kernels) == listed(kernels)
    # A restarted manager holds no base: it asks for everything, and the next beat is full.
    _, ack = BeatReceiver().receive(beat(sender, kernels))
    assert ack == BeatsAcked(epoch="ab", seq=None)
    assert sender.acked(ack) is None
    assert beat(sender, kernels).base is None
    # Changes past half the list (and MIN_CHANGES) make a full beat again.
    sender.acked(receiver.receive(beat(sender, kernels))[1])  # type: ignore[arg-type]
    many = [kernel(k) for k in KERNELS[20 : 21 + max(MIN_CHANGES, len(kernels) // 2)]]
    assert beat(sender, many).base is None


def test_an_agent_without_an_epoch_is_never_acknowledged() -> None:
    old = Heartbeat(
        agent_id="a1",
        sent_at=datetime.now(UTC),
        kernels=[kernel("k1")],
        free=FreeCapacity(cpu=1, mem=1, disk=1),
        images=[],
        pulls={},
    )
    assert BeatReceiver().receive(old) == (old, None)
