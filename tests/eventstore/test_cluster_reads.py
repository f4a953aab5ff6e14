"""Read-after-write on a real three-node cluster: the store never returns a read of a subject
from below what it wrote, read, or was told by a conflict (ADR-31: a direct get may be answered
by a replica that lags), and it rides out a node's loss."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import nats.errors
import nats.js.errors
import pytest

from domain import subjects
from domain.subjects import aggregate_subject
from eventstore import reads as reads_module
from eventstore.store import ConcurrencyError, EventStore, Message, StoreError, Write
from services.stack.natsserver import NatsCluster, wait_jetstream
from tests.infra.cluster import stream_leader
from transport.client import Client, connect

A = aggregate_subject("session", "a")


def one(text: str) -> list[Message]:
    return [Message(text.encode(), {"type": text})]


def event_store(nc: Client) -> EventStore:
    return EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])


# The tests that kill no node share one cluster (starting one costs a second and more of both
# cores); each gets the stream afresh.
@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture
async def shared_nc(shared_cluster: NatsCluster) -> AsyncIterator[Client]:
    """As ``cluster_nc``, on the shared cluster, its event stream deleted."""
    client = await connect(shared_cluster.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await client.jetstream().delete_stream(subjects.EVENT_STREAM)
    yield client
    await client.close()


async def test_streams_are_created_with_three_replicas_on_a_cluster(shared_nc: Client) -> None:
    store = event_store(shared_nc)
    await store.ensure_stream()  # replicas from the cluster's size, as the manager does
    info = await shared_nc.jetstream().stream_info(subjects.EVENT_STREAM)
    assert info.config.num_replicas == 3
    assert info.cluster is not None and len(info.cluster.replicas or []) == 2
    await store.ensure_stream(replicas=3)  # the stack's explicit check agrees
    with pytest.raises(StoreError, match="num_replicas is 3, needs 1"):
        await store.ensure_stream(replicas=1)


async def test_each_append_is_read_back_through_every_node_also_while_one_restarts(
    nats_cluster: NatsCluster, cluster_nc: Client
) -> None:
    writer = event_store(cluster_nc)
    await writer.ensure_stream()
    # Each reader talks to one node only: its direct gets are answered there first (NATS
    # prefers a local responder), a follower for two of the three.
    readers = [event_store(await connect(s.url)) for s in nats_cluster.servers]
    leader = await stream_leader(cluster_nc, subjects.EVENT_STREAM)
    follower = next(i for i, n in enumerate(nats_cluster.nodes) if n.name != leader)
    last = 0
    for round_ in range(60):
        if round_ == 20:
            nats_cluster.kill(follower)
        if round_ == 35:
            nats_cluster.restart(follower)  # it recovers its store, then catches up
            await readers[follower].nc.close()
            url = nats_cluster.servers[follower].url
            await wait_jetstream(url)  # it answers once it rejoined the meta layer
            readers[follower] = event_store(await connect(url))
        [last] = await writer.append(
            [Write(A, one(f"e{round_}"), expected_last_seq=last)], idempotency_key=f"e{round_}"
        )
        for i, reader in enumerate(readers):
            if 20 <= round_ < 35 and i == follower:
                continue  # down
            reader._saw(A, last)  # told of the write, as a process is by the one that made it
            history = await reader.read_subject(A)
            assert history[-1].seq == last, (round_, i)
            assert (await reader.last(A)) is not None
    for reader in readers:
        await reader.nc.close()


async def test_a_reload_after_a_conflict_sees_at_least_the_write_it_lost_to(
    shared_cluster: NatsCluster, shared_nc: Client
) -> None:
    ours = event_store(await connect(shared_cluster.servers[0].url))
    theirs = event_store(await connect(shared_cluster.servers[1].url))
    await ours.ensure_stream()
    [first] = await ours.append([Write(A, one("created"), expected_last_seq=0)])
    [won] = await theirs.append([Write(A, one("theirs"), expected_last_seq=first)])
    with pytest.raises(ConcurrencyError):
        await ours.append([Write(A, one("ours"), expected_last_seq=first)])
    assert ours._floors[A] == won  # the conflict named the subject's last sequence
    assert (await ours.read_subject(A))[-1].seq == won
    assert await ours.last_seq(A) == won
    for s in (ours, theirs):
        await s.nc.close()


async def test_a_refused_batch_names_the_subject_that_moved_and_its_reload_sees_it(
    shared_cluster: NatsCluster, shared_nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's refusal names no sequence: the store asks the stream's leader (not a replica,
    which may not have the write yet) which subject moved, and the reload reads that far."""
    ours = event_store(await connect(shared_cluster.servers[0].url))
    theirs = event_store(await connect(shared_cluster.servers[1].url))
    await ours.ensure_stream()
    B = aggregate_subject("session", "b")
    [a0, b0] = await ours.append(
        [Write(A, one("a"), expected_last_seq=0), Write(B, one("b"), expected_last_seq=0)]
    )
    stale = await ours.last(B)
    [won] = await theirs.append([Write(B, one("theirs"), expected_last_seq=b0)])
    direct_get = ours._last

    async def lagging(subject: str, urgent: bool = False) -> object:
        # The replica answering our direct gets of B has not applied their write yet.
        return (
            stale
            if subject == B and ours._floors.get(B, 0) < won
            else await direct_get(subject, urgent)
        )

    monkeypatch.setattr(ours, "_last", lagging)
    with pytest.raises(ConcurrencyError) as refused:
        await ours.append(
            [Write(A, one("a2"), expected_last_seq=a0), Write(B, one("b2"), expected_last_seq=b0)]
        )
    assert refused.value.subject == B  # not A, which did not move
    assert ours._floors[B] == won
    assert (await ours.read_subject(B))[-1].seq == won
    assert await ours.last_seq(A) == a0  # nothing of the refused batch stored
    for s in (ours, theirs):
        await s.nc.close()


