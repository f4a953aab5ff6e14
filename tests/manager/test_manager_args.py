"""The manager's command line: what reaches its configuration."""

from __future__ import annotations

from services.manager.main import config_from, parser


def test_the_read_models_catch_up_through_a_child_unless_told_not_to() -> None:
    url = "nats://manager:pw@127.0.0.1:4222"
    assert config_from(parser().parse_args(["--nats-url", url])).bulk_read_url == url
    no_bulk = parser().parse_args(["--nats-url", url, "--no-bulk-read"])
    assert config_from(no_bulk).bulk_read_url is None


def test_the_order_of_pending_sessions_is_fifo_unless_drf_is_asked() -> None:
    url = "nats://manager:pw@127.0.0.1:4222"
    assert config_from(parser().parse_args(["--nats-url", url])).policy.order == "fifo"
    drf = parser().parse_args(["--nats-url", url, "--order", "drf"])
    assert config_from(drf).policy.order == "drf"


def test_the_fleets_heartbeats_a_second_reach_the_liveness_watcher() -> None:
    url = "nats://manager:pw@127.0.0.1:4222"
    assert config_from(parser().parse_args(["--nats-url", url])).heartbeats_per_s == 100.0
    paced = parser().parse_args(["--nats-url", url, "--heartbeats-per-second", "50"])
    assert config_from(paced).heartbeats_per_s == 50.0
