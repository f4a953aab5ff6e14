"""The web view in a real headless Chromium against a real `hoist up` stack (dummy agents whose
pulls take seconds): the page loads without a console error, a session created over NATS shows
up without a reload, its pull bar advances and it reaches RUNNING, the destroy button ends it,
an unknown token gets 401, and a hostile owner is shown as text (no script runs)."""

from __future__ import annotations

import asyncio
import time

from playwright.async_api import Browser

from domain.subjects import SESSION_CREATE, SESSION_GET
from services.transport.client import Client
from tests.web.conftest import Watched, Web, add_user, ask, screenshot_dir

CPU_MEM = {"cpu": 1, "mem": 512 * 1024**2}


async def test_a_new_session_appears_live_its_pull_bar_advances_and_it_runs(
    web: Web, page: Watched, client: Client
) -> None:
    p = page.page
    await p.wait_for_selector("#fleet .card[data-agent='agent-2']")
    image = web.stack.next_big_image()  # 800 MiB at 80 MiB/s: ~10 s of pull
    created = await ask(
        client,
        SESSION_CREATE,
        {"owner": "carol", "image": image, "resources": CPU_MEM, "cluster_size": 2},
    )
    sid = created["session_id"]
    row = f"#sessions tr[data-session='{sid}']"
    await p.wait_for_selector(row, timeout=10_000)  # no reload: the events stream brought it
    bar = f"{row} .session-pull .bar"
    await p.wait_for_selector(bar, timeout=10_000)
    seen = [int(await p.get_attribute(bar, "aria-valuenow") or 0)]
    deadline = time.monotonic() + 15
    while seen[-1] <= seen[0] and time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        seen.append(int(await p.get_attribute(bar, "aria-valuenow") or 0))
    assert seen[-1] > seen[0], f"the pull bar did not advance: {seen}"
    # The layers of the pull in flight, with rates and an ETA, in "Pulls in progress".
    assert "ETA" in await p.inner_text("#live-pulls")
    if (shots := screenshot_dir()) is not None:
        shots.mkdir(parents=True, exist_ok=True)
        await p.screenshot(path=str(shots / "web-dashboard-pull.png"), full_page=True)
        await p.goto(f"{web.url}#/session/{sid}")
        await p.wait_for_selector("#session-page .session-pull .bar")
        await asyncio.sleep(1)
        await p.screenshot(path=str(shots / "web-session-pull.png"), full_page=True)
        await p.goto(web.url)
    await p.wait_for_selector(f"{row} .status.s-RUNNING", timeout=30_000)
    assert page.errors == []


async def test_the_session_page_shows_history_kernels_and_destroy_ends_it(
    web: Web, page: Watched, client: Client
) -> None:
    p = page.page
    created = await ask(
        client,
        SESSION_CREATE,
        {"owner": "dave", "image": web.stack.next_image(), "resources": CPU_MEM, "max_wait": 30},
    )
    sid = created["session_id"]
    assert created["status"] == "RUNNING", created
    await p.goto(f"{web.url}#/session/{sid}")
    await p.wait_for_selector("#session-page .status.s-RUNNING")
    history = p.locator("#history tr")
    await history.filter(has_text="KernelCreated").first.wait_for()
    text = await p.inner_text("#history")
    for event in ("SessionEnqueued", "SessionScheduled", "KernelPulling", "KernelCreated"):
        assert event in text
    assert await p.locator("#session-page tr[data-kernel]").count() == 1
    await p.click("#destroy")
    await p.wait_for_selector("#session-page .status.s-TERMINATED", timeout=20_000)
    ended = await ask(client, SESSION_GET, {"session_id": sid})
    assert ended["status"] == "TERMINATED", ended
    await history.filter(has_text="KernelTerminated").first.wait_for()
    assert page.errors == []


