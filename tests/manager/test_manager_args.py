"""The manager's command line: what reaches its configuration."""

from __future__ import annotations

import dataclasses
import os

import pytest

from services.manager.main import Drills, ManagerConfig, config_from, parser


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


@pytest.mark.parametrize("flag", ["--heartbeats-per-second", "--heartbeat-deadline"])
@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "soon"])
def test_a_rate_or_deadline_that_is_no_positive_number_is_refused_before_connecting(
    flag: str, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--nats-url", "nats://127.0.0.1:4222", flag, bad])
    assert f"argument {flag}: " in capsys.readouterr().err


def test_the_read_models_threads_reach_the_config_within_the_hosts_cores(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "nats://manager:pw@127.0.0.1:4222"
    assert config_from(parser().parse_args(["--nats-url", url])).read_models_threads == 1
    for bad in ("0", "-1", "1.5", "abc", str((os.cpu_count() or 1) + 1), "100000"):
        with pytest.raises(SystemExit):
            parser().parse_args(["--nats-url", url, "--read-models-threads", bad])
        assert "argument --read-models-threads: " in capsys.readouterr().err


def test_the_command_line_without_flags_gives_the_configs_defaults() -> None:
    """Every default is said once, in ManagerConfig: the flags take theirs from it. (The
    command line differs only where a process is not a test's in-process manager.)"""
    args = parser().parse_args(["--nats-url", "nats://manager:pw@127.0.0.1:4222"])
    got, default = config_from(args), ManagerConfig()
    process_only = {"read_models_url", "bulk_read_url", "short_gc_pauses"}
    differ = {
        f.name
        for f in dataclasses.fields(ManagerConfig)
        if getattr(got, f.name) != getattr(default, f.name)
    }
    assert differ == process_only


def test_the_drills_switches_are_off_by_default_and_hidden() -> None:
    url = "nats://manager:pw@127.0.0.1:4222"
    assert config_from(parser().parse_args(["--nats-url", url])).drills == Drills()
    assert "--no-fence" not in parser().format_help()
    drill = parser().parse_args(["--nats-url", url, "--no-fence", "--step-down-after", "0.3"])
    assert config_from(drill).drills == Drills(fencing=False, step_down_after_s=0.3)
