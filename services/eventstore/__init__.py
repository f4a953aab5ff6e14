"""The event store's old home, kept as an alias so that applications configured with
``PERSISTENCE_MODULE=services.eventstore:Factory`` keep working: the store is ``eventstore``
now (``PERSISTENCE_MODULE=eventstore:Factory``)."""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Factory":
        from eventstore.persistence import Factory

        return Factory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
