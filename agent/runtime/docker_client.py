"""A connection of its own to the Docker Engine for one blocking stream, which another
thread can end by shutting its socket down."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import docker
import requests

API_VERSION = "1.41"  # Docker 20.10+; pinned so that making a client does no I/O


def _shutdown_response(r: requests.Response) -> None:
    """Wake a thread blocked reading ``r``: close() alone does not, shutdown() does. A plain
    response keeps its socket on the connection; a hijacked one (exec) in its file object."""
    socks: list[Any] = []
    with contextlib.suppress(Exception):
        socks.append(r.raw.connection.sock)
    with contextlib.suppress(Exception):
        raw = r.raw._fp.fp.raw
        socks.append(getattr(raw, "_sock", raw))
    for sock in socks:
        with contextlib.suppress(Exception):
            sock.shutdown(socket.SHUT_RDWR)


class _Conn:
    """An API client of its own for one blocking stream, which another thread can end."""

    def __init__(self, base_url: str) -> None:
        self.api = docker.APIClient(base_url=base_url, version=API_VERSION)
        self.api.hooks["response"].append(self._keep_response)
        # Every response: a stream call may make a short one first (logs inspects the tty).
        self.responses: list[requests.Response] = []
        self.aborted = False

    def _keep_response(self, r: requests.Response, *args: Any, **kwargs: Any) -> None:
        self.responses.append(r)
        if self.aborted:  # aborted before the request went out
            _shutdown_response(r)

    def abort(self) -> None:
        self.aborted = True
        for r in list(self.responses):
            _shutdown_response(r)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.api.close()
