"""The page in a real headless Chromium against a view whose hub holds fixed rows (no stack):
what takes a real fleet long to show, such as an agent the manager found lost, or a plain
Hoist user's view of the sections the manager serves only admins."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from playwright.async_api import Browser, Page
from starlette.requests import Request

from services.stack.natsserver import free_port
from services.web.app import Access, Principal, make_app
from services.web.hub import FLEET_WIDE, Hub

GIB = 2**30
LONG_IMAGE = "registry.example.com/averyveryverylongteamname/averyveryverylongimagename:tag1"


def rows(*items: dict[str, Any]) -> dict[str, Any]:
    return {"seq": 1, "rows": list(items), "truncated": False}


def agent(agent_id: str, **more: Any) -> dict[str, Any]:
    return {
        "agent_id": agent_id, "resource_group": "default", "runtime": "dummy", "alive": True,
        "status_info": "registered", "cpu": 8, "mem": 32 * GIB, "disk": 500 * GIB,
        "slots": None, "slot_amounts": {}, "free_cpu": 8, "free_mem": 32 * GIB,
        "free_disk": 500 * GIB, "free_slots": {}, "kernels": 0, **more,
    }  # fmt: skip


ADMIN_SECTIONS: dict[str, Any] = {
    "agents": rows(
        agent(
            "agent-1",
            slots="gpu=4",
            slot_amounts={"gpu": 4.0},
            free_slots={"gpu": 1.5},
            free_cpu=5,
            kernels=3,
        ),
        agent("agent-2", alive=False, status_info="heartbeat-timeout: no heartbeat for 15s"),
    ),
    "images": rows(
        {
            "agent_id": "agent-1",
            "image": LONG_IMAGE,
            "size_bytes": 3 * GIB,
            "kernels_using": 3,
            "preloaded": True,
            "pinned": True,
        },
    ),
    "sessions": rows(),
    "kernels": rows(),
    "occupancy_owner": rows(),
    "occupancy_agent": rows(),
    "pulls": rows(),
    "policies": rows(),
    "plans": {"plans": {}, "converged": True},
}
NOTE = "for admins only: the manager serves user 'pat' their own sessions"
PLAIN_SECTIONS: dict[str, Any] = {
    **{name: rows() for name in ADMIN_SECTIONS},
    **{name: {"admin_only": NOTE} for name in FLEET_WIDE},
}


class FixedHub(Hub):
    """A hub whose first message is a fixed snapshot, and nothing after it."""

    def __init__(self, who: str, admin: bool, sections: dict[str, Any]) -> None:
        super().__init__(None, who, role=admin)  # type: ignore[arg-type]
        self.sections = sections

    async def watch(self) -> AsyncIterator[dict[str, Any]]:
        yield self.snapshot()
        await asyncio.Event().wait()


class FixedAccess(Access):
    """Everyone is ``self.now``."""

    now: Principal

    async def principal(self, request: Request) -> Principal | None:
        return self.now


@pytest.fixture
async def view() -> AsyncIterator[tuple[FixedAccess, str]]:
    access = FixedAccess(token="t" * 24, admin=None, nats_url="")  # type: ignore[arg-type]
    port = free_port()
    config = uvicorn.Config(make_app(access), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        assert not serving.done(), "the view did not start"
        await asyncio.sleep(0.02)
    yield access, f"http://127.0.0.1:{port}/"
    server.should_exit = True
    with contextlib.suppress(asyncio.CancelledError):
        await serving


async def open_page(browser: Browser, url: str) -> tuple[Page, list[str]]:
    page = await (await browser.new_context(viewport={"width": 1400, "height": 900})).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    await page.goto(url)
    return page, errors


async def open_as(
    view: tuple[FixedAccess, str], browser: Browser, hub: FixedHub
) -> tuple[Page, list[str]]:
    """The page as ``hub``'s principal sees it."""
    access, url = view
    access.now = Principal(hub)
    return await open_page(browser, url)


async def test_a_lost_agent_its_slots_and_a_long_image_name_on_the_fleet_cards(
    view: tuple[FixedAccess, str], browser: Browser
) -> None:
    page, errors = await open_as(view, browser, FixedHub("admin (token)", True, ADMIN_SECTIONS))
    lost = "#fleet .card.lost[data-agent='agent-2']"
    await page.wait_for_selector(lost)
    assert "lost" in await page.inner_text(f"{lost} h3")
    assert await page.inner_text(f"{lost} .error") == "heartbeat-timeout: no heartbeat for 15s"
    assert await page.locator("#fleet .card.lost").count() == 1  # agent-1 is alive
    card = "#fleet .card[data-agent='agent-1']"
    gpu = f"{card} .row[data-slot='gpu']"
    assert await page.get_attribute(f"{gpu} .bar", "aria-valuenow") == "63"  # 2.5 of 4 used
    assert (await page.inner_text(gpu)).split("\n") == ["gpu", "2.5 / 4 used", "1.5 free"]
    image = page.locator(f"{card} tr[data-image='{LONG_IMAGE}']")
    assert await image.locator(".mark").all_inner_texts() == ["preloaded", "pinned"]
    assert "3.0 GiB" in await image.inner_text()
    # A name with nothing to break at wraps inside the card: "3 using" stays in it.
    card_box = await page.locator(card).bounding_box()
    using_box = await image.locator("td.using").bounding_box()
    assert card_box and using_box
    assert using_box["x"] + using_box["width"] <= card_box["x"] + card_box["width"], (
        card_box,
        using_box,
    )
    assert errors == []


async def test_a_plain_users_page_says_which_sections_are_for_admins(
    view: tuple[FixedAccess, str], browser: Browser
) -> None:
    page, errors = await open_as(view, browser, FixedHub("pat", False, PLAIN_SECTIONS))
    await page.wait_for_selector("#fleet [data-admin-only='agents']")
    for section, name in (
        ("#fleet", "agents"),
        ("#occupancy", "occupancy_agent"),
        ("#pulls", "pulls"),
        ("#policies", "policies"),
        ("#policies", "plans"),
    ):
        assert await page.inner_text(f"{section} [data-admin-only='{name}']") == NOTE, name
    assert await page.locator("#occupancy table[data-occupancy='owner']").count() == 1
    assert await page.locator("#main .error").count() == 0
    assert await page.inner_text("#who") == "as pat"
    assert errors == []
