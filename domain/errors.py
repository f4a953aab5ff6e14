"""Errors the pure domain raises: each names what was wrong and says what to do next."""

from __future__ import annotations

from typing import TypeVar

import msgspec

T = TypeVar("T")


class DomainError(Exception):
    """A command was refused; nothing was applied and no event was recorded."""


class IllegalTransition(DomainError):
    """A kernel was asked to move between two statuses the status machine does not connect."""

    def __init__(self, old: str, new: str, allowed: frozenset[str], kernel_id: str = "") -> None:
        self.old = old
        self.new = new
        self.kernel_id = kernel_id
        who = f"kernel {kernel_id}" if kernel_id else "a kernel"
        nexts = ", ".join(sorted(allowed)) if allowed else f"nothing ({old} is final)"
        super().__init__(
            f"{who} cannot go from {old} to {new}; from {old} it may only go to {nexts}."
            " Reload the session: someone else may have moved it first."
        )


class NotNow(DomainError):
    """A command the aggregate's state does not allow now (e.g. force-cancelling a running
    kernel); the message says what to do instead."""


class InvalidField(DomainError, ValueError):
    """A command argument is malformed; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class Forbidden(DomainError):
    """The asker may not do this (a user not enabled, no admin, another user's owner)."""


class Conflict(DomainError):
    """The command contradicts what the aggregate already is (removed, disabled), or another
    writer changed it meanwhile; ``field`` names what the asker sent."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class NotFound(DomainError):
    """``field`` names nothing the asker may see: another user's reads as none at all."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


def unknown_session(session_id: str) -> str:
    """The one wording for a session id that names none the asker may see (the manager's
    not-found after ``session_id: ``, the CLI's own checks): another user's session reads the
    same as one that never existed."""
    return f"unknown session {session_id}: list sessions with `hoist sessions`"


def unknown_kernel(kernel_id: str) -> str:
    """The one wording for a kernel id that names none the asker may see."""
    return f"unknown kernel {kernel_id}: list kernels with `hoist ps -a`"


class UnknownKernel(DomainError, KeyError):
    def __init__(self, session_id: str, kernel_id: str) -> None:
        self.session_id = session_id
        self.kernel_id = kernel_id
        super().__init__(
            f"session {session_id} has no kernel {kernel_id}; list its kernels to pick one"
        )

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class EventDecodeError(DomainError):
    """Stored bytes are not a valid event of the named type (or the type is unknown)."""

    def __init__(self, event_type: str, detail: str) -> None:
        self.event_type = event_type
        self.detail = detail
        super().__init__(f"cannot decode event {event_type!r}: {detail}")


def require_text(value: object, field: str) -> str:
    """``value`` if it is a non-blank string, else InvalidField naming ``field``."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidField(field, f"must be a non-empty string, got {value!r}")
    return value


def convert(value: object, type_: type[T], field: str, expected: str) -> T:
    """``value`` validated as ``type_`` (msgspec constraints included), else InvalidField
    naming ``field``, msgspec's complaint and the ``expected`` shape."""
    try:
        return msgspec.convert(value, type_, from_attributes=True)
    except msgspec.ValidationError as e:
        raise InvalidField(field, f"{e} (expected {expected})") from None
