"""One `hoist up --runtime dummy --agents 2 --no-demo` stack for the CLI tests of a module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cli.stack_harness import Stack, Terminal, start_stack, stop_stack


@pytest.fixture(scope="module")
def hoist_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = start_stack(tmp_path_factory.mktemp("stack") / "data", "--agents", "2", "--no-demo")
    yield stack
    assert stop_stack(stack) == 0, stack.log.read_text()


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    term = Terminal()
    yield term
    term.close()
