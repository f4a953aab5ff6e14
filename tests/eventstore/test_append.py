"""Appends: optimistic concurrency, atomic batches, idempotent retries."""

from __future__ import annotations

import asyncio

import pytest

from domain.subjects import EVENTS_ALL, aggregate_subject
from eventstore.store import (
    MAX_BATCH,
    MAX_CONTROL_LINE,
    ConcurrencyError,
    EventStore,
    LimitError,
    Message,
    Recorded,
    StoreError,
    StoreUnavailable,
    Write,
)

A = aggregate_subject("session", "a")
B = aggregate_subject("session", "b")
C = aggregate_subject("agent", "c")


def msgs(*payloads: str) -> list[Message]:
    return [Message(p.encode(), {"type": p}) for p in payloads]


def payloads(records: list[Recorded]) -> list[str]:
    return [r.data.decode() for r in records]


async def test_append_returns_sequences_and_read_subject_returns_history(store: EventStore) -> None:
    assert await store.last_seq(A) == 0
    assert await store.append([Write(A, msgs("a1"), expected_last_seq=0)]) == [1]
    assert await store.append([Write(B, msgs("b1", "b2"), expected_last_seq=0)]) == [2, 3]
    assert await store.append([Write(A, msgs("a2", "a3"), expected_last_seq=1)]) == [4, 5]
    assert await store.last_seq(A) == 5
    history = await store.read_subject(A)
    assert [r.seq for r in history] == [1, 4, 5]
    assert payloads(history) == ["a1", "a2", "a3"]
    assert history[0].subject == A
    assert history[0].headers["type"] == "a1"
    assert "Nats-Sequence" not in history[0].headers
    assert payloads(await store.read_subject(A, after_seq=4)) == ["a3"]
    assert await store.read_subject(C) == []


async def test_read_subject_spans_several_direct_get_batches(store: EventStore) -> None:
    for start in range(0, 2500, MAX_BATCH):
        n = min(MAX_BATCH, 2500 - start)
        await store.append([Write(A, msgs(*(str(i) for i in range(start, start + n))))])
    history = await store.read_subject(A)
    assert payloads(history) == [str(i) for i in range(2500)]
    assert [r.seq for r in history] == list(range(1, 2501))


async def test_racing_commands_one_wins_the_loser_reloads_and_succeeds(store: EventStore) -> None:
    await store.append([Write(A, msgs("created"), expected_last_seq=0)])

    async def command(name: str) -> tuple[int, int]:
        """Read, decide, append; on conflict reload and decide again. Returns (attempts, seq)."""
        attempts = 0
        while True:
            attempts += 1
            last = await store.last_seq(A)
            await asyncio.sleep(0)  # both read before either writes
            try:
                [seq] = await store.append([Write(A, msgs(name), expected_last_seq=last)])
                return attempts, seq
            except ConcurrencyError as err:
                assert err.subject == A
                assert err.expected_last_seq == last

    (att1, seq1), (att2, seq2) = await asyncio.gather(command("x"), command("y"))
    assert sorted([att1, att2]) == [1, 2]  # exactly one lost the race once
    assert payloads(await store.read_subject(A)) == [
        "created",
        *(["x", "y"] if seq1 < seq2 else ["y", "x"]),
    ]


async def test_stale_expected_sequence_raises_and_writes_nothing(store: EventStore) -> None:
    await store.append([Write(A, msgs("a1"), expected_last_seq=0)])
    with pytest.raises(ConcurrencyError, match="reload it and try again"):
        await store.append([Write(A, msgs("late"), expected_last_seq=0)])
    assert payloads(await store.read_subject(A)) == ["a1"]


async def test_conflicting_multi_aggregate_append_writes_nothing(store: EventStore) -> None:
    await store.append([Write(B, msgs("b1"), expected_last_seq=0)])
    writes = [
        Write(A, msgs("a1", "a2"), expected_last_seq=0),
        Write(B, msgs("b2"), expected_last_seq=0),  # stale: B is at 1
        Write(C, msgs("c1"), expected_last_seq=0),
    ]
    with pytest.raises(ConcurrencyError) as caught:
        await store.append(writes)
    assert caught.value.subject == B
    assert await store.read_subject(A) == []
    assert await store.read_subject(C) == []
    assert (await store.js.stream_info(store.stream)).state.messages == 1


async def test_multi_aggregate_append_is_one_batch_in_order(store: EventStore) -> None:
    seqs = await store.append(
        [Write(A, msgs("a1", "a2"), expected_last_seq=0), Write(C, msgs("c1"), expected_last_seq=0)]
    )
    assert seqs == [1, 2, 3]
    assert payloads(await store.read_subject(A)) == ["a1", "a2"]
    assert [r.seq for r in await store.read_subject(C)] == [3]


