"""What a session's kernels run and how their end is recorded: the spec at enqueue, cluster
info, exit codes, batch sessions, resource slots at the door."""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec
import pytest

from agent.runtime.base import validate_create
from domain import events as ev
from domain.codec import decode, encode
from domain.contracts.sessions import CreateSession, resources_from, session_view
from domain.errors import InvalidField
from domain.rpc import RequestError
from domain.rpc import decode as decode_request
from domain.session import Session
from domain.status import KernelStatus

S = KernelStatus
MiB = 2**20


@dataclass(frozen=True)
class End:
    exit_code: int
    oom_killed: bool = False
    ran_s: float = 1.5


def running(session_type: str = "interactive", size: int = 2, **spec: object) -> Session:
    s = Session.enqueue(
        owner="alice",
        image="busybox:1",
        resources={"cpu": 1, "mem": 64 * MiB},
        resource_group="default",
        cluster_size=size,
        session_type=session_type,  # type: ignore[arg-type]
        spec=spec or {"command": ["sh", "-c", "exit 0"]},
    )
    s.schedule({kid: f"a{i}" for i, kid in enumerate(s.kernels)})
    s.start_preparing()
    for i in range(size):
        s.image_checked(f"a{i}", None)
    s.start_creating()
    for kid in s.kernels:
        s.created(kid, container_id=f"c-{kid}")
    assert s.status is S.RUNNING
    return s


def test_batch_main_exit_zero_succeeds_and_stops_the_others() -> None:
    s = running("batch")
    main, sub = s.kernels
    s.process_ended("a0", main, End(0, ran_s=2.25))
    assert s.kernels[main].status is S.TERMINATED
    assert s.kernels[main].status_info == "succeeded"
    assert (s.kernels[main].exit_code, s.kernels[main].ran_s) == (0, 2.25)
    assert s.kernels[sub].status is S.TERMINATING
    assert s.kernels[sub].status_info == "session-ended: succeeded"
    s.container_removed(sub, True)
    assert (s.status, s.status_info) == (S.TERMINATED, "succeeded")


def test_batch_nonzero_exit_ends_the_session_with_its_code() -> None:
    s = running("batch", size=1)
    (main,) = s.kernels
    s.process_ended("a0", main, End(3))
    assert (s.status, s.status_info) == (S.TERMINATED, "exited: code 3")
    view = session_view(s)
    assert view.kernels[0].exit_code == 3
    assert view.kernels[0].ran_s == 1.5


@pytest.mark.parametrize(
    ("end", "why"),
    [
        (End(137), "killed: signal 9"),
        (End(137, oom_killed=True), "oom-killed"),
        (End(0), "exited: code 0"),
        (End(143), "killed: signal 15"),
    ],
)
def test_interactive_kernel_that_stops_is_reported_with_its_reason(end: End, why: str) -> None:
    s = running("interactive", size=2)
    main, sub = s.kernels
    s.process_ended("a1", sub, end)
    assert s.kernels[sub].status_info == why
    assert s.kernels[sub].exit_code == end.exit_code
    assert s.kernels[main].status is S.RUNNING  # an interactive session goes on


def test_late_repeated_or_misplaced_exit_reports_record_nothing() -> None:
    s = running("batch", size=1)
    (main,) = s.kernels
    s.process_ended("a9", main, End(1))  # not where the kernel runs
    s.process_ended("a0", "nope", End(1))  # no such kernel
    assert not list(s.collect_events())[6:]
    s.process_ended("a0", main, End(0))
    s.process_ended("a0", main, End(1))  # repeated: already TERMINATED
    assert s.kernels[main].exit_code == 0


def test_sync_with_exit_info_records_the_code() -> None:
    s = running("interactive", size=1)
    (main,) = s.kernels
    s.containers_gone("a0", [main], exited=[main], exits={main: End(2)})
    assert (s.kernels[main].status_info, s.kernels[main].exit_code) == ("exited: code 2", 2)


def test_cluster_env_and_hostnames() -> None:
    s = running(size=3, command=["true"], env={"A": "1"})
    ids = list(s.kernels)
    assert [s.hostname(k) for k in ids] == ["main1", "sub1", "sub2"]
    env = s.cluster_env(ids[2])
    assert env["A"] == "1"
    assert env["HOIST_SESSION_ID"] == s.id
    assert (env["HOIST_CLUSTER_ROLE"], env["HOIST_CLUSTER_IDX"]) == ("sub", "2")
    assert env["HOIST_CLUSTER_SIZE"] == "3"
    assert env["HOIST_CLUSTER_HOSTS"] == "main1,sub1,sub2"
    hosts = s.extra_hosts(ids[0], {"a0": "10.0.0.1", "a1": "10.0.0.2", "a2": "10.0.0.3"})
    assert hosts == {"sub1": "10.0.0.2", "sub2": "10.0.0.3"}


