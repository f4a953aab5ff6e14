"""Read-model queries over NATS (served by services.manager.queries beside the projection runner).

Requests and replies are JSON.  Every reply says which stream sequence the model reflects:
``{"seq": N, "rows": [...]}``; a bad request gets ``{"error": {"code": "invalid-request",
"message": ...}}`` naming the field.  ``min_seq`` makes the query wait (at most ``timeout``
seconds, default 5) until the model reflects that sequence: read-your-writes after a command
that returned its event sequences.

- ``hoist.query.kernels``   filters kernel_id, session_id, owner, agent_id, image,
  resource_group, status; kernel_id_prefix, session_id_prefix
- ``hoist.query.sessions``  filters session_id, owner, image, resource_group, status;
  session_id_prefix
- ``hoist.query.occupancy`` ``by``: "owner" (default; charged statuses exclude PULLING) or
  "agent"; filters owner / agent_id
- ``hoist.query.agents``    filters agent_id, resource_group, alive
- ``hoist.query.images``    filters agent_id, image, preloaded, pinned
- ``hoist.query.pulls``     filters agent_id, task_id, image, outcome
- ``hoist.query.policies``  filters name, removed (prepull policies; ``resource_groups`` and
  ``rules`` come as JSON lists)
- ``hoist.query.quarantine`` filters subject, event_type, actor, writer: events every reader
  skips (seq, subject, event_type, reason, actor as claimed, writer as the grants allow,
  stored_at)
  Text filters take a string or a list of strings (any of them); a ``*_prefix`` filter one
  string, the start of the id (what the CLI resolves a short id with); ``alive``/``preloaded``/
  ``pinned``/``removed`` a boolean.  Also ``limit`` (1-10000, default 1000; the reply has
  ``"truncated": true`` when more rows matched).
- ``hoist.admin.query.sql`` ``{"sql": "SELECT ..."}``: one read-only SELECT; reply
  ``{"seq", "columns": [...], "rows": [[...], ...], "truncated"}``.  Anything else (INSERT,
  UPDATE, DROP, ATTACH, COPY, SET, file access, ...) is refused with code ``read-only``;
  ``time_limit`` (seconds, default 10, at most 30) interrupts it with code ``timeout``
  (services.manager.admin_sql).
- ``hoist.admin.verify`` ``{}``: rebuild every model in memory up to the live sequence and
  compare; reply ``{"seq", "ok", "quarantined", "differences": [...]}``.

The query names and subjects are in domain.subjects (``QUERY_NAMES``, ``query_subject``,
``SQL_SUBJECT``, ``VERIFY_SUBJECT``).
"""

from __future__ import annotations

from domain.subjects import QUERY_NAMES

__all__ = [
    "BOOL",
    "COMMON",
    "DEFAULT_LIMIT",
    "DEFAULT_WAIT_S",
    "FILTERS",
    "MAX_LIMIT",
    "MAX_WAIT_S",
    "OCCUPANCY_BY",
    "OUTCOME",
    "PREFIX",
    "PULL_OUTCOMES",
    "QUERY_NAMES",
    "SQL_DEFAULT_TIME_LIMIT_S",
    "SQL_FIELDS",
    "SQL_MAX_TIME_LIMIT_S",
    "STATUS",
    "TEXT",
]

MAX_LIMIT = 10_000
DEFAULT_LIMIT = 1000
MAX_WAIT_S = 30.0
DEFAULT_WAIT_S = 5.0
PULL_OUTCOMES = ("pulling", "pulled", "failed", "abandoned")  # the ``outcome`` filter's values
COMMON = ("min_seq", "timeout", "limit")  # fields every query takes besides its filters
# hoist.admin.query.sql: its fields and the bounds of its time_limit (seconds; the largest
# stays under the CLI's wait for the reply).
SQL_FIELDS = ("sql", "limit", "time_limit", "min_seq", "timeout")
SQL_DEFAULT_TIME_LIMIT_S = 10.0
SQL_MAX_TIME_LIMIT_S = 30.0

# What a filter takes: a string or a list of strings (any of them), a kernel status, a pull
# outcome (PULL_OUTCOMES), a boolean, the start of an id (field ``<column>_prefix``), or labels
# (``key=value`` or ``key`` alone, a string or a list: every one must match).
TEXT, STATUS, OUTCOME, BOOL, PREFIX = "text", "status", "outcome", "bool", "prefix"
LABELS = "labels"

# Each query's filters: field -> what it takes.
FILTERS: dict[str, dict[str, str]] = {
    "kernels": {
        "kernel_id": TEXT,
        "session_id": TEXT,
        "owner": TEXT,
        "agent_id": TEXT,
        "image": TEXT,
        "resource_group": TEXT,
        "status": STATUS,
        "kernel_id_prefix": PREFIX,
        "session_id_prefix": PREFIX,
        "session_name": TEXT,
        "labels": LABELS,
    },
    "sessions": {
        "session_id": TEXT,
        "owner": TEXT,
        "image": TEXT,
        "resource_group": TEXT,
        "status": STATUS,
        "session_id_prefix": PREFIX,
        "name": TEXT,
        "labels": LABELS,
    },
    "occupancy": {"owner": TEXT, "agent_id": TEXT},
    "agents": {"agent_id": TEXT, "resource_group": TEXT, "alive": BOOL},
    "images": {"agent_id": TEXT, "image": TEXT, "preloaded": BOOL, "pinned": BOOL},
    "pulls": {"agent_id": TEXT, "task_id": TEXT, "image": TEXT, "outcome": OUTCOME},
    "policies": {"name": TEXT, "removed": BOOL},
    "quarantine": {"subject": TEXT, "event_type": TEXT, "actor": TEXT, "writer": TEXT},
}
OCCUPANCY_BY = ("owner", "agent")  # occupancy's ``by``, the first the default
