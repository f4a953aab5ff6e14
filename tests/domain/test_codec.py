"""The wire format: every event type round-trips; bad input is refused naming the field."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain import events as ev
from domain import rpc
from domain.codec import SCHEMA_HEADER, TYPE_HEADER, VERSION_HEADER, decode, encode
from domain.errors import EventDecodeError
from tests.domain.histories import (
    V1_PULLED,
    full_agent_history,
    full_dotfiles_history,
    full_liveness_history,
    full_policy_history,
    full_reservation_history,
    full_resource_group_history,
    full_resource_policy_history,
    full_session_history,
    full_user_history,
    lease_messages,
)

SAMPLES = (
    full_session_history()
    + full_agent_history()
    + full_liveness_history()
    + full_policy_history()
    + full_resource_policy_history()
    + full_resource_group_history()
    + full_user_history()
    + full_dotfiles_history()
    + full_reservation_history()
    + lease_messages()
)
ONE_OF_EACH = {ev.type_name(type(e)): e for e in SAMPLES}


def test_samples_cover_every_event_type() -> None:
    assert set(ONE_OF_EACH) == set(ev.EVENT_TYPES)
    assert all(name == cls.__name__ for name, cls in ev.EVENT_TYPES.items())


@pytest.mark.parametrize("name", sorted(ev.EVENT_TYPES))
def test_round_trip(name: str) -> None:
    event = ONE_OF_EACH[name]
    data, headers = encode(event)
    assert headers == {
        TYPE_HEADER: name,
        SCHEMA_HEADER: str(type(event).schema_version),
        VERSION_HEADER: str(event.originator_version),
    }
    assert json.loads(data)["type"] == name
    back = decode(data, headers)
    assert type(back) is type(event)
    assert back == event


def test_unknown_type_and_bad_headers() -> None:
    data, headers = encode(SAMPLES[0])
    with pytest.raises(EventDecodeError, match="unknown event type"):
        decode(data, {**headers, TYPE_HEADER: "SessionExploded"})
    with pytest.raises(EventDecodeError, match="unknown event type"):
        decode(data, {})
    for schema in ("0", str(type(SAMPLES[0]).schema_version + 1), "x", ""):
        with pytest.raises(EventDecodeError, match=SCHEMA_HEADER):
            decode(data, {**headers, SCHEMA_HEADER: schema})
    with pytest.raises(EventDecodeError, match="disagrees with originator_version"):
        decode(data, {**headers, VERSION_HEADER: "7"})
    with pytest.raises(EventDecodeError, match=r"SessionEnqueued.*JSON"):
        decode(b"{not json", headers)


def test_cross_field_rule_is_checked_on_decode() -> None:
    data, headers = encode(SAMPLES[0])
    payload = json.loads(data)
    payload["cluster_size"] = 3
    with pytest.raises(EventDecodeError, match="kernel_ids must be 3 distinct ids"):
        decode(json.dumps(payload).encode(), headers)


FIELDS = [(name, field) for name, e in ONE_OF_EACH.items() for field in e.__struct_fields__]


# Values no field accepts, except where noted.
BAD_VALUES: list[object] = [True, [True], {"k": True}, None, ""]
VALID_ODDITIES = [
    ("request_id", None),
    ("name", None),  # a session without a name (`hoist run --name`)
    ("detail", ""),
    ("pinned", True),
    ("oom_killed", True),
    ("exit_code", None),
    ("ran_s", None),
    *((f, None) for f in ("max_cpu", "max_mem", "max_sessions", "max_kernels_per_session")),
    ("max_lifetime_s", None),  # a resource policy's None: unlimited
    ("idle_timeout_s", None),
    ("public", True),  # a resource group open to everyone
    ("description", ""),
    ("admin", True),  # an admin user
    ("cancelled", True),  # a pull stopped because no kernel waited for it
    ("content", ""),  # an empty dotfile (e.g. .hushlogin)
]


@pytest.mark.parametrize(("name", "field"), FIELDS)
def test_bad_field_value_is_named(name: str, field: str) -> None:
    data, headers = encode(ONE_OF_EACH[name])
    for bad in BAD_VALUES:
        if any(field == f and bad == v for f, v in VALID_ODDITIES):
            continue
        payload = {**json.loads(data), field: bad}
        with pytest.raises(EventDecodeError) as info:
            decode(json.dumps(payload).encode(), headers)
        assert info.value.event_type == name
        assert f"$.{field}" in str(info.value), bad


@pytest.mark.parametrize(("name", "field"), FIELDS)
def test_missing_field_is_named(name: str, field: str) -> None:
    data, headers = encode(ONE_OF_EACH[name])
    payload = json.loads(data)
    payload.pop(field, None)  # absent already when a default is omitted (omit_defaults)
    info = msgspec.inspect.type_info(ev.EVENT_TYPES[name])
    assert isinstance(info, msgspec.inspect.StructType)
    if field in {f.name for f in info.fields if not f.required}:
        assert isinstance(decode(json.dumps(payload).encode(), headers), ev.EVENT_TYPES[name])
        return
    with pytest.raises(EventDecodeError, match=f"missing required field `{field}`"):
        decode(json.dumps(payload).encode(), headers)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_give_only_decode_errors(data: bytes) -> None:
    for name in ("SessionScheduled", "ImagePulled"):
        for schema in ("1", str(ev.EVENT_TYPES[name].schema_version)):
            with pytest.raises(EventDecodeError):
                decode(data, {TYPE_HEADER: name, SCHEMA_HEADER: schema})


# --- upcasting ---------------------------------------------------------------------------

V1_IMAGE_PULLED, V1_HEADERS = V1_PULLED


def test_v1_image_pulled_is_upcast() -> None:
    assert ev.ImagePulled.schema_version == 2
    event = decode(V1_IMAGE_PULLED, V1_HEADERS)
    assert isinstance(event, ev.ImagePulled)
    assert event.duration_s == 3.25
    assert event.size_bytes == 2_000_000
    assert event.timestamp.tzinfo is not None
    # Re-encoded, it is a v2 event.
    data, headers = encode(event)
    assert headers[SCHEMA_HEADER] == "2"
    assert json.loads(data)["duration_s"] == 3.25
    assert "duration_ms" not in json.loads(data)


def test_v1_payload_problems_are_named() -> None:
    payload = json.loads(V1_IMAGE_PULLED)
    del payload["duration_ms"]
    with pytest.raises(EventDecodeError, match="duration_ms"):
        decode(json.dumps(payload).encode(), V1_HEADERS)
    payload = json.loads(V1_IMAGE_PULLED)
    payload["digest"] = 5
    with pytest.raises(EventDecodeError, match=r"schema 1: .*\$\.digest"):
        decode(json.dumps(payload).encode(), V1_HEADERS)
    with pytest.raises(EventDecodeError, match="Expected `object`"):
        decode(b"[1, 2]", V1_HEADERS)
    with pytest.raises(EventDecodeError, match="schema 1"):
        decode(b"{nope", V1_HEADERS)


def test_a_command_that_ended_within_the_clocks_resolution_ran_zero_seconds() -> None:
    # A limit's ``Seconds`` (> 0) once shadowed the duration's (>= 0): a container that ended
    # as it started was quarantined, and its session never ended.
    for name in ("KernelExited", "KernelTerminated"):
        event = msgspec.structs.replace(ONE_OF_EACH[name], ran_s=0.0)
        assert decode(*encode(event)).ran_s == 0.0, name
    exit_ = {"kernel_id": "k", "session_id": "s", "exit_code": 0, "ran_s": 0.0}
    assert msgspec.convert(exit_, rpc.KernelExit).ran_s == 0.0
    policy = msgspec.structs.replace(ONE_OF_EACH["ResourcePolicySet"], max_lifetime_s=0.0)
    with pytest.raises(EventDecodeError, match="max_lifetime_s"):
        decode(*encode(policy))  # a limit of 0 s is no limit: refused


def test_a_session_enqueued_before_names_and_labels_decodes_without_them() -> None:
    data, headers = encode(SAMPLES[0])
    payload = json.loads(data)
    payload.pop("name", None)
    payload.pop("labels", None)
    back = decode(json.dumps(payload).encode(), headers)
    assert isinstance(back, ev.SessionEnqueued)
    assert back.name is None and back.labels == {}
    named = msgspec.structs.replace(back, name="web", labels={"team": "ml"})
    again = decode(*encode(named))
    assert isinstance(again, ev.SessionEnqueued)
    assert (again.name, again.labels) == ("web", {"team": "ml"})
    payload["labels"] = {"a b": "c"}  # what the door refuses, a forged event is refused too
    with pytest.raises(EventDecodeError, match="labels"):
        decode(json.dumps(payload).encode(), headers)
