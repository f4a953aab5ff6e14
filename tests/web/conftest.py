"""One `hoist up --runtime dummy --agents 2 --no-demo --slot gpu=2` stack per test module, with
its web view and /metrics, and what the web tests need of it: the page's URL and token, a NATS
client of the client role, and a real headless Chromium (Debian's, driven by Playwright: never a
download)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import pytest_asyncio
from playwright.async_api import Browser, ConsoleMessage, Page, async_playwright

from tests.cli.stack_harness import Stack, start_stack, stop_stack
from transport import credentials
from transport.client import Client, connect

CHROMIUM = "/usr/bin/chromium"  # Debian's package; ./dev installs it


@dataclass
class Web:
    stack: Stack
    url: str  # http://127.0.0.1:PORT/
    token: str
    info: dict[str, Any]  # stack.json

    def metrics_url(self, process: str) -> str:
        return str(self.info["metrics"][process])


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    stack = start_stack(
        tmp_path_factory.mktemp("stack") / "data", "--agents", "2", "--no-demo", "--slot", "gpu=2"
    )
    try:
        info = json.loads((stack.data_dir / "stack.json").read_text())
        token = (stack.data_dir / "web-token").read_text().strip()
        yield Web(stack, info["web_url"], token, info)
    finally:
        assert stop_stack(stack) == 0, stack.log.read_text()


@pytest.fixture
async def client(web: Web) -> AsyncIterator[Client]:
    """A NATS connection of the client role: sessions are created over NATS, like any client's."""
    creds = credentials.load_credentials(web.stack.data_dir)
    nc = await connect(credentials.role_url(web.info["url"], "client", creds))
    yield nc
    await nc.close()


def add_user(web: Web, name: str, *, admin: bool = False) -> tuple[str, str]:
    """Add Hoist user ``name`` (``admin``: an admin user) to the stack; their NATS name and
    password, what they log in to the view with (HTTP Basic)."""
    flags = ["--admin"] if admin else []
    added = web.stack.hoist(
        "user", "add", name, *flags, env={"HOIST_NATS_URL": web.stack.creds("admin")}
    )
    assert added.returncode == 0, added.stderr
    nats = urlsplit(web.stack.hoist("creds", "user", name).stdout.strip())
    return unquote(nats.username or ""), unquote(nats.password or "")


async def ask(nc: Client, subject: str, payload: dict[str, Any]) -> Any:
    msg = await nc.request(subject, json.dumps(payload).encode(), timeout=15)
    return json.loads(msg.data)


@pytest.fixture(scope="session")
def chromium() -> str:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: `./dev test` installs chromium"
    return CHROMIUM


@asynccontextmanager
async def launched(chromium: str) -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        await b.close()


@pytest.fixture
async def browser(chromium: str) -> AsyncIterator[Browser]:
    async with launched(chromium) as b:
        yield b


# One Chromium for a module's tests (its start is seconds of CPU); each test gets a context of
# its own (cookies, storage), as from a fresh browser. Playwright's objects belong to the event
# loop they were made in: a module using it runs its tests, and its async fixtures, in the
# module's loop (`pytestmark = pytest.mark.asyncio(loop_scope="module")`).
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def module_browser(chromium: str) -> AsyncIterator[Browser]:
    async with launched(chromium) as b:
        yield b


@dataclass
class Watched:
    page: Page
    errors: list[str]  # console errors and uncaught exceptions


@pytest_asyncio.fixture(loop_scope="module")
async def page(module_browser: Browser, web: Web) -> AsyncIterator[Watched]:
    """A page logged in with the token (its first load sets the cookie), in a context of its
    own of the module's browser."""
    context = await module_browser.new_context(viewport={"width": 1400, "height": 1000})
    p = await context.new_page()
    errors: list[str] = []

    def on_console(m: ConsoleMessage) -> None:
        if m.type == "error":
            errors.append(m.text)

    p.on("console", on_console)
    p.on("pageerror", lambda e: errors.append(str(e)))
    response = await p.goto(f"{web.url}?token={web.token}")
    assert response is not None and response.status == 200
    assert "token=" not in p.url  # the token went into a cookie, out of the address bar
    yield Watched(p, errors)
    await context.close()


def screenshot_dir() -> Path | None:
    """Where the browser tests leave their screenshots (HOIST_WEB_SCREENSHOTS), else none."""
    where = os.environ.get("HOIST_WEB_SCREENSHOTS")
    return Path(where) if where else None
