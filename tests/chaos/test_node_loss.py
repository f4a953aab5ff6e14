"""SIGKILL the event stream's leader (a nats-server of a `hoist up --nats-nodes 3` stack) while
200 sessions are being created: nothing acknowledged is lost, every session settles with a
reason, and the read models equal a rebuild. Longer runs: bench/chaos.py."""

from __future__ import annotations

from pathlib import Path

from bench.chaos import ClusterStack, node_loss_round


async def test_killing_the_stream_leader_mid_burst_loses_no_acknowledged_session(
    tmp_path: Path,
) -> None:
    with ClusterStack(tmp_path / "data", 2) as stack:
        result = await node_loss_round(stack, 200, "chaos", settle_s=60)
        assert result.killed, "the leader was never killed"
        assert not result.refused, result.refused
        assert len(result.acked) == 200, f"unacknowledged creates: {200 - len(result.acked)}"
        assert result.missing == [], f"acknowledged but not in the log: {result.missing}"
        assert result.unsettled == {}, (result.unsettled, result.histories)
        assert result.no_reason == [], result.no_reason
        assert result.verified, result.verify
