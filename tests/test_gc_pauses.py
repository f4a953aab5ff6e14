"""transport.gc_pauses: what survives a full collection is frozen, and the frozen set is
thawed once as much again was frozen since (so cyclic garbage among it is collected in the end),
counted as it is frozen: the frozen set is never walked."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from transport import gc_pauses


class FakeGc:
    def __init__(self, survivors: int) -> None:
        self.survivors = survivors  # in generation 2 after a full collection, not frozen
        self.calls: list[str] = []

    def get_freeze_count(self) -> int:
        raise AssertionError("walks every frozen object: 40 ms at 20,000 live sessions")

    def get_objects(self, generation: int) -> list[object]:
        assert generation == 2
        return [None] * self.survivors

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")


def test_a_full_collection_freezes_and_a_doubled_frozen_set_is_thawed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeGc(survivors=150_000)
    monkeypatch.setattr(gc_pauses, "gc", fake)
    monkeypatch.setitem(gc_pauses._state, "thawed_at", 200_000)
    monkeypatch.setitem(gc_pauses._state, "since", 0)
    monkeypatch.setitem(gc_pauses._state, "wait", 1)
    gc_pauses._after_collection("stop", {"generation": 1})
    gc_pauses._after_collection("start", {"generation": 2})
    assert fake.calls == []  # only the end of a full collection counts
    gc_pauses._after_collection("stop", {"generation": 2})
    assert fake.calls == ["freeze"]  # 150,000 frozen since the thaw: not yet 200,000
    gc_pauses._after_collection("stop", {"generation": 2})
    assert fake.calls == ["freeze", "freeze"]  # 300,000 since: more than at the thaw
    gc_pauses._after_collection("stop", {"generation": 2})
    assert fake.calls == ["freeze", "freeze", "unfreeze"]
    fake.survivors = 900_000  # the thawed heap's next full collection visits everything
    gc_pauses._after_collection("stop", {"generation": 2})  # and freezes it again
    assert fake.calls == ["freeze", "freeze", "unfreeze", "freeze"]
    assert gc_pauses._state["thawed_at"] == 900_000
    assert gc_pauses._state["since"] == 0


def test_a_thaw_that_finds_next_to_nothing_makes_the_next_one_wait_twice_as_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeGc(survivors=200_000)
    monkeypatch.setattr(gc_pauses, "gc", fake)
    for key, value in {"thawed_at": 200_000, "since": 0, "wait": 1}.items():
        monkeypatch.setitem(gc_pauses._state, key, value)

    def frozen_until_thawed() -> int:
        """Full collections of 200,000 survivors each until one thaws; how many froze."""
        before = len(fake.calls)
        while True:
            gc_pauses._after_collection("stop", {"generation": 2})
            if fake.calls[-1] == "unfreeze":
                return len(fake.calls) - before - 1
            assert len(fake.calls) - before < 100

    assert frozen_until_thawed() == 2  # more than once the heap (200,000) frozen since
    fake.survivors = 400_000
    gc_pauses._after_collection("stop", {"generation": 2, "collected": 9})  # the thawed heap
    assert gc_pauses._state["wait"] == 2  # 9 of 400,009: not worth its pause
    fake.survivors = 200_000
    assert frozen_until_thawed() == 5  # more than twice the heap (800,000) frozen since
    fake.survivors = 400_000
    gc_pauses._after_collection("stop", {"generation": 2, "collected": 50_000})
    assert gc_pauses._state["wait"] == 1  # it found cyclic garbage: once the heap again
    fake.survivors = 200_000
    assert frozen_until_thawed() == 3  # more than once the heap (400,000)


def test_in_a_process_long_lived_objects_leave_the_collections() -> None:
    script = textwrap.dedent(
        """
        import gc
        from transport.gc_pauses import keep_pauses_short
        held = [[i] for i in range(50_000)]
        keep_pauses_short()
        assert gc.get_freeze_count() >= 50_000, gc.get_freeze_count()
        more = [[i] for i in range(50_000)]
        gc.collect()  # a full collection: what survived it is frozen too
        assert gc.get_freeze_count() >= 100_000, gc.get_freeze_count()
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.stdout.strip() == "ok", out.stderr
