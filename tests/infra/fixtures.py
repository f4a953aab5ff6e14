"""Session-scoped pytest fixtures for the docker tests; tests/conftest.py imports them.

They start what they need (dockerd, docker-registry) and FAIL with what to install when they
cannot: CI runs these tests, they never skip. Set HOIST_DOCKER_HOST (e.g.
``unix:///var/run/docker.sock``) to use a Docker Engine that is already running instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from tests.infra.dockerd import DockerDaemon, ping
from tests.infra.images import build_image
from tests.infra.proxy import RegistryProxy
from tests.infra.registry import Registry

T = TypeVar("T")

# Seconds each fixture took to start, for reports (CI has a time budget).
TIMINGS: dict[str, float] = {}

SMALL_PAD_MB = 2  # + ~2 MB busybox: a few MB in two layers
BIG_PAD_MB = 60  # >= 50 MB, in three layers of random bytes: many progress updates


def _or_fail(start: Callable[[], T]) -> T:
    """Run ``start``; its RuntimeError (what to install, the log tail) fails the test."""
    try:
        return start()
    except RuntimeError as e:
        message = str(e)
    pytest.fail(message, pytrace=False)  # outside except: no chained traceback


def _timed(name: str, start: float) -> None:
    TIMINGS[name] = round(time.monotonic() - start, 2)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[str]:
    """URL (``unix:///...``) of a running Docker Engine: a private dockerd or HOIST_DOCKER_HOST."""
    external = os.environ.get("HOIST_DOCKER_HOST")
    if external:
        if not ping(external):
            pytest.fail(
                f"HOIST_DOCKER_HOST={external} does not answer; start it or unset it", pytrace=False
            )
        yield external
        return
    start = time.monotonic()
    daemon = _or_fail(DockerDaemon().start)
    _timed("dockerd", start)
    try:
        yield daemon.url
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def registry() -> Iterator[Registry]:
    """A registry on 127.0.0.1:PORT with its access log (``count``, ``mark``, ``requests``)."""
    start = time.monotonic()
    reg = _or_fail(Registry().start)
    _timed("registry", start)
    try:
        yield reg
    finally:
        reg.stop()


# The images go straight to the registry; their fixtures still take docker_engine, so that a test
# given one runs with the other Docker tests (tests/conftest.py groups them by that fixture).
def _image(registry: Registry, name: str, pad_mb: int, layers: int, busybox: bool = True) -> str:
    start = time.monotonic()
    ref = _or_fail(
        lambda: build_image(registry, name, "1", pad_mb=pad_mb, pad_layers=layers, busybox=busybox)
    )
    _timed(f"image {name}", start)
    return ref


@pytest.fixture(scope="session")
def small_image(docker_engine: str, registry: Registry) -> str:
    """``127.0.0.1:PORT/hoist/small:1``: busybox + 2 MB, in the registry, not on the daemon."""
    return _image(registry, "hoist/small", SMALL_PAD_MB, 1)


@pytest.fixture(scope="session")
def big_image(docker_engine: str, registry: Registry) -> str:
    """``127.0.0.1:PORT/hoist/big:1``: busybox + 60 MB in 3 layers, in the registry only."""
    return _image(registry, "hoist/big", BIG_PAD_MB, 3)


@pytest.fixture(scope="session")
def progress_image(docker_engine: str, registry: Registry) -> str:
    """``127.0.0.1:PORT/hoist/progress:1``: 60 MB of random bytes in 4 layers and nothing else,
    pulled by one test only: dockerd lets a new pull join a download another test abandoned,
    and then the registry never sees that layer's fetch, so a test that counts the registry's
    requests needs layers nobody else pulls."""
    return _image(registry, "hoist/progress", BIG_PAD_MB, 4, busybox=False)


@pytest.fixture(scope="session")
def stall_image(docker_engine: str, registry: Registry) -> str:
    """``127.0.0.1:PORT/hoist/stall:1``: 8 MB of random bytes in 2 layers and nothing else, for
    stalled pulls. dockerd goes on retrying a stalled layer download after the pull is
    cancelled, and a later pull of the same layer waits for it: so stalled layers must be
    shared with no other image (not even busybox)."""
    return _image(registry, "hoist/stall", 8, 2, busybox=False)


@pytest.fixture
def stall_proxy(registry: Registry) -> Iterator[RegistryProxy]:
    """A proxy to the registry that hangs every download after 1 MB: pull
    ``f"{stall_proxy.host}/hoist/stall:1"`` (the stall_image fixture) to get a stalled pull."""
    proxy = RegistryProxy(registry.port, stall_after=1024 * 1024)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def slow_proxy(registry: Registry) -> Iterator[RegistryProxy]:
    """A proxy to the registry at 20 MB/s per connection: the big image takes a few seconds
    and reports progress many times (the registry itself is local disk speed)."""
    proxy = RegistryProxy(registry.port, rate_bps=20 * 1024 * 1024)
    try:
        yield proxy
    finally:
        proxy.close()
