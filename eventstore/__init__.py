"""The JetStream event store: the asyncio API for the services (``store``, ``repository``) and
the persistence module that runs plain ``eventsourcing`` applications on it
(``PERSISTENCE_MODULE=eventstore:Factory`` or ``eventstore.persistence``).

Importing this package loads neither: the persistence module (and the eventsourcing
infrastructure under it) is imported only when an application asks for ``Factory``.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Factory":
        from eventstore.persistence import Factory

        return Factory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
