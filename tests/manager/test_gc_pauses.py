"""services.manager.gc_pauses: what survives a full collection is frozen, and the frozen set is
thawed once it has doubled (so cyclic garbage among it is collected in the end)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from services.manager import gc_pauses


class FakeGc:
    def __init__(self, frozen: int) -> None:
        self.frozen = frozen
        self.calls: list[str] = []

    def get_freeze_count(self) -> int:
        return self.frozen

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")
        self.frozen = 0


def test_a_full_collection_freezes_and_a_doubled_frozen_set_is_thawed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeGc(frozen=300_000)
    monkeypatch.setattr(gc_pauses, "gc", fake)
    monkeypatch.setitem(gc_pauses._state, "thawed_at", 200_000)
    gc_pauses._after_collection("stop", {"generation": 1})
    gc_pauses._after_collection("start", {"generation": 2})
    assert fake.calls == []  # only the end of a full collection counts
    gc_pauses._after_collection("stop", {"generation": 2})
    assert fake.calls == ["freeze"]
    fake.frozen = 400_001  # more than twice what was frozen after the last thaw
    gc_pauses._after_collection("stop", {"generation": 2})
    assert fake.calls == ["freeze", "unfreeze"]
    gc_pauses._after_collection("stop", {"generation": 2})  # the next one freezes again
    assert fake.calls == ["freeze", "unfreeze", "freeze"]


def test_in_a_process_long_lived_objects_leave_the_collections() -> None:
    script = textwrap.dedent(
        """
        import gc
        from services.manager.gc_pauses import keep_pauses_short
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