async def test_a_read_from_behind_the_floor_is_asked_again_until_the_write_shows(
    shared_nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that has not applied a write yet answers from before it: the store asks again
    (here the write lands 0.3 s into the retries), and gives up with a StoreError, never a
    stale history, when no replica catches up."""
    store = event_store(shared_nc)
    await store.ensure_stream()
    await stream_leader(shared_nc, subjects.EVENT_STREAM)  # a stream made again elects first
    [first] = await store.append([Write(A, one("created"), expected_last_seq=0)])
    store._saw(A, first + 1)  # a write it was told of, not yet visible anywhere

    async def append_later() -> None:
        await asyncio.sleep(0.3)
        other = event_store(shared_nc)
        await other.append([Write(A, one("later"), expected_last_seq=first)])

    later = asyncio.create_task(append_later())
    history = await store.read_subject(A)
    await later
    assert [r.data for r in history] == [b"created", b"later"]

    monkeypatch.setattr(reads_module, "_LAG_PAUSES", (0.01, 0.02))
    store._saw(A, first + 5)
    with pytest.raises(StoreError, match="behind"):
        await store.read_subject(A)
    with pytest.raises(StoreError, match="behind"):
        await store.last(A)


async def test_appends_go_on_after_the_stream_leader_is_killed(
    nats_cluster: NatsCluster, cluster_nc: Client
) -> None:
    # An append nobody answers (no leader yet) is sent again after 1 s, not the default 5 s:
    # the test waits for the election, not for a timeout that outlasts it.
    store = EventStore(cluster_nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL], timeout=1.0)
    await store.ensure_stream()
    acked = [await store.append([Write(A, one("0"), expected_last_seq=0)])]
    leader = await stream_leader(cluster_nc, subjects.EVENT_STREAM)
    nats_cluster.kill(nats_cluster.index(leader))
    last = acked[0][0]
    for i in range(1, 20):
        for _attempt in range(40):  # the same write again until a new leader acknowledges it
            try:
                acked.append(
                    await store.append(
                        [Write(A, one(str(i)), expected_last_seq=last)], idempotency_key=f"k{i}"
                    )
                )
                break
            except (StoreError, nats.errors.Error):  # no leader yet, reconnecting
                await asyncio.sleep(0.25)
        last = acked[-1][0]
    assert await stream_leader(cluster_nc, subjects.EVENT_STREAM) != leader
    assert [r.seq for r in await store.read_subject(A)] == [s for [s] in acked]
