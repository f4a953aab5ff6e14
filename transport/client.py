"""nats-py's client, made fast enough to replay millions of events.

Two changes, both through nats-py 2.16 internals (hence the upper bound on its version):

- Header parsing. Every message a replay reads carries about ten headers (the store's
  ``Nats-*`` and the event's ``Hoist-*``). nats-py checks each header name for whitespace one
  character at a time in a generator, about half the cost of reading an event. The names repeat
  (a few dozen distinct ones), so ``parse_header_lines`` validates each distinct name once and
  remembers it; the dict is the one nats-py builds (``tests/eventstore/test_client.py``).
- Raw subscriptions. ``subscribe_raw`` hands each message's subject, header block and payload
  straight to a plain function, skipping nats-py's Msg object, its queue and the callback
  task. ``reply_inbox`` gives a reply subject under one raw wildcard subscription of the
  connection: the store's direct gets (several answers each) arrive that way, with no SUB and
  UNSUB per read (that changed the server's subject index twice a read, and its match cache
  hit 1-3 % of the time).

And one convention: a connection whose URL names a NATS user takes its reply inboxes under
``_INBOX.<user>`` (domain.subjects.inbox_prefix), the only inboxes that user may subscribe to
(services.natsauth), so no role reads the replies meant for another.

Every Hoist process connects through ``connect`` below; the rest of nats-py is used as is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription

from domain.subjects import inbox_prefix
from transport.credentials import user_name

_CRLF = b"\r\n"
_NAMES_KEPT = 4096  # bound on remembered names: a peer sending endless new ones costs no memory
_names: dict[bytes, str | None] = {}  # raw name -> header key, None if nats-py would drop it


def _header_name(raw: bytes) -> str | None:
    """The key nats-py makes of a raw header name, or None where it skips the line."""
    try:
        key = raw.strip().decode("ascii")
    except UnicodeDecodeError:
        return None
    if any(c.isspace() for c in key):
        return None
    return key


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """Parse a NATS header block (``Name: Value`` lines) as nats-py does, names remembered."""
    out: dict[str, str] = {}
    names = _names
    for line in raw.split(_CRLF):
        name, sep, value = line.partition(b":")
        if not sep:
            continue  # also the empty lines
        try:
            key = names[name]
        except KeyError:
            key = _header_name(name)
            if len(names) < _NAMES_KEPT:
                names[name] = key
        if key is not None:
            out[key] = value.strip().decode("utf-8", "replace")
    return out


# (subject, header block or None, payload)
RawHandler = Callable[[bytes, bytes | None, bytes], None]
ReplyHandler = Callable[[bytes | None, bytes], None]  # (header block or None, payload)


class Client(NatsClient):
    """A nats-py client with ``parse_header_lines`` and ``subscribe_raw``."""

    _parse_header_lines = staticmethod(parse_header_lines)

    def __init__(self) -> None:
        super().__init__()
        self._raw: dict[int, RawHandler] = {}
        self._replies: dict[bytes, ReplyHandler] = {}  # reply subject -> its handler
        self._reply_prefix: str | None = None
        self._reply_lock = asyncio.Lock()
        self._reply_count = 0
        self.login: str | None = None  # the NATS user the URL names (None: none)

    async def connect(  # type: ignore[override]
        self, servers: str | list[str] = "nats://localhost:4222", **options: Any
    ) -> None:
        """nats-py's connect; replies come to ``_INBOX.<user>`` when the URL names a user.

        ``servers`` may list several servers of a cluster, comma-separated (``server_list``):
        the client reconnects to another when one goes.  The first URL's user and password
        log in everywhere, also to the servers the cluster advertises (nats-py would try
        those without any, and be refused)."""
        pool = server_list(servers)
        parts = urlsplit(pool[0])
        if parts.username and "inbox_prefix" not in options:
            options["inbox_prefix"] = inbox_prefix(unquote(parts.username))
        if parts.username and parts.password is not None and "user" not in options:
            options["user"] = unquote(parts.username)
            options["password"] = unquote(parts.password)
        self.login = options.get("user")
        await super().connect(pool, **options)

    @property
    def in_log_account(self) -> bool:
        """Whether this connection is in the log's account, the only one with JetStream (its
        one user is the manager's; a server without users has one account): only it may ask
        JetStream's API (stream info). Every other user reads the log by direct gets alone,
        and is refused the rest (services/stack/natsauth.py)."""
        return self.login in (None, user_name("manager"))

    async def subscribe_raw(self, subject: str, handler: RawHandler) -> Subscription:
        """Subscribe ``handler(subject, headers, payload)``, called in the connection's reading
        task for each message: ``headers`` is the raw block (``NATS/1.0 ...\\r\\n...``), or
        None if the message has none.  It must not block, and should not raise: an exception from it
        stops nats-py's reader.  Unsubscribe through the returned Subscription."""
        sub = await self.subscribe(subject)
        self._raw[sub._id] = handler
        return sub

    async def reply_inbox(self, handler: ReplyHandler) -> str:
        """A new reply subject whose messages go to ``handler`` (in the reading task, as
        ``subscribe_raw``'s do) until ``end_reply``."""
        if self._reply_prefix is None:
            async with self._reply_lock:
                if self._reply_prefix is None:
                    prefix = self.new_inbox()
                    # Sent before any request that names a reply under it, on this connection:
                    # the server has it before it answers (no flush needed, nor trusted: its
                    # PING can overtake buffered SUBs in nats-py 2.16).
                    await self.subscribe_raw(f"{prefix}.*", self._on_reply)
                    self._reply_prefix = prefix
        self._reply_count += 1
        inbox = f"{self._reply_prefix}.{self._reply_count}"
        self._replies[inbox.encode()] = handler
        return inbox

    def reply_subject_max(self) -> int:
        """The length of the longest subject ``reply_inbox`` gives: its prefix (an inbox), a
        dot and a count (at most 20 digits)."""
        return len(self._reply_prefix or self.new_inbox()) + 21

    def end_reply(self, inbox: str) -> None:
        """No more messages to ``inbox``'s handler (a late or a repeated answer is dropped)."""
        self._replies.pop(inbox.encode(), None)

    @property
    def replies_waiting(self) -> int:
        """How many reply subjects of ``reply_inbox`` have not ended."""
        return len(self._replies)

    def _on_reply(self, subject: bytes, block: bytes | None, data: bytes) -> None:
        handler = self._replies.get(subject)
        if handler is not None:
            handler(block, data)

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        handler = self._raw.get(sid)
        if handler is None:
            # nats-py passes None for a message without headers, though it annotates bytes
            await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
        else:
            handler(subject, headers, data)

    def _remove_sub(self, sid: int, max_msgs: int = 0) -> None:
        self._raw.pop(sid, None)
        super()._remove_sub(sid, max_msgs)


def cluster_replicas(nc: NatsClient) -> int:
    """How many copies a Hoist stream keeps on the server ``nc`` is connected to: 3 when it
    is one of a cluster of three or more (its INFO lists the cluster's client URLs), else 1."""
    info = getattr(nc, "_server_info", None) or {}
    servers = len(info.get("connect_urls") or ()) if info.get("cluster") else 1
    return 3 if servers >= 3 else 1


def server_list(servers: str | list[str]) -> list[str]:
    """The servers of a NATS URL that lists several, comma-separated (as the nats CLI takes
    them: ``nats://u:p@h1:4222,nats://u:p@h2:4223``; a later one without a user takes the
    first's), or of a list of URLs."""
    urls = servers.split(",") if isinstance(servers, str) else list(servers)
    urls = [u.strip() for u in urls if u.strip()]
    if not urls:
        raise ValueError(f"no NATS server in {servers!r}")
    return urls


async def connect(servers: str | list[str], **options: Any) -> Client:
    """``nats.connect`` returning this module's Client (same options)."""
    nc = Client()
    await nc.connect(servers, **options)
    return nc