async def test_an_unknown_token_gets_401_and_no_page(web: Web, browser: Browser) -> None:
    context = await browser.new_context()
    p = await context.new_page()
    response = await p.goto(f"{web.url}?token=not-the-token")
    assert response is not None and response.status == 401
    assert "401 unauthorized" in await p.inner_text("body")
    assert await context.cookies() == []  # no cookie was set on the way
    again = await context.request.get(web.url)  # what the browser sends next: still nothing
    assert again.status == 401
    assert again.headers["www-authenticate"].startswith("Basic")  # a Hoist user may log in
    await context.close()


async def test_a_hostile_owner_and_command_are_shown_as_text(
    web: Web, page: Watched, client: Client
) -> None:
    p = page.page
    owner = '<img src=x onerror="window.__xss=1">'
    command = ["sh", "-c", "</script><script>window.__xss=2</script>", "<b>bold</b>"]
    created = await ask(
        client,
        SESSION_CREATE,
        {"owner": owner, "image": web.stack.next_image(), "resources": CPU_MEM, "command": command},
    )
    sid = created["session_id"]
    cell = f"#sessions tr[data-session='{sid}'] td.owner"
    await p.wait_for_selector(cell)
    assert await p.inner_text(cell) == owner  # the markup, as characters
    await p.goto(f"{web.url}#/session/{sid}")
    await p.wait_for_selector("#session-page .owner")
    assert await p.inner_text("#session-page .owner") == owner
    assert "<script>window.__xss=2</script>" in await p.inner_text("#session-page")
    await asyncio.sleep(0.5)  # an injected onerror would have fired by now
    assert await p.evaluate("window.__xss") is None
    assert await p.locator("#main img, #main script, #main b").count() == 0
    assert page.errors == []


async def test_filters_narrow_the_sessions_and_survive_live_redraws(
    web: Web, page: Watched, client: Client
) -> None:
    p = page.page
    ids = {}
    for owner, group in (("flo", "default"), ("gus", "default")):
        reply = await ask(
            client,
            SESSION_CREATE,
            {"owner": owner, "image": web.stack.next_image(), "resources": CPU_MEM,
             "resource_group": group},
        )  # fmt: skip
        ids[owner] = reply["session_id"]
    for sid in ids.values():
        await p.wait_for_selector(f"#sessions tr[data-session='{sid}']")
    owner_filter = await p.wait_for_selector("select[data-filter='owner']")
    assert owner_filter is not None
    await p.select_option("select[data-filter='owner']", "flo")
    await p.wait_for_selector(f"#sessions tr[data-session='{ids['gus']}']", state="detached")
    assert await p.locator(f"#sessions tr[data-session='{ids['flo']}']").count() == 1
    await p.wait_for_selector(f"#sessions tr[data-session='{ids['flo']}'] .s-RUNNING")
    # The pulls and status changes redrew the table meanwhile; the filter is the same element.
    assert await owner_filter.evaluate("n => n.isConnected && n.value") == "flo"
    await p.select_option("select[data-filter='owner']", "")
    await p.wait_for_selector(f"#sessions tr[data-session='{ids['gus']}']")
    assert page.errors == []


async def test_an_admin_user_may_destroy_another_users_session(
    web: Web, browser: Browser, client: Client
) -> None:
    """A Hoist user added with --admin logs in with their password; the manager lets them
    destroy any session, so the page offers Destroy on another owner's, and it works."""
    name, password = add_user(web, "ida", admin=True)
    created = await ask(
        client,
        SESSION_CREATE,
        {"owner": "olga", "image": web.stack.next_image(), "resources": CPU_MEM, "max_wait": 30},
    )
    sid = created["session_id"]
    context = await browser.new_context(http_credentials={"username": name, "password": password})
    try:
        p = await context.new_page()
        errors: list[str] = []
        p.on("pageerror", lambda e: errors.append(str(e)))
        await p.goto(f"{web.url}#/session/{sid}")
        await p.wait_for_selector("#session-page .status.s-RUNNING")
        await p.click("#destroy", timeout=5_000)
        await p.wait_for_selector("#session-page .status.s-TERMINATED", timeout=20_000)
        assert (await ask(client, SESSION_GET, {"session_id": sid}))["status"] == "TERMINATED"
        assert await p.inner_text("#who") == "as ida (admin)"
        assert errors == []
    finally:
        await context.close()
