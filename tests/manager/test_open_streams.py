"""The streams logs and exec opened, per owner: one user opening many cannot push out another
user's (the server's check and the idle timeout's use count both read them)."""

from __future__ import annotations

from services.manager.open_streams import Opened, OpenStreams


def test_one_owners_many_streams_never_push_out_anothers() -> None:
    streams = OpenStreams(per_owner=3)
    streams.opened("a1", "bob-1", "bob", "s-bob")
    for i in range(100):
        streams.opened("a1", f"alice-{i}", "alice", "s-alice")
    assert streams.get("a1", "bob-1") == Opened("bob", "s-bob")
    assert streams.get("a1", "alice-99") == Opened("alice", "s-alice")
    assert streams.get("a1", "alice-96") is None  # her oldest are forgotten, only hers
    assert streams.get("a2", "bob-1") is None  # a stream id is the agent's


def test_a_stream_id_opened_again_belongs_to_its_latest_owner() -> None:
    streams = OpenStreams(per_owner=2)
    streams.opened("a1", "x", "alice", "s1")
    streams.opened("a1", "x", "bob", "s2")  # an agent reused the id (after a restart)
    assert streams.get("a1", "x") == Opened("bob", "s2")
    for i in range(3):  # alice's forgetting never takes bob's
        streams.opened("a1", f"y{i}", "alice", "s1")
    assert streams.get("a1", "x") == Opened("bob", "s2")
