"""``/metrics`` in the Prometheus text format, for the manager and each agent.

Each process keeps its own ``CollectorRegistry`` (tests run several managers and agents in one
process: a global registry would mix their counts) and serves it on its own port, bound to
127.0.0.1 unless a host is asked for.  The server runs on the process's event loop (see
MetricsServer).

Counters that the hot paths bump are plain ints on the parts (``fleet.conflicts += 1``) read at
scrape time by a collector (``Gauges``): nothing is formatted or locked per event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "hoist_"
# Image size buckets (the ``size`` label): bounded, so no label explosion; kubelet buckets its
# pull histogram by image size the same way (KEP-4216's image_size_in_bytes buckets).
_SIZES = ((100 * 1024**2, "lt100MiB"), (1024**3, "100MiB-1GiB"), (10 * 1024**3, "1-10GiB"))


def size_bucket(size_bytes: int) -> str:
    for bound, name in _SIZES:
        if size_bytes < bound:
            return name
    return "ge10GiB"


# Pull and session-start durations: from a cached image (well under a second) to a multi-GB
# pull over a slow link (an hour).
DURATION_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, float("inf"))


class Gauges(Collector):
    """Values read at scrape time: ``(name, help, kind, read)`` with ``kind`` "gauge" or
    "counter" and ``read()`` a number, or a mapping ``{label value: number}`` with ``label``."""

    def __init__(
        self,
        items: Iterable[tuple[str, str, str, Callable[[], object]]],
        label: str = "",
    ) -> None:
        self.items = list(items)
        self.label = label

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        for name, doc, kind, read in self.items:
            value = read()
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            if isinstance(value, dict):
                family = family_type(name, doc, labels=[self.label])
                for key, number in sorted(value.items()):
                    family.add_metric([str(key)], float(number))
            else:
                family = family_type(name, doc, value=float(value))  # type: ignore[arg-type]
            yield family


class MetricsServer:
    """``/metrics`` of ``registry`` on ``host:port`` (port 0: a free one) until ``stop``.

    Served on the process's event loop, not in a thread: the collectors read the parts' dicts
    and counters between two steps of the loop, never while a handler is changing them."""

    def __init__(self, registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0):
        self.registry = registry
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Start serving; the port it listens on.  ValueError naming the flag when it cannot
        listen there (a process's main says so, not "cannot connect to NATS")."""
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError as e:
            raise ValueError(
                f"--metrics-port {self.port}: cannot serve /metrics on {self.host}:{self.port}"
                f" ({e.strerror or e}): give another port, or 0 for any free one"
            ) from None
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                request = await reader.readuntil(b"\r\n\r\n")
            method, _, rest = request.partition(b" ")
            path = rest.partition(b" ")[0].partition(b"?")[0]
            if method not in (b"GET", b"HEAD"):
                status, body = b"405 Method Not Allowed", b"GET /metrics\n"
            elif path != b"/metrics":
                status, body = b"404 Not Found", b"see /metrics\n"
            else:
                status, body = b"200 OK", generate_latest(self.registry)
            head = (
                b"HTTP/1.1 " + status + b"\r\nContent-Type: " + CONTENT_TYPE_LATEST.encode()
                + b"\r\nContent-Length: " + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
            )  # fmt: skip
            writer.write(head + (body if method == b"GET" else b""))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a client that went away or sent garbage: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
