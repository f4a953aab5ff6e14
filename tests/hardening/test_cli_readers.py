"""The CLI's readers of the log follow the admission rule: `hoist history` shows a forged event
as QUARANTINED with the reason and who wrote it, and `hoist watch` skips what it cannot apply."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from domain import events as ev
from domain.admission import Inadmissible, writer
from domain.codec import ACTOR_HEADER, encode
from domain.session import Session
from domain.status import KernelStatus
from eventstore.store import Recorded
from services.cli.history import format_event as _format_event
from services.cli.progress_view import SessionState
from services.cli.read import truncation_note

MiB = 1024**2


def _session() -> Session:
    return Session.enqueue(
        owner="ann",
        image="img:1",
        resources={"cpu": 1, "mem": MiB},
        resource_group="default",
        cluster_size=1,
    )


def _record(seq: int, subject: str, event: ev.Event, actor: str) -> Recorded:
    data, headers = encode(event)
    headers[ACTOR_HEADER] = actor
    return Recorded(seq, subject, headers, data, datetime.now(UTC))


def test_history_marks_a_forged_event_quarantined_and_names_its_writer() -> None:
    session = _session()
    (enqueued,) = session.collect_events()
    # A session event on an agent's subject: what a hostile agent could append there.
    forged = _record(7, "hoist.events.agent.a1", enqueued, "agent:a1")
    line = _format_event(forged)
    assert "QUARANTINED" in line
    assert "SessionEnqueued may not be on hoist.events.agent.*" in line
    assert "by agent:a1" in line
    # The Hoist-Actor header is the writer's claim; the subject says who wrote it.
    spoofed = _format_event(_record(9, "hoist.events.agent.a1", enqueued, "manager"))
    assert "by agent:a1 (claims manager)" in spoofed
    good = _record(8, f"hoist.events.session.{session.id}", enqueued, "client")
    assert "QUARANTINED" not in _format_event(good)
    assert "SessionEnqueued  by client" in _format_event(good)
    # An event that decodes but that the read models could not apply: history says so too.
    skipped = _format_event(good, {8: "read model sessions cannot fold it: no kernel k"})
    assert "SessionEnqueued  by client  QUARANTINED: read model sessions cannot fold it" in skipped


def test_watch_skips_an_event_it_cannot_apply() -> None:
    session = _session()
    (kernel,) = session.kernels
    state = SessionState(session.id)
    for event in session.collect_events():
        state.apply_event(event)  # type: ignore[arg-type]
    bogus = ev.KernelCreated(
        originator_id=session.id,
        originator_version=2,
        timestamp=datetime.now(UTC),
        kernel_id=kernel,
        status_info="running",
        container_id="c1",
    )
    # PENDING -> RUNNING is no transition: the view refuses it and keeps what it had.
    with pytest.raises(Inadmissible, match="cannot apply"):
        state.apply_event(bogus)
    assert state.status == KernelStatus.PENDING


def test_the_writer_comes_from_the_subject_not_the_actor_header() -> None:
    assert writer("hoist.events.agent.a1") == "agent:a1"
    for kind in (
        "session",
        "liveness",
        "prepull-policy",
        "resource-policy",
        "resource-group",
        "user",
    ):
        assert writer(f"hoist.events.{kind}.x") == "manager"
    assert writer("hoist.events.other.x") == "unknown"
    assert writer("hoist.events.agent.a.b") == "unknown"


def test_a_footer_tells_a_row_cap_from_a_size_cut() -> None:
    assert truncation_note({"truncated": False}) == ""
    assert "raise --limit" in truncation_note({"truncated": True})
    cut = truncation_note({"truncated": True, "hint": "ask for fewer rows with limit"})
    assert "ask for fewer rows" in cut and "raise" not in cut


def test_quarantine_logs_are_capped_per_minute(caplog: pytest.LogCaptureFixture) -> None:
    from eventstore import quarantine as q

    q._window[:] = [0.0, 0, 0]
    with caplog.at_level("WARNING", logger="hoist.quarantine"):
        for seq in range(1, 101):
            q.quarantined(seq, "hoist.events.agent.flood", {}, "garbage", "test")
    assert len(caplog.records) == q.LINES_PER_MINUTE  # the other 80 are only counted
    assert q._window[2] == 100 - q.LINES_PER_MINUTE
    q._window[0] -= 61  # a minute later: the next one logs, after a line that counts the rest
    caplog.clear()
    with caplog.at_level("WARNING", logger="hoist.quarantine"):
        q.quarantined(101, "hoist.events.agent.flood", {}, "garbage", "test")
    assert "80 more events quarantined in the last minute" in caplog.records[0].getMessage()
    assert "event 101 on hoist.events.agent.flood quarantined" in caplog.records[1].getMessage()
