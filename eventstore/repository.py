"""Load and save domain aggregates through the event store: one subject per aggregate.

``get`` rebuilds an aggregate from its subject's history and remembers, on that instance, the
stream sequence it was loaded up to; ``save`` appends the pending events of one command (of one
or several aggregates) in one atomic append expecting those sequences.  On ConcurrencyError the
caller loads again and decides again: the events of the refused save are dropped with it.

A record ``get`` cannot admit or apply (domain.admission) is logged once and skipped, and the
aggregate is rebuilt from the rest: one poison event never makes an aggregate unloadable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, overload

from eventsourcing.domain import BaseAggregate

from domain.admission import Inadmissible, admit, fold
from domain.codec import ACTOR_HEADER, encode
from domain.subjects import aggregate_subject
from eventstore.quarantine import quarantined
from eventstore.store import EventStore, Message, Write

A = TypeVar("A", bound=BaseAggregate[str])

# The stream sequence an instance was loaded or last saved up to.  Kept on the instance, not in
# the repository, so two handlers holding their own copies of one aggregate each save with what
# they read (a shared map would let the later one overwrite the earlier one's change unseen).
_SEQ_ATTR = "_stream_seq"


class NotFound(LookupError):
    """No events exist for the aggregate."""

    def __init__(self, kind: str, aggregate_id: str) -> None:
        self.kind = kind
        self.aggregate_id = aggregate_id
        super().__init__(f"no {kind} with id {aggregate_id!r}: check the id (list them first)")


def kind_of(aggregate_or_cls: BaseAggregate[str] | type[BaseAggregate[str]]) -> str:
    """The subject kind of an aggregate class: its ``KIND`` if set, else its lowercased name
    (Session -> "session", Agent -> "agent")."""
    cls = aggregate_or_cls if isinstance(aggregate_or_cls, type) else type(aggregate_or_cls)
    kind = getattr(cls, "KIND", None)
    return kind if isinstance(kind, str) else cls.__name__.lower()


def loaded_seq(aggregate: BaseAggregate[str]) -> int:
    """The stream sequence the aggregate was loaded or saved up to; 0 for a new one."""
    seq: int = getattr(aggregate, _SEQ_ATTR, 0)
    return seq


def apply(aggregate: Any, event: Any, seq: int) -> Any:
    """Fold one recorded event (stored at stream sequence ``seq``) into ``aggregate`` (None for
    the first) and remember the sequence, so a later save() expects it.  For callers that keep
    aggregates in memory and follow the log themselves."""
    aggregate = event.mutate(aggregate)
    setattr(aggregate, _SEQ_ATTR, seq)
    return aggregate


def passed(aggregate: BaseAggregate[str], seq: int) -> None:
    """The record at ``seq`` on the aggregate's subject was skipped (quarantined): a later
    save() must still expect the subject's real last sequence."""
    setattr(aggregate, _SEQ_ATTR, seq)


class Repository:
    """Domain aggregates in an EventStore."""

    def __init__(self, store: EventStore, actor: str | None = None) -> None:
        self.store = store
        self.actor = actor  # recorded with each event as Hoist-Actor (who caused it)

    @overload
    async def get(self, kind: type[A], aggregate_id: str) -> A: ...
    @overload
    async def get(self, kind: str, aggregate_id: str) -> BaseAggregate[str]: ...
    async def get(self, kind: type[A] | str, aggregate_id: str) -> Any:
        """The aggregate rebuilt from all its events; NotFound if it has none.

        ``kind`` is the aggregate class (the result is checked to be one) or its subject kind."""
        kind_name = kind if isinstance(kind, str) else kind_of(kind)
        records = await self.store.read_subject(aggregate_subject(kind_name, aggregate_id))
        aggregate: Any = None
        for record in records:
            try:
                event = admit(record.subject, record.headers, record.data)
                aggregate = fold(aggregate, event, record.subject)
            except Inadmissible as e:
                quarantined(record.seq, record.subject, record.headers, e.reason, "repository")
        if aggregate is None:
            raise NotFound(kind_name, aggregate_id)
        setattr(aggregate, _SEQ_ATTR, records[-1].seq)  # also past a skipped last record
        if not isinstance(kind, str) and not isinstance(aggregate, kind):
            raise TypeError(
                f"{kind_name} {aggregate_id!r} was rebuilt as a {type(aggregate).__name__},"
                f" not a {kind.__name__}: its events belong to another aggregate type"
            )
        return aggregate

    async def save(
        self,
        *aggregates: BaseAggregate[str],
        request_id: str | None = None,
        actor: str | None = None,
        also: Sequence[Write] = (),
    ) -> list[int]:
        """Append the pending events of all ``aggregates`` atomically; return their sequences.

        Each aggregate's subject must still be where it was loaded (0 = new aggregate), else
        ConcurrencyError and nothing is written.  ``request_id`` makes a retried command append
        nothing twice.  ``also``: more writes in the same append, after the aggregates' (a
        leader's fence)."""
        writes: list[Write] = []
        saved: list[BaseAggregate[str]] = []
        subjects: set[str] = set()
        for aggregate in aggregates:
            subject = aggregate_subject(kind_of(aggregate), aggregate.id)
            if subject in subjects:
                raise ValueError(
                    f"aggregate {subject} passed twice to save(): pass each aggregate once"
                )
            subjects.add(subject)
            events = aggregate.collect_events()
            if not events:
                continue
            messages = [_message(event, actor or self.actor) for event in events]
            writes.append(Write(subject, messages, expected_last_seq=loaded_seq(aggregate)))
            saved.append(aggregate)
        seqs = await self.store.append([*writes, *also], idempotency_key=request_id)
        end = 0
        for write, aggregate in zip(writes, saved, strict=True):
            end += len(write.messages)
            setattr(aggregate, _SEQ_ATTR, seqs[end - 1])
        return seqs


def _message(event: Any, actor: str | None) -> Message:
    data, headers = encode(event)
    if actor:
        headers[ACTOR_HEADER] = actor
    return Message(data, headers)