def test_enqueue_refuses_what_cannot_run() -> None:
    base = {
        "owner": "o",
        "image": "i",
        "resources": {"cpu": 1, "mem": 64 * MiB},
        "resource_group": "default",
    }
    with pytest.raises(InvalidField, match="command"):
        Session.enqueue(**base, session_type="batch")  # type: ignore[arg-type]
    with pytest.raises(InvalidField, match=r"env.*HOIST_SESSION_ID"):
        Session.enqueue(**base, spec={"env": {"HOIST_SESSION_ID": "x"}})  # type: ignore[arg-type]
    with pytest.raises(InvalidField, match="mounts"):
        Session.enqueue(
            **base,  # type: ignore[arg-type]
            spec={"mounts": [{"volume": "a", "path": "/d"}, {"volume": "b", "path": "/d"}]},
        )
    with pytest.raises(InvalidField, match="ports"):
        Session.enqueue(**base, spec={"ports": [80, 80]})  # type: ignore[arg-type]
    for path in ("/proc", "/sys/fs", "/dev/shm"):
        with pytest.raises(InvalidField, match="mounts"):
            Session.enqueue(**base, spec={"mounts": [{"volume": "a", "path": path}]})  # type: ignore[arg-type]
    Session.enqueue(**base, spec={"mounts": [{"volume": "a", "path": "/devdata"}]})  # type: ignore[arg-type]
    with pytest.raises(InvalidField, match="cluster_mode"):
        Session.enqueue(**base, cluster_mode="everywhere")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"command": []}, "$.command"),
        ({"command": "echo hi"}, "$.command"),
        ({"env": {"1BAD": "x"}}, "$.env"),
        ({"workdir": "relative"}, "$.workdir"),
        ({"workdir": "/a/../etc"}, "$.workdir"),
        ({"ports": [0]}, "$.ports[0]"),
        ({"ports": [70000]}, "$.ports[0]"),
        ({"mounts": [{"volume": "a b", "path": "/d"}]}, "$.mounts[0].volume"),
        ({"mounts": [{"volume": "a", "path": "d"}]}, "$.mounts[0].path"),
        ({"session_type": "forever"}, "$.session_type"),
        ({"cluster_mode": "mesh"}, "$.cluster_mode"),
        ({"resources": {"cpu": 1, "mem": 1, "GPU!": 1}}, "$.resources"),
    ],
)
def test_create_request_names_the_bad_field(payload: dict[str, object], field: str) -> None:
    request = {"owner": "o", "image": "i", "resources": {"cpu": 1, "mem": 8 * MiB}, **payload}
    with pytest.raises(RequestError) as e:
        decode_request_create(request)
    assert field in e.value.message


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        (b'{"cpu": 1, "mem": 1, "gpu": -1}', "$.resources.gpu"),
        (b'{"cpu": 1, "mem": 1, "gpu": 2000000}', "$.resources.gpu"),
        (b'{"cpu": 1e400, "mem": 1}', "$.resources.cpu"),
        (b'{"cpu": 1, "mem": 9223372036854775808}', "$.resources.mem"),
        (b'{"cpu": 1, "mem": 1.5}', "$.resources.mem"),
        (b'{"cpu": 1}', "$.resources.mem"),
        (b'{"cpu": "x", "mem": 1}', "$.resources.cpu"),
    ],
)
def test_each_resource_is_named(resources: bytes, field: str) -> None:
    payload = b'{"owner": "o", "image": "i", "resources": ' + resources + b"}"
    request = decode_request(payload, CreateSession)
    with pytest.raises(InvalidField) as e:
        request.kernel_resources()
    assert field in str(e.value)


def decode_request_create(payload: dict[str, object]) -> CreateSession:
    return decode_request(msgspec.json.encode(payload), CreateSession)