TERM = aggregate_subject("lease", "term")
FENCE = aggregate_subject("lease", "fence")


def fence(term_seq: int) -> Write:
    return Write(
        FENCE, msgs("fence"), expected_last_seq=term_seq, expected_subject=TERM, check_only=True
    )


async def test_a_riding_check_goes_on_a_spare_message_and_is_not_stored(store: EventStore) -> None:
    [term] = await store.append([Write(TERM, msgs("term"))])
    writes = [Write(A, msgs("a1", "a2"), expected_last_seq=0), Write(C, msgs("c1")), fence(term)]
    assert await store.append(writes) == [2, 3, 4, 3]  # the fence's: its carrier's
    assert await store.read_subject(FENCE) == []
    first, carrier = await store.read_subject(A)
    assert carrier.headers["Nats-Expected-Last-Subject-Sequence-Subject"] == TERM
    assert carrier.headers["Nats-Expected-Last-Subject-Sequence"] == str(term)
    assert first.headers["Nats-Expected-Last-Subject-Sequence"] == "0"  # its own check kept
    await store.append([Write(TERM, msgs("next term"))])
    with pytest.raises(ConcurrencyError) as caught:  # a paused ex-leader's batch
        await store.append([Write(B, msgs("b1", "b2"), expected_last_seq=0), fence(term)])
    assert caught.value.subject == TERM
    assert await store.read_subject(B) == []


async def test_a_riding_check_with_nothing_to_ride_on_is_stored(store: EventStore) -> None:
    [term] = await store.append([Write(TERM, msgs("term"))])
    assert await store.append([Write(A, msgs("a1"), expected_last_seq=0), fence(term)]) == [2, 3]
    assert payloads(await store.read_subject(FENCE)) == ["fence"]
    # each subject's first message checks its own sequence: none carries it
    writes = [Write(B, msgs("b1"), expected_last_seq=0), Write(C, msgs("c1"), expected_last_seq=0)]
    assert await store.append([*writes, fence(term)]) == [4, 5, 6]
    assert len(await store.read_subject(FENCE)) == 2


async def test_a_check_only_write_first_or_checking_nothing_is_refused_or_stored(
    store: EventStore,
) -> None:
    [term] = await store.append([Write(TERM, msgs("term"))])
    # first: it is stored as it is (the first message keeps an idempotency key), and a retry
    # under the key finds the original sequences
    writes = [fence(term), Write(A, msgs("a1", "a2"), expected_last_seq=0)]
    assert await store.append(writes, idempotency_key="k1") == [2, 3, 4]
    assert await store.append(writes, idempotency_key="k1") == [2, 3, 4]
    for bad in (
        Write(FENCE, msgs("f"), check_only=True),
        Write(FENCE, msgs("f"), expected_last_seq=term, check_only=True),
        Write(
            FENCE, msgs("f", "g"), expected_last_seq=term, expected_subject=TERM, check_only=True
        ),
    ):
        with pytest.raises(ValueError, match=r"writes\[1\] is check_only: it must be one message"):
            await store.append([Write(B, msgs("b1", "b2")), bad])
    assert await store.read_subject(B) == []


async def test_retried_single_message_appends_once(store: EventStore) -> None:
    await store.append([Write(A, msgs("a1"), expected_last_seq=0)])
    write = Write(A, msgs("a2"), expected_last_seq=1)
    first = await store.append([write], idempotency_key="req-1")
    # Another command moves A on; the retry must still be recognised, not be a conflict.
    await store.append([Write(A, msgs("a3"), expected_last_seq=2)])
    assert await store.append([write], idempotency_key="req-1") == first == [2]
    # Without an expected sequence the server's duplicate detection answers.
    unchecked = Write(A, msgs("a4"))
    again = await store.append([unchecked], idempotency_key="req-2")
    assert await store.append([unchecked], idempotency_key="req-2") == again
    assert payloads(await store.read_subject(A)) == ["a1", "a2", "a3", "a4"]


async def test_retried_batch_appends_once_and_returns_original_sequences(store: EventStore) -> None:
    writes = [
        Write(A, msgs("a1", "a2"), expected_last_seq=0),
        Write(C, msgs("c1"), expected_last_seq=0),
    ]
    first = await store.append(writes, idempotency_key="req-1")
    await store.append([Write(C, msgs("c2"), expected_last_seq=3)])
    assert await store.append(writes, idempotency_key="req-1") == first == [1, 2, 3]
    unchecked = [Write(A, msgs("a3")), Write(B, msgs("b1"))]
    again = await store.append(unchecked, idempotency_key="req-2")
    assert await store.append(unchecked, idempotency_key="req-2") == again == [5, 6]
    assert (await store.js.stream_info(store.stream)).state.messages == 6


