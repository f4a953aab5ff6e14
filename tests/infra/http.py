"""What the docker tests serve from a kernel and how they fetch it."""

from __future__ import annotations

import time
import urllib.request

# A busybox kernel serving "hi" on port 8080.
SERVE_HI = "mkdir -p /www && echo hi > /www/index.html && exec httpd -f -p 8080 -h /www"


def http_get(url: str, timeout: float = 20) -> bytes:
    """The body at ``url``, retried until ``timeout`` while the server is not up yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return bytes(r.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
