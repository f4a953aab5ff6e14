"""The unit of work on a real nats-server: one way to change a session, and what it does on a
conflict (another writer moved the session between the load and the save)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from domain import events as ev
from domain.errors import Conflict, NotNow
from domain.session import Session
from domain.status import KernelStatus
from domain.subjects import USER
from domain.user import User
from eventstore.repository import Repository
from eventstore.store import Recorded, StoreError, event_store
from services.manager import fleet_view as fleet_module
from services.manager.fleet import Fleet
from services.manager.uow import SessionUnknown, UnitOfWork
from tests.agent.agent_harness import wait_for
from transport.client import Client

S = KernelStatus


View = tuple[Fleet, UnitOfWork, list[object]]


@pytest.fixture
async def view(nc: Client) -> AsyncIterator[View]:
    """The manager's view of the log, its unit of work, and what they published."""
    store = event_store(nc)
    await store.ensure_stream()
    published: list[object] = []
    fleet = Fleet(store, Repository(store, actor="manager"), publish=published.append)
    await fleet.start()
    try:
        yield fleet, UnitOfWork(fleet, publish=published.append), published
    finally:
        await fleet.stop()


def _pending(session_id: str) -> Session:
    return Session.enqueue(
        owner="alice",
        image="busybox:1",
        resources={"cpu": 1, "mem": 2**28},
        resource_group="default",
        session_id=session_id,
    )


async def _preparing(uow: UnitOfWork, session_id: str) -> str:
    """A stored session placed on agent a1, its kernel PREPARING; the kernel's id."""
    session = _pending(session_id)
    kernel_id = next(iter(session.kernels))
    await uow.add(session, actor="client")
    async with uow.session(session_id) as s:
        s.schedule({kernel_id: "a1"})
        s.start_preparing()
    return kernel_id


async def test_a_change_is_saved_and_its_events_published(nc: Client, view: View) -> None:
    _, uow, published = view
    await uow.add(_pending("s1"), actor="client")
    async with uow.session("s1", actor="client") as s:
        s.destroy()
    stored = await Repository(event_store(nc)).get(Session, "s1")
    assert stored.status is S.CANCELLED and stored.status_info == "user-requested"
    assert [type(e) for e in published] == [ev.SessionEnqueued, ev.KernelCancelled]


