"""The wire format of events: JSON bytes plus headers naming type, schema and version.

The event store keeps bytes and headers and never needs the event classes; this module is the
only place that turns them back into events, validating every field and upcasting old schema
versions one step at a time (``upcast_vN_vM`` on the event class).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from domain.errors import EventDecodeError
from domain.events import EVENT_TYPES, Event, type_name

TYPE_HEADER = "Hoist-Event"
SCHEMA_HEADER = "Hoist-Schema"
VERSION_HEADER = "Hoist-Version"
# Who caused an event, for the audit trail: "manager", "agent:<id>", "client", "admin".
ACTOR_HEADER = "Hoist-Actor"
# Set by the event store on a record whose stored headers already held a direct get's own
# (Nats-Sequence ...): no writer appended it; nats-server stored its answer to someone's
# JetStream request, sent to a reply subject the stream captures (domain.admission refuses it).
REFLECTED_HEADER = "Hoist-Reflected"

_encoder = msgspec.json.Encoder()
# One typed decoder per event type: the header picks it, so decoding never tries the union.
_decoders = {name: msgspec.json.Decoder(cls) for name, cls in EVENT_TYPES.items()}


def encode(event: Event) -> tuple[bytes, dict[str, str]]:
    cls = type(event)
    return _encoder.encode(event), {
        TYPE_HEADER: type_name(cls),
        SCHEMA_HEADER: str(cls.schema_version),
        VERSION_HEADER: str(event.originator_version),
    }


def decode(data: bytes, headers: Mapping[str, str]) -> Event:
    """Validate and load one stored event; raise EventDecodeError naming what is wrong."""
    name = headers.get(TYPE_HEADER, "")
    cls = EVENT_TYPES.get(name)
    if cls is None:
        raise EventDecodeError(
            name,
            # Short: a flood of such records is logged once each (the known types are in
            # domain.events, not in every log line).
            f"unknown event type in header {TYPE_HEADER}; a newer Hoist may have written it:"
            " upgrade this process",
        )
    schema = _schema(name, cls, headers.get(SCHEMA_HEADER, ""))
    try:
        if schema == cls.schema_version:
            event = _decoders[name].decode(data)
        else:
            event = msgspec.convert(_upcast(name, cls, schema, data), type=cls)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise EventDecodeError(name, f"schema {schema}: {e}") from None
    version = headers.get(VERSION_HEADER)
    if version is not None and version != str(event.originator_version):
        raise EventDecodeError(
            name,
            f"header {VERSION_HEADER}={version} disagrees with originator_version"
            f" {event.originator_version} in the payload",
        )
    return event


def _schema(name: str, cls: type[Event], value: str) -> int:
    try:
        schema = int(value)
    except ValueError:
        schema = 0
    if not 1 <= schema <= cls.schema_version:
        raise EventDecodeError(
            name,
            f"header {SCHEMA_HEADER}={value!r} is not a schema between 1 and"
            f" {cls.schema_version}; a newer Hoist may have written it: upgrade this process",
        )
    return schema


def _upcast(name: str, cls: type[Event], schema: int, data: bytes) -> dict[str, Any]:
    state = msgspec.json.decode(data)
    if not isinstance(state, dict):
        raise msgspec.ValidationError(f"Expected `object`, got `{type(state).__name__}`")
    for version in range(schema, cls.schema_version):
        upcast = getattr(cls, f"upcast_v{version}_v{version + 1}")
        try:
            state = upcast(state)
        except (KeyError, TypeError, ValueError) as e:
            raise EventDecodeError(
                name, f"schema {version} payload cannot be upcast: {e}"
            ) from None
    return state
