"""The docker fixtures, until tests/conftest.py imports them for every test directory."""

from tests.infra.fixtures import (  # noqa: F401 - pytest finds fixtures by name
    big_image,
    docker_engine,
    registry,
    slow_proxy,
    small_image,
    stall_proxy,
)