async def test_a_different_command_under_a_used_key_is_refused(store: EventStore) -> None:
    await store.append([Write(A, msgs("a1", "a2"), expected_last_seq=0)], idempotency_key="k")
    with pytest.raises(StoreError, match="use a new request id"):
        await store.append(
            [Write(A, msgs("a1", "a2", "a3"), expected_last_seq=0)], idempotency_key="k"
        )


async def test_bad_input_names_the_field(store: EventStore) -> None:
    with pytest.raises(ValueError, match="at most 1000 messages"):
        await store.append([Write(A, msgs(*("x" for _ in range(MAX_BATCH + 1))))])
    with pytest.raises(ValueError, match=r"writes\[0\] .* has no messages"):
        await store.append([Write(A, [])])
    with pytest.raises(ValueError, match="expected_last_seq"):
        await store.append([Write(A, msgs("x"), expected_last_seq=-1)])
    with pytest.raises(ValueError, match="idempotency_key"):
        await store.append([Write(A, msgs("x"))], idempotency_key="a b")
    assert await store.append([]) == []


async def test_what_the_server_would_not_take_is_refused_before_sending(store: EventStore) -> None:
    """A subject too long for a protocol line, or a message over max_payload with its headers,
    made nats-server close the connection (every later append failed); now LimitError, nothing
    sent, and the connection serves on."""
    most = store.max_subject_bytes
    assert MAX_CONTROL_LINE - 100 < most < MAX_CONTROL_LINE
    longest = f"{EVENTS_ALL[:-1]}{'x' * (most - len(EVENTS_ALL) + 1)}"
    assert len(longest) == most
    assert await store.append([Write(longest, msgs("fits"), expected_last_seq=0)]) == [1]
    last = await store.last(longest)  # its direct get's line is shorter than the append's
    assert last is not None and last.data == b"fits"
    too_long = longest + "x"
    for writes in (
        [Write(too_long, msgs("x"))],
        [Write(A, msgs("a")), Write(too_long, msgs("x"), expected_last_seq=0)],
    ):
        with pytest.raises(LimitError, match=rf"subject is {most + 1} bytes, over the {most}"):
            await store.append(writes)
    # Read paths take any subject: the request names it in its body when the line would not.
    assert await store.last(too_long + "x" * 100) is None
    assert await store.read_subject(too_long + "x" * 100) == []

    max_payload = store.nc.max_payload
    with pytest.raises(LimitError, match=f"over the server's max_payload of {max_payload}"):
        await store.append([Write(A, [Message(b"x" * (max_payload - 10), {"type": "big"})])])
    with pytest.raises(LimitError, match="max_payload"):
        await store.append([Write(A, [Message(b"x" * (2 * max_payload))])])
    with pytest.raises(LimitError, match="headers take 70"):
        await store.append([Write(A, [Message(b"x", {"type": "t" * 70_000})])])
    with pytest.raises(LimitError, match="at most 1000 messages"):
        await store.append([Write(A, msgs(*("x" for _ in range(MAX_BATCH + 1))))])

    assert not store.nc.is_closed
    assert await store.append([Write(A, msgs("a1"), expected_last_seq=0)]) == [2]
    assert await store.read_subject(A) != []


async def test_append_without_stream_says_to_ensure_it(nc) -> None:  # type: ignore[no-untyped-def]
    store = EventStore(nc, "NOPE", ["nope.>"])
    with pytest.raises(StoreError, match="ensure_stream"):
        await store.append([Write("nope.x", msgs("x"))])
    await EventStore(nc, "NOPE", ["nope.a.*"]).ensure_stream()
    with pytest.raises(StoreError, match=r"no stream takes nope\.b: call ensure_stream") as raised:
        await store.append([Write("nope.b", msgs("x"))])  # the stream is there, not for it
    assert not isinstance(raised.value, StoreUnavailable)


async def test_a_key_reused_on_another_subject_is_refused(store: EventStore) -> None:
    await store.append([Write(A, msgs("a1", "a2"))], idempotency_key="k")
    with pytest.raises(StoreError, match="already used by another command"):
        await store.append([Write(C, msgs("c1", "c2"))], idempotency_key="k")
    assert await store.read_subject(C) == []


async def test_last_returns_the_subjects_last_message_with_its_headers(store: EventStore) -> None:
    assert await store.last(A) is None
    await store.append([Write(A, msgs("a1", "a2"))])
    await store.append([Write(C, msgs("c1"))])
    last = await store.last(A)
    assert last is not None
    assert (last.seq, last.subject, payloads([last])) == (2, A, ["a2"])
    assert last.headers["type"] == "a2"
    assert "Nats-Sequence" not in last.headers
    assert last == (await store.read_subject(A))[-1]
    newest = await store.last(EVENTS_ALL)  # a wildcard: the newest of all subjects
    assert newest is not None and newest.subject == C
    assert await store.last_seq(A) == 2
