"""Who sent the request being served: the ``Hoist-Actor`` of what it records.

The command server sets it for each request (one task each, so each has its own context):
the Hoist user whose own subject carried it (``hoist.api.<user>.>``, ``hoist.admin.<user>.>``),
else the role the unscoped subject belongs to (``client`` for ``hoist.api.>``, ``admin`` for
``hoist.admin.>``).  Only the subject says who: never the payload.
"""

from __future__ import annotations

from contextvars import ContextVar

_requester: ContextVar[str | None] = ContextVar("requester", default=None)


def set_requester(name: str) -> None:
    _requester.set(name)


def requester(default: str) -> str:
    """The requester, or ``default`` (the role of the handler) outside a request."""
    return _requester.get() or default
