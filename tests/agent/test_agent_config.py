"""Agent configuration: sizes, registry credentials, the progress stream's settings."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from nats.js.api import StorageType

from agent.config import AgentConfig, load_registry_auth, parse_size, parse_slot, registry_of
from domain import rpc
from domain.subjects import PROGRESS_STREAM, agent_progress
from transport import progress
from transport.client import Client


def test_sizes_take_units_and_name_the_option() -> None:
    assert parse_size("512m", "--mem") == 512 * 1024**2
    assert parse_size("1.5GiB", "--mem") == int(1.5 * 1024**3)
    assert parse_size("4096", "--disk") == 4096
    with pytest.raises(ValueError, match="--mem must be bytes or a size like 512m"):
        parse_size("lots", "--mem")


def test_config_names_the_bad_option() -> None:
    with pytest.raises(ValueError, match=r"agent id \(--id\)"):
        AgentConfig(agent_id="a.b", resource_group="rg")
    with pytest.raises(ValueError, match=r"--heartbeat-interval"):
        AgentConfig(agent_id="a", resource_group="rg", heartbeat_interval_s=0)
    with pytest.raises(ValueError, match=r"slot gpu \(--slot\) must be > 0"):
        AgentConfig(agent_id="a", resource_group="rg", slots={"gpu": 0})
    with pytest.raises(ValueError, match=r"slot name \(--slot\)"):
        AgentConfig(agent_id="a", resource_group="rg", slots={"GPU": 1})
    with pytest.raises(ValueError, match=r"--keep-exited"):
        AgentConfig(agent_id="a", resource_group="rg", keep_exited_s=-1)
    assert parse_slot("gpu=2") == ("gpu", 2.0)
    with pytest.raises(ValueError, match="--slot must be NAME=AMOUNT"):
        parse_slot("gpu=lots")


def test_registry_credentials_per_host(tmp_path: Path) -> None:
    plain = tmp_path / "auth.json"
    plain.write_text(json.dumps({"127.0.0.1:5000": {"username": "u", "password": "p"}}))
    docker_style = tmp_path / "config.json"
    token = base64.b64encode(b"v:q").decode()
    docker_style.write_text(json.dumps({"auths": {"https://reg.example.com": {"auth": token}}}))
    cfg = AgentConfig(
        agent_id="a",
        resource_group="rg",
        registry_auth={**load_registry_auth(plain), **load_registry_auth(docker_style)},
    )
    assert cfg.auth_for("127.0.0.1:5000/hoist/big:1") == {
        "username": "u",
        "password": "p",
        "serveraddress": "127.0.0.1:5000",
    }
    assert cfg.auth_for("reg.example.com/x/y:2")["username"] == "v"  # type: ignore[index]
    assert cfg.auth_for("busybox:1") is None and registry_of("busybox:1") == "docker.io"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"r.io": {"username": "u"}}))
    with pytest.raises(ValueError, match=r"entry 'r\.io' needs username and password"):
        load_registry_auth(bad)


async def test_the_progress_stream_keeps_the_last_state_per_pull(nc: Client) -> None:
    js = nc.jetstream()
    await progress.ensure(js)
    await progress.ensure(js)  # idempotent
    subject = agent_progress("a1", "t1")
    for current in (1, 5, 9):
        state = rpc.PullProgress(
            agent_id="a1", task_id="t1", image="i", layers=[], current=current, total=9
        )
        await js.publish(subject, rpc.encode(state))
    info = await js.stream_info(PROGRESS_STREAM)
    assert info.config.max_msgs_per_subject == 1 and info.state.messages == 1
    latest = await progress.latest(js, "a1", "t1")
    assert latest is not None and latest.current == 9
    assert await progress.latest(js, "a1", "other") is None
    # Storage cannot be updated in place: ensure recreates the (disposable) stream.
    await progress.ensure(js, storage=StorageType.FILE, max_age_s=60)
    info = await js.stream_info(PROGRESS_STREAM)
    assert (info.config.storage, info.config.max_age) == (StorageType.FILE, 60)


def test_a_dummy_host_has_the_slots_its_agent_offers() -> None:
    from agent.main import make_runtime, parser
    from agent.runtime.dummy import DummyRuntime

    args = parser().parse_args(
        ["--id", "a1", "--runtime", "dummy", "--resource-group", "g", "--slot", "gpu=2"]
    )
    runtime = make_runtime(args, "a1")
    assert isinstance(runtime, DummyRuntime)
    assert runtime.config.slots == {"gpu": 2.0}


def test_gpu_ids_default_to_indices_or_are_named_one_per_gpu() -> None:
    from agent.main import config_from, parser

    def cfg(*extra: str) -> AgentConfig:
        argv = ["--id", "a1", "--runtime", "dummy", "--resource-group", "g", *extra]
        return config_from(parser().parse_args(argv))

    assert cfg().gpu_ids == ()
    assert cfg("--slot", "gpu=3").gpu_ids == ("0", "1", "2")
    named = cfg("--slot", "gpu=2", "--gpu-ids", "GPU-1f2e,GPU-9a8b")
    assert named.gpu_ids == ("GPU-1f2e", "GPU-9a8b")
    with pytest.raises(ValueError, match=r"--gpu-ids names 1 GPUs but --slot gpu=2"):
        cfg("--slot", "gpu=2", "--gpu-ids", "0")
    with pytest.raises(ValueError, match=r"--gpu-ids needs --slot gpu=N"):
        cfg("--gpu-ids", "0")
    with pytest.raises(ValueError, match=r"names a GPU twice"):
        cfg("--slot", "gpu=2", "--gpu-ids", "0,0")
    with pytest.raises(ValueError, match=r"a GPU id is an index or UUID"):
        cfg("--slot", "gpu=1", "--gpu-ids", "a b")
    with pytest.raises(ValueError, match=r"slot gpu \(--slot\) must be a whole number"):
        cfg("--slot", "gpu=1.5")
