"""The manager's responder (transport.responder) for its request servers: commands, read-model
queries and history.  Its error table is the transport's with the rows of the layers above it
in front: the event store not taking a write, or not answering, is ``unavailable`` (retry); a
session the view does not hold is ``not-found``."""

from __future__ import annotations

import logging

from domain.errors import unknown_session
from domain.rpc import RequestError
from eventstore.store import ConcurrencyError, StoreError
from services.manager.uow import SessionUnknown
from transport.responder import ERRORS, ErrorRow, Responder


def _unavailable(e: Exception) -> RequestError:
    return RequestError("unavailable", f"{str(e) or type(e).__name__}; retry the request")


MANAGER_ERRORS: tuple[ErrorRow, ...] = (
    ((StoreError, ConcurrencyError, TimeoutError), _unavailable),
    (
        (SessionUnknown,),
        lambda e: RequestError("not-found", f"session_id: {unknown_session(e.args[0])}"),
    ),
    *ERRORS,
)


def manager_responder(log: logging.Logger, kind: str) -> Responder:
    """The manager's responder, logging unexpected failures to ``log`` as ``kind`` requests."""
    return Responder("manager", log, kind, MANAGER_ERRORS)
