"""The JetStream event store: the asyncio API for the services (``store``, ``repository``) and
the persistence module that runs plain ``eventsourcing`` applications on it
(``PERSISTENCE_MODULE=services.eventstore:Factory``)."""

from services.eventstore.persistence import Factory
from services.eventstore.repository import Repository
from services.eventstore.store import ConcurrencyError, EventStore, Message, Recorded, Write

__all__ = [
    "ConcurrencyError",
    "EventStore",
    "Factory",
    "Message",
    "Recorded",
    "Repository",
    "Write",
]
