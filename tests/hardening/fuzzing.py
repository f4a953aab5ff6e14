"""The fuzz driver shared by tests/hardening/test_fuzz.py and bench/fuzz.py: a real `hoist up`
stack (nats-server with the roles, the manager, dummy agents), hypothesis-generated bad and odd
payloads for every documented request subject, and what each reply must be."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from domain import limits, subjects
from services.stack.natsserver import free_port
from services.stack.up import Stack
from transport.client import Client

A, Q, ADMIN = subjects.API, subjects.QUERY, subjects.ADMIN
# Every documented request subject with a valid request that appends nothing (its ids name
# nothing that exists, or it only reads): one bad field makes it invalid.
TEMPLATES: dict[str, dict[str, Any]] = {
    f"{A}.session.create": {
        "owner": "fuzz",
        "image": "base:1",
        "resources": {"cpu": 1, "mem": 8388608},
        "cluster_size": 1,
        "resource_group": "default",
        "max_wait": 0,
        "request_id": "fuzz-1",
    },
    f"{A}.session.get": {"session_id": "nope"},
    f"{A}.session.destroy": {"session_id": "nope", "forced": False},
    f"{ADMIN}.kernel.cancel": {"kernel_id": "nope", "reason": "fuzz"},
    f"{ADMIN}.image.preload": {
        "images": ["base:1"],
        "agents": ["nope"],
        "parallelism": 4,
        "timeout": 600,
        "backoff_limit": 3,
        "backoff": 2,
        "wait": 0,
    },
    f"{ADMIN}.image.job": {"job_id": "nope"},
    f"{ADMIN}.image.jobs": {},
    f"{ADMIN}.image.unload": {"images": ["base:1"], "agents": ["nope"]},
    f"{ADMIN}.image.policy.set": {
        "name": "fuzz",
        "rules": [{"kind": "images", "images": ["base:1"]}],
        "resource_groups": ["default"],
        "priority": 0,
        "dry_run": True,
    },
    f"{ADMIN}.image.policy.remove": {"name": "nope", "dry_run": True},
    f"{ADMIN}.image.policy.list": {},
    f"{ADMIN}.image.policy.plan": {},
    f"{ADMIN}.agent.sync": {"agent_ids": ["nope"]},
    f"{ADMIN}.query.sql": {"sql": "SELECT 1", "limit": 10, "time_limit": 5, "min_seq": 0},
    f"{ADMIN}.verify": {},
    **{
        f"{Q}.{name}": {**filters, "limit": 10, "min_seq": 0, "timeout": 1}
        for name, filters in {
            "kernels": {"owner": "fuzz", "status": ["RUNNING"]},
            "sessions": {"owner": ["fuzz", "x"], "status": "PENDING"},
            "occupancy": {"by": "owner", "owner": "fuzz"},
            "agents": {"agent_id": "nope", "alive": True},
            "images": {"image": "base:1", "pinned": False},
            "pulls": {"agent_id": "nope", "outcome": "pulled"},
            "policies": {"name": "nope", "removed": False},
        }.items()
    },
}
ROLE_SUBJECTS = {  # what each role may send (nats.conf); the rest the server refuses
    "client": [s for s in TEMPLATES if not s.startswith(ADMIN)],
    "admin": list(TEMPLATES),
    "agent": [],
}

# Raw JSON tokens no JSON encoder writes: sent in place of a quoted marker.
_RAW = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" * 5000, "00", "1.", "tru"]
_DEEP = re.compile(r'"\\u0000DEEP(\d+)\\u0000"')
HUGE = "x" * 250_000  # with its template the request stays under MAX_REQUEST
BIG = limits.MAX_REQUEST + 1000


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every field path of a template (nested objects and list items included)."""
    out = []
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        out.append((*prefix, key))
        if isinstance(child, dict | list) and child:
            out.extend(_paths(child, (*prefix, key)))
    return out


