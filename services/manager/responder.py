"""The manager's responder (transport.responder) for its request servers: commands, read-model
queries and history.  Its error table is the transport's with the event store's row in front:
the store not taking a write, or not answering, is ``unavailable`` (retry).  Handlers raise
domain errors (a session the view does not hold is a NotFound, services.manager.uow)."""

from __future__ import annotations

import logging

from domain.rpc import RequestError
from eventstore.store import ConcurrencyError, StoreError
from transport.responder import ERRORS, ErrorRow, Responder


def _unavailable(e: Exception) -> RequestError:
    return RequestError("unavailable", f"{str(e) or type(e).__name__}; retry the request")


MANAGER_ERRORS: tuple[ErrorRow, ...] = (
    ((StoreError, ConcurrencyError, TimeoutError), _unavailable),
    *ERRORS,
)


def manager_responder(log: logging.Logger, kind: str) -> Responder:
    """The manager's responder, logging unexpected failures to ``log`` as ``kind`` requests."""
    return Responder("manager", log, kind, MANAGER_ERRORS)