async def test_the_view_does_not_decode_its_own_writes_again(
    nc: Client, view: View, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the manager saved it applied when it saved it: following the log, it passes over
    those records before decoding them, and decodes what others wrote."""
    fleet, uow, _ = view
    admitted: list[str] = []
    real_admit = fleet_module.admit

    def admit(subject: str, headers: Any, data: bytes) -> ev.Event:
        admitted.append(subject)
        return real_admit(subject, headers, data)

    monkeypatch.setattr(fleet_module, "admit", admit)
    await _preparing(uow, "s1")
    other = _pending("s2")
    await Repository(event_store(nc)).save(other)  # another writer
    head = await event_store(nc).head()
    await wait_for(lambda: fleet.last_seq >= head, 5, "the view to follow the log")
    assert "hoist.events.session.s2" in admitted
    assert "hoist.events.session.s1" not in admitted
    assert fleet.sessions["s2"].status is S.PENDING


async def test_on_a_conflict_the_commands_are_called_again_on_the_reloaded_session(
    nc: Client, view: View
) -> None:
    fleet, uow, _ = view
    await uow.add(_pending("s2"), actor="client")
    kernel_id = next(iter(fleet.sessions["s2"].kernels))
    other = Repository(event_store(nc), actor="manager")
    async with uow.session("s2", actor="client") as s:
        # Another writer (a second manager) places the session while this change is being
        # decided on the view's copy: the save below expects a subject that moved.
        theirs = await other.get(Session, "s2")
        theirs.schedule({kernel_id: "a1"})
        theirs.start_preparing()
        await other.save(theirs)
        assert s.status is S.PENDING
        s.destroy()  # PENDING -> CANCELLED here; PREPARING -> CANCELLED after the reload
    stored = await Repository(event_store(nc)).get(Session, "s2")
    k = stored.kernels[kernel_id]
    assert [c.status for c in k.status_history] == [
        S.PENDING,
        S.SCHEDULED,
        S.PREPARING,
        S.CANCELLED,
    ]
    assert k.status_info == "user-requested"
    assert fleet.sessions["s2"].status is S.CANCELLED


async def test_a_refused_command_records_nothing_and_leaves_the_view_as_the_log(
    nc: Client, view: View
) -> None:
    fleet, uow, published = view
    kernel_id = await _preparing(uow, "s3")
    with pytest.raises(NotNow):
        async with uow.session("s3", actor="client") as s:
            s.destroy()  # recorded CANCELLED in the view's copy ...
            s.force_cancel(kernel_id)  # ... then refused: nothing of the block is saved
    assert fleet.sessions["s3"].status is S.PREPARING
    stored = await Repository(event_store(nc)).get(Session, "s3")
    assert stored.status is S.PREPARING
    assert not any(isinstance(e, ev.KernelCancelled) for e in published)
    with pytest.raises(SessionUnknown):
        async with uow.session("nobody"):
            pass


async def test_two_changes_at_once_are_serialized(nc: Client, view: View) -> None:
    _, uow, _ = view
    kernel_id = await _preparing(uow, "s4")

    async def checked(task_id: str | None) -> None:
        await uow.change("s4", lambda s: s.image_checked("a1", task_id), fenced=False)

    await asyncio.gather(checked("t1"), checked(None))
    k = (await Repository(event_store(nc)).get(Session, "s4")).kernels[kernel_id]
    # The first answer decided; the second found the kernel no longer PREPARING.
    assert k.status in (S.PULLING, S.PREPARED)
    assert [c.status for c in k.status_history] == [
        S.PENDING,
        S.SCHEDULED,
        S.PREPARING,
        k.status,
    ]


async def test_a_command_that_no_longer_applies_after_a_conflict_is_refused_not_swallowed(
    nc: Client, view: View
) -> None:
    _, uow, _ = view
    kernel_id = await _preparing(uow, "s5")
    other = Repository(event_store(nc), actor="manager")
    with pytest.raises(NotNow, match="only a kernel not running yet"):
        async with uow.session("s5", actor="admin") as s:
            # Meanwhile another manager got the kernel running.
            theirs = await other.get(Session, "s5")
            theirs.image_checked("a1", None)
            theirs.start_creating()
            theirs.created(kernel_id, container_id="c1")
            await other.save(theirs)
            s.force_cancel(kernel_id, "stuck")  # fine on the view's PREPARING copy
    stored = await Repository(event_store(nc)).get(Session, "s5")
    assert stored.status is S.RUNNING


async def test_a_store_outage_leaves_no_change_in_the_view_that_the_log_lacks(
    nc: Client, view: View, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet, uow, published = view
    session = _pending("s6")
    await uow.add(session, actor="client")
    repository = fleet.repository
    real_save, real_get = repository.save, repository.get
    outage = True

    async def save(*args: object, **kwargs: object) -> list[int]:
        if outage:
            for aggregate in args:
                aggregate.collect_events()  # type: ignore[attr-defined]
            raise StoreError("JetStream did not acknowledge the append")
        return await real_save(*args, **kwargs)  # type: ignore[arg-type]

    async def get(*args: object, **kwargs: object) -> Session:
        if outage:
            raise StoreError("stream HOIST did not answer a direct get")
        return await real_get(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(repository, "save", save)
    monkeypatch.setattr(repository, "get", get)
    with pytest.raises(StoreError):
        async with uow.session("s6", actor="client") as s:
            s.destroy()
    # The view's copy says CANCELLED, the log PENDING: nobody may act on it until reloaded.
    assert not fleet.try_lock("s6")
    assert not any(isinstance(e, ev.KernelCancelled) for e in published)
    outage = False
    async with fleet.locked("s6") as reloaded:
        assert reloaded is not None and reloaded.status is S.PENDING
    assert "s6" in fleet.pending


async def test_the_view_follows_the_log_again_after_a_read_fails(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read the store does not answer (under load: 'did not answer a direct get in 5.0s')
    once ended the follower for good: the manager folded nothing more until restarted."""
    store = event_store(nc)
    await store.ensure_stream()
    monkeypatch.setattr(fleet_module, "FOLLOW_RETRY_S", 0.05)
    replay = store.replay
    calls: list[int] = []

    async def flaky(from_seq: int = 1, **kw: Any) -> AsyncIterator[Recorded]:
        calls.append(from_seq)
        if len(calls) == 2:  # the second follow (after the first record) fails once
            raise StoreError("stream HOIST did not answer a direct get in 5.0s")
        async for rec in replay(from_seq=from_seq, **kw):
            yield rec
            if len(calls) == 1:
                raise StoreError("stream HOIST did not answer a direct get in 5.0s")

    monkeypatch.setattr(store, "replay", flaky)
    repo = Repository(store, actor="client")
    await repo.save(_pending("s1"))
    fleet = Fleet(store, Repository(store, actor="manager"))
    await fleet.start()
    try:
        await repo.save(_pending("s2"))
        for _ in range(200):
            if "s2" in fleet.sessions:
                break
            await asyncio.sleep(0.02)
        assert {"s1", "s2"} <= fleet.sessions.keys()
        assert calls[:3] == [1, 2, 2], calls  # resumed after the last record folded
    finally:
        await fleet.stop()


async def test_a_save_cancelled_mid_append_leaves_no_change_in_the_view_that_the_log_lacks(
    nc: Client, view: View, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reactor's save cancelled while its append waits (its manager stopped leading in a
    stream leader's election) must not leave the view ahead of the log: a chaos run found
    kernels PULLING in the view, PREPARING in the log, and nobody looking again."""
    fleet, uow, _ = view
    await uow.add(_pending("s7"), actor="client")
    sent = asyncio.Event()

    async def hangs(*args: object, **kwargs: object) -> list[int]:
        sent.set()
        await asyncio.Event().wait()  # no acknowledgement comes
        raise AssertionError("unreachable")

    monkeypatch.setattr(fleet.repository, "save", hangs)

    async def destroy() -> None:
        async with uow.session("s7", actor="client") as s:
            s.destroy()

    saving = asyncio.create_task(destroy())
    await asyncio.wait_for(sent.wait(), 5)
    saving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await saving
    monkeypatch.undo()
    assert not fleet.try_lock("s7")  # stale: the next lock reloads it first
    async with fleet.locked("s7") as reloaded:
        assert reloaded is not None and reloaded.status is S.PENDING


# -- aggregates an admin sets ------------------------------------------------------------


async def test_an_admin_change_is_decided_on_a_copy_and_saved_once(nc: Client, view: View) -> None:
    fleet, uow, published = view
    user, recorded = await uow.admin(USER, "ann", lambda u: User.add(u, name="ann", by="admin"))
    assert recorded and fleet.users["ann"] is user
    assert [type(e) for e in published] == [ev.UserAdded]
    # The same again records nothing; the view's aggregate is never the one decided on.
    again, recorded = await uow.admin(USER, "ann", lambda u: User.add(u, name="ann", by="admin"))
    assert not recorded and again is not fleet.users["ann"]
    # A dry run decides and keeps nothing.
    _, recorded = await uow.admin(USER, "ann", lambda u: _disabled(u), dry_run=True)
    assert not recorded and not fleet.users["ann"].disabled
    assert len(published) == 1
    # A refusal is the aggregate's domain error (the responder's ``conflict``); nothing saved.
    await uow.admin(USER, "ann", _disabled)
    with pytest.raises(Conflict, match="name: user 'ann' is already disabled"):
        await uow.admin(USER, "ann", _disabled)
    stored = await Repository(event_store(nc)).get(User, "ann")
    assert stored.disabled and len(published) == 2


async def test_an_admin_change_another_writer_beat_is_a_conflict_saving_nothing(
    nc: Client, view: View
) -> None:
    fleet, uow, published = view
    await uow.admin(USER, "bob", lambda u: User.add(u, name="bob", by="admin"))
    # Another manager disables bob, and this view has not folded it (it stopped following).
    await fleet.stop()
    other = await Repository(event_store(nc)).get(User, "bob")
    other.disable(by="admin")
    await Repository(event_store(nc)).save(other)
    with pytest.raises(Conflict, match=r"'bob' changed meanwhile.*send it again"):
        await uow.admin(USER, "bob", lambda u: User.add(u, name="bob", admin=True, by="admin"))
    stored = await Repository(event_store(nc)).get(User, "bob")
    assert stored.disabled and not stored.admin
    assert len(published) == 1


def _disabled(user: User | None) -> User:
    assert user is not None
    user.disable(by="admin")
    return user