def _wrong_types(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return ["true", 1, [True], {"v": True}]
    if isinstance(value, int | float):
        return ["5", [value], {"v": value}, True, ""]
    if isinstance(value, str):
        return [5, [5], {"v": value}, True, 1.5]
    if isinstance(value, list):
        return [5, {"a": value}, [[value]], True]
    return [[], "x", 5, True]


def _bad_values(value: Any) -> st.SearchStrategy[Any]:
    """Values that make any field invalid: wrong types, too long, too deep, out of range."""
    return st.one_of(
        st.sampled_from(_wrong_types(value)),
        st.just(HUGE),
        st.integers(17, 100_000).map(lambda n: f"\x00DEEP{n}\x00"),
        st.sampled_from([2**63, 2**64, -(2**63), 10**30, -(2**40), -1e300, 1e300]),
        st.sampled_from([f"\x00RAW{i}\x00" for i in range(len(_RAW))]),
    )


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def _encode(doc: Any) -> bytes:
    """JSON, with the markers replaced by raw tokens and nesting no encoder would write."""
    data = json.dumps(doc)
    for i, raw in enumerate(_RAW):
        data = data.replace(json.dumps(f"\x00RAW{i}\x00"), raw)
    return _DEEP.sub(lambda m: "[" * int(m[1]) + "]" * int(m[1]), data).encode()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def bad_requests(draw: st.DrawFn) -> tuple[str, str, bytes, str]:
    """(role, subject, payload, kind): an invalid request for ``subject``, by construction,
    from a role NATS lets send it."""
    subject = draw(st.sampled_from(list(TEMPLATES)))
    role = draw(st.sampled_from([r for r, allowed in ROLE_SUBJECTS.items() if subject in allowed]))
    return (role, *draw(_bad_payloads(subject)))


@st.composite
def _bad_payloads(draw: st.DrawFn, subject: str) -> tuple[str, bytes, str]:
    template = TEMPLATES[subject]
    paths = _paths(template)
    kinds = ["json", "bytes", "deep", "big", "unknown"] + (["field"] * 6 if paths else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "field":
        path = draw(st.sampled_from(paths))
        value = template
        for key in path:
            value = value[key]
        return subject, _encode(_set(template, path, draw(_bad_values(value)))), kind
    if kind == "unknown":
        key = "zz-" + draw(st.text(max_size=30) | st.just(HUGE))
        return subject, _encode({**template, key: draw(json_values)}), kind
    if kind == "json":  # any JSON but an object: no request is a list, a number or null
        doc = draw(json_values.filter(lambda v: not isinstance(v, dict)))
        return subject, json.dumps(doc).encode(), kind
    if kind == "bytes":  # not JSON at all
        return subject, b"\xff" + draw(st.binary(max_size=64)), kind
    if kind == "deep":
        n = draw(st.integers(17, 100_000))
        opener = draw(st.sampled_from(['{"a":', "["]))
        closer = "}" if opener.startswith("{") else "]"
        return subject, (opener * n + "1" + closer * n).encode(), kind
    return subject, b'{"a": "' + b"y" * BIG + b'"}', kind  # over MAX_REQUEST


@dataclass
class Stats:
    replies: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    worst_s: float = 0.0
    worst: str = ""
    elapsed_s: float = 0.0


class FuzzStack:
    """A `hoist up` stack and one connection per role, driven from synchronous code (hypothesis
    runs examples synchronously) through a private event loop."""

    def __init__(self, data_dir: Path, agents: int = 2) -> None:
        self.loop = asyncio.new_event_loop()
        self.stack = Stack(data_dir, nats_port=free_port(), agents=agents, runtime="dummy")
        self.conns: dict[str, Client] = {}
        self.violations: dict[str, list[str]] = {}
        self.stats = Stats()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def __enter__(self) -> FuzzStack:
        self.run(self.stack.start())
        roles = (("client", None), ("admin", None), ("agent", "agent-1"), ("manager", None))
        for role, agent_id in roles:
            self.conns[role] = self.run(self._connect(role, agent_id))
        return self

    def __exit__(self, *exc: object) -> None:
        for nc in self.conns.values():
            self.run(nc.close())
        self.stack.stop()
        self.loop.close()

    async def _connect(self, role: str, agent_id: str | None) -> Client:
        errors = self.violations.setdefault(role, [])

        async def on_error(err: Exception) -> None:
            errors.append(str(err).lower())

        nc = Client()
        await nc.connect(
            self.stack.role_url(role, agent_id),
            error_cb=on_error,
            allow_reconnect=False,
            pending_size=64 * 1024 * 1024,
        )
        return nc

    def last_seq(self) -> int:
        js = self.conns["manager"].jetstream()  # the readers' account has no stream info
        info = self.run(js.stream_info(subjects.EVENT_STREAM))
        return int(info.state.last_seq)

    def events(self) -> int:
        """How many events the log holds, the managers' lease aside: the leader renews it (and
        each renewal expires) whatever requests come, so it is no command's doing."""
        return sum(self.held().values())

    def held(self) -> dict[str, int]:
        """How many events the log holds on each subject, the managers' lease aside."""
        js = self.conns["manager"].jetstream()
        info = self.run(js.stream_info(subjects.EVENT_STREAM, subjects_filter=subjects.EVENTS_ALL))
        lease = f"{subjects.EVENTS}.{subjects.LEASE}."
        held = info.state.subjects or {}
        return {subject: n for subject, n in held.items() if not subject.startswith(lease)}

    def ask(self, role: str, subject: str, payload: bytes, timeout: float = 30) -> dict[str, Any]:
        """One request; the reply (asserting it is one JSON reply, never ``internal``)."""
        start = time.perf_counter()
        msg = self.run(self.conns[role].request(subject, payload, timeout=timeout))
        took = time.perf_counter() - start
        reply = json.loads(msg.data)
        assert isinstance(reply, dict), reply
        code = reply["error"]["code"] if "error" in reply else "ok"
        self.stats.replies += 1
        self.stats.elapsed_s += took
        self.stats.codes[code] += 1
        if took > self.stats.worst_s:
            self.stats.worst_s, self.stats.worst = took, f"{subject} {payload[:60]!r}"
        assert code != "internal", (subject, payload[:200], reply)
        assert len(msg.data) <= limits.MAX_REPLY
        return reply

    async def refused(self, role: str, subject: str) -> str:
        """Send as a role NATS does not let publish there: the server reports the violation
        and no reply comes.  Which of NATS' answers the request got: "timeout" or
        "no-responders"."""
        try:
            await self.conns[role].request(subject, b"{}", timeout=0.5)
        except NoRespondersError:
            outcome = "no-responders"
        except NatsTimeout:
            outcome = "timeout"
        else:
            raise AssertionError(f"{role} got a reply on {subject}")
        expected = f'publish to "{subject}"'
        assert any(expected in v for v in self.violations[role]), (role, subject)
        return outcome


def check_bad(fuzz: FuzzStack, check_stream: bool) -> Callable[[tuple[str, bytes, str]], None]:
    """The property: an invalid request gets one error reply, never ``internal``, and (when
    ``check_stream``) the event stream does not move."""

    def check(request: tuple[str, str, bytes, str]) -> None:
        role, subject, payload, kind = request
        before = fuzz.events() if check_stream else 0
        reply = fuzz.ask(role, subject, payload)
        assert "error" in reply, (subject, kind, payload[:200], reply)
        if check_stream:
            assert fuzz.events() == before, (subject, kind, payload[:200])

    return check
