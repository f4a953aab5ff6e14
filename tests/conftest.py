"""Shared fixtures: a real nats-server with JetStream per test (from the venv's wheel), and a real
Docker Engine, registry and images for the docker tests (tests/infra, started once per run)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.stack.natsserver import NatsCluster, NatsServer
from tests.infra.fixtures import (  # noqa: F401 - pytest finds fixtures by name
    big_image,
    docker_engine,
    progress_image,
    registry,
    slow_proxy,
    small_image,
    stall_image,
    stall_proxy,
)
from transport.client import Client, connect

# --- parallel runs (pytest-xdist, `./dev test` runs -n 4 --dist loadgroup) ----------------------
# A test that shares a module- or class-scoped fixture goes to the worker of its module's other
# tests (one stack per module, as in a serial run); every test that uses the Docker Engine goes to
# one worker (one dockerd, one registry, one build of each image, and no test sees another
# test's images or networks come and go); the rest are spread one by one.
DOCKER_GROUP = "docker"


def xdist_group(item: pytest.Item) -> str | None:
    """The group a test runs in, or None for a test any worker may take on its own."""
    names = getattr(item, "fixturenames", ())
    if "docker_engine" in names:
        return DOCKER_GROUP
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    if any(d.scope in ("module", "class", "package") for fixdefs in defs for d in fixdefs):
        return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """On a loadgroup worker, pytest-xdist names a grouped test ``nodeid@group``: a pytest that
    does not show that name would silently spread a module's tests over every worker."""
    if not hasattr(session.config, "workerinput") or not session.config.getvalue("loadgroup"):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group")]
    if any("@" not in nodeid for nodeid in lost):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} ignores pytest-xdist's groups ({lost[0]} has none):"
            " install the versions pyproject.toml pins (./dev test does)"
        )


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh, open (no auth) nats-server with JetStream; roles are tested with nats.conf."""
    with NatsServer(tmp_path / "nats") as server:
        yield server


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[Client]:
    client = await connect(nats_server.url)
    yield client
    await client.drain()


# A three-node JetStream cluster (open, no auth; R3 streams survive one node's loss). Reusable
# by any test that kills nodes: NatsCluster.kill(i) / restart(i); tests/infra/cluster.py finds a
# stream's leader.
@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path / "cluster") as cluster:
        yield cluster


@pytest.fixture
async def cluster_nc(nats_cluster: NatsCluster) -> AsyncIterator[Client]:
    """A client given every node, reconnecting for ever (as Hoist's processes connect)."""
    client = await connect(nats_cluster.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    yield client
    await client.close()