def test_resources_take_slots_and_name_what_is_missing() -> None:
    r = resources_from({"cpu": 2, "mem": 64 * MiB, "gpu": 2, "tpu": 0})
    assert (r.cpu, r.mem, r.slots) == (2.0, 64 * MiB, {"gpu": 2.0})
    with pytest.raises(InvalidField, match=r"resources\.mem"):
        resources_from({"cpu": 1})
    with pytest.raises(InvalidField, match=r"resources\.mem.*int"):
        resources_from({"cpu": 1, "mem": 1.5})
    with pytest.raises(InvalidField, match=r"resources\.cpu"):
        resources_from({"cpu": 0, "mem": 1})


def test_v1_session_upcasts_to_sleeping_kernels() -> None:
    s = running(size=1)
    enqueued = next(e for e in s.collect_events() if isinstance(e, ev.SessionEnqueued))
    data, headers = encode(enqueued)
    payload = msgspec.json.decode(data)
    for key in ("spec", "session_type", "cluster_mode"):
        payload.pop(key, None)
    old = decode(msgspec.json.encode(payload), {**headers, "Hoist-Schema": "1"})
    assert isinstance(old, ev.SessionEnqueued)
    assert old.spec.command == ["sleep", "infinity"]
    assert (old.session_type, old.cluster_mode) == ("interactive", "multi-node")
    # An event without slots keeps its shape: the field is omitted when empty.
    assert b"slots" not in encode(enqueued)[0]


def test_a_batch_session_ends_with_its_main_kernel_whatever_ended_it() -> None:
    s = running("batch", size=2)
    main, sub = s.kernels
    s.containers_gone("a0", [main], exited=[])  # gone without an exit code
    assert s.kernels[main].status_info.startswith("container-gone")
    assert s.kernels[sub].status is S.RUNNING  # the reactors' step decides the rest
    s.end_batch()
    assert s.kernels[sub].status is S.TERMINATING
    assert s.kernels[sub].status_info.startswith("session-ended: container-gone")
    interactive = running("interactive", size=2)
    first = next(iter(interactive.kernels))
    interactive.containers_gone("a0", [first], exited=[])
    interactive.end_batch()  # not a batch session: nothing
    assert [k.status for k in interactive.kernels.values()] == [S.TERMINATED, S.RUNNING]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"command": ["echo", "a\x00b"]}, "$.command[1]"),
        ({"env": {"A": "x\x00"}}, "$.env"),
        ({"mounts": [{"volume": "a", "path": "/"}]}, "$.mounts[0].path"),
        ({"mounts": [{"volume": "a", "path": "/data/"}]}, "$.mounts[0].path"),
        ({"mounts": [{"volume": "a", "path": "/a//b"}]}, "$.mounts[0].path"),
    ],
)
def test_what_no_container_can_take_is_refused_at_the_door(
    payload: dict[str, object], field: str
) -> None:
    request = {"owner": "o", "image": "i", "resources": {"cpu": 1, "mem": 8 * MiB}, **payload}
    with pytest.raises(RequestError) as e:
        decode_request_create(request)
    assert field in e.value.message


def test_gpus_are_whole() -> None:
    assert resources_from({"cpu": 1, "mem": 8 * MiB, "gpu": 2}).slots == {"gpu": 2.0}
    with pytest.raises(InvalidField, match=r"resources\.gpu.*whole"):
        resources_from({"cpu": 1, "mem": 8 * MiB, "gpu": 0.5})
    assert resources_from({"cpu": 1, "mem": 8 * MiB, "tpu": 0.5}).slots == {"tpu": 0.5}


@pytest.mark.parametrize(
    ("asked", "message"),
    [
        ({"cpu": 1, "mem": 3 * MiB}, "$.resources.mem: must be at least 6 MiB (6291456 bytes)"),
        ({"cpu": 0.005, "mem": 64 * MiB}, "$.resources.cpu: must be at least 0.01 cores"),
    ],
)
def test_less_than_a_runtime_enforces_is_refused_at_the_door(
    asked: dict[str, float], message: str
) -> None:
    # The agent's runtimes refuse these at create (after the pull): the door refuses them first,
    # by the same rule (domain.limits.kernel_floor).
    with pytest.raises(InvalidField) as e:
        resources_from(asked)
    assert str(e.value).startswith(message), e.value
    with pytest.raises(ValueError, match=re.escape(message.removeprefix("$.resources."))):
        validate_create("k", "s", asked["cpu"], int(asked["mem"]))
    assert resources_from({"cpu": 0.01, "mem": 6 * MiB}).mem == 6 * MiB
