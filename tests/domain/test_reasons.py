"""The status reasons: one enumerated list, documented as it is."""

from pathlib import Path

from domain.reasons import TEXT, Reason, info, reason_of

DOC = Path(__file__).resolve().parents[2] / "docs" / "manager.md"


def test_every_reason_has_its_text_and_the_doc_table_is_the_list() -> None:
    assert set(TEXT) == set(Reason)
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    table = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells[0].strip("`") in {r.value for r in Reason}:
            table[cells[0].strip("`")] = cells[1]
    assert table == {r.value: TEXT[r] for r in Reason}


def test_info_and_reason_of_round_trip() -> None:
    assert info(Reason.AGENT_LOST, "a1 (heartbeat-timeout: no heartbeat for 15s)") == (
        "agent-lost: a1 (heartbeat-timeout: no heartbeat for 15s)"
    )
    assert info(Reason.RUNNING) == "running"
    assert reason_of(info(Reason.PULL_STALLED, "no progress for 3s")) == Reason.PULL_STALLED
    assert reason_of("running") == Reason.RUNNING
