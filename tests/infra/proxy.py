"""A TCP proxy in front of the registry that slows downloads down or stalls them.

Pull ``f"{proxy.host}/name:tag"`` to go through it. ``rate_bps`` caps each connection's
download rate (a slow registry: many progress updates). ``stall_after`` stops forwarding after
that many bytes per connection and keeps the connection open: manifests (small) pass, blob
downloads hang, a real stalled pull. ``open_connections`` counts client connections.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from services.stack.natsserver import free_port


class RegistryProxy:
    def __init__(
        self, target_port: int, stall_after: int | None = None, rate_bps: float | None = None
    ) -> None:
        self.target_port = target_port
        self.stall_after = stall_after
        self.rate_bps = rate_bps
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._sockets: set[socket.socket] = set()
        self._open = 0
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        with self._lock:
            return self._open

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                return
            with self._lock:
                self._sockets |= {client, upstream}
                self._open += 1
            closed = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, closed), daemon=True).start()
            threading.Thread(
                target=self._down, args=(upstream, client, closed), daemon=True
            ).start()

    def _up(self, client: socket.socket, upstream: socket.socket, closed: threading.Event) -> None:
        """Requests go through untouched; this side notices when the client hangs up."""
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                upstream.sendall(data)
        closed.set()
        with self._lock:
            self._open -= 1
        self._shutdown(client, upstream)

    def _down(
        self, upstream: socket.socket, client: socket.socket, closed: threading.Event
    ) -> None:
        chunk = 65536 if self.rate_bps is None else max(1024, int(self.rate_bps / 50))
        sent = 0
        with contextlib.suppress(OSError):
            while data := upstream.recv(chunk):
                if self.stall_after is not None:
                    data = data[: max(0, self.stall_after - sent)]
                    if not data:
                        closed.wait()  # stalled: hold the connection open, send nothing
                        break
                client.sendall(data)
                sent += len(data)
                if self.rate_bps is not None:
                    time.sleep(len(data) / self.rate_bps)
        self._shutdown(client, upstream)

    @staticmethod
    def _shutdown(*socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            self._shutdown(*self._sockets)
            for s in self._sockets:
                s.close()
