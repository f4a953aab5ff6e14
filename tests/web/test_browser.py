"""The web view in a real headless Chromium against a real `hoist up` stack (dummy agents whose
pulls take seconds, each offering gpu=2): the page loads without a console error, a session
created over NATS shows up without a reload, its pull bar advances and it reaches RUNNING, the
destroy button ends it (also an admin user's, on another owner's session), an unknown token gets
401, a hostile owner is shown as text (no script runs), and the dashboard's sections (fleet
bars, slots and image marks, occupancy with PULLING apart, pulls, policies and plans, the status
and resource-group filters) show what the stack holds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser

from domain.subjects import SESSION_CREATE, SESSION_GET
from tests.web.conftest import Watched, Web, add_user, ask, screenshot_dir
from transport import credentials
from transport.client import Client, connect

CPU_MEM = {"cpu": 1, "mem": 512 * 1024**2}
# The module's browser (conftest: module_browser) and its pages live in the module's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module")
async def client(web: Web) -> AsyncIterator[Client]:
    """conftest's client, made in the module's loop (a NATS connection answers in its own)."""
    creds = credentials.load_credentials(web.stack.data_dir)
    nc = await connect(credentials.role_url(web.info["url"], "client", creds))
    yield nc
    await nc.close()


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
    # The page says what the manager answered first (a refusal would show here, not as a
    # status that never comes).
    asked = p.locator("#destroy-result")
    await p.wait_for_function(
        "() => document.querySelector('#destroy-result')?.textContent !== ''", timeout=20_000
    )
    assert (await asked.inner_text()).startswith("destroy asked"), await asked.inner_text()
    await p.wait_for_selector("#session-page .status.s-TERMINATED", timeout=20_000)
    ended = await ask(client, SESSION_GET, {"session_id": sid})
    assert ended["status"] == "TERMINATED", ended
    await history.filter(has_text="KernelTerminated").first.wait_for()
    assert page.errors == []


async def test_an_unknown_token_gets_401_and_no_page(web: Web, module_browser: Browser) -> None:
    context = await module_browser.new_context()
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
        # Medium images: their pulls still redraw the table once the filter is chosen.
        reply = await ask(
            client,
            SESSION_CREATE,
            {"owner": owner, "image": web.stack.next_medium_image(), "resources": CPU_MEM,
             "resource_group": group, "name": f"{owner}-job", "labels": {"team": owner}},
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
    # The label filter; each row shows the session's name and labels.
    gus = f"#sessions tr[data-session='{ids['gus']}']"
    assert await p.inner_text(f"{gus} td >> nth=0") == "gus-job\nteam=gus"
    await p.select_option("select[data-filter='label']", "team=gus")
    await p.wait_for_selector(f"#sessions tr[data-session='{ids['flo']}']", state="detached")
    assert await p.locator(gus).count() == 1
    await p.select_option("select[data-filter='label']", "")
    await p.wait_for_selector(f"#sessions tr[data-session='{ids['flo']}']")
    assert page.errors == []


async def test_an_admin_user_may_destroy_another_users_session(
    web: Web, module_browser: Browser, client: Client
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
    creds = {"username": name, "password": password}
    context = await module_browser.new_context(http_credentials=creds)
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


async def hoist_admin(web: Web, *args: str) -> str:
    """`hoist ARGS` as the stack's admin role, off the event loop; its stdout."""
    env = {"HOIST_NATS_URL": web.stack.creds("admin")}
    done = await asyncio.to_thread(web.stack.hoist, *args, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def test_the_dashboard_shows_fleet_occupancy_pulls_policies_and_filters(
    web: Web, page: Watched, client: Client
) -> None:
    """One scene for every section: a pull under way (PULLING, counted apart and filtered on),
    a kernel holding a gpu slot, a failed pull, a session in a group with no agent, an image
    preloaded (pinned) on agent-1 and spread to agent-2 by a prepull policy."""
    p = page.page
    held, unknown = web.stack.next_medium_image(), "test/never-held:1"  # 240 MiB, said below

    async def preload_then_policy() -> None:
        await hoist_admin(web, "image", "preload", held, "--agent", "agent-1")
        await hoist_admin(web, "image", "policy", "set", "web-pol", "--images", f"{held},{unknown}")

    spreading = asyncio.create_task(preload_then_policy())

    def create(owner: str, image: str, **more: Any) -> Any:
        return ask(client, SESSION_CREATE, {"owner": owner, "image": image, **more})

    # A group with no agent: defined (an admin's, open to all), so the create is accepted and
    # waits; a group nobody defined or joined would be refused as misspelt.
    await hoist_admin(web, "group", "set", "nowhere", "--public")
    gpu, failed, elsewhere = await asyncio.gather(
        create("gil", web.stack.next_image(), resources={**CPU_MEM, "gpu": 1}, max_wait=30),
        create("fay", "test/missing:1", resources=CPU_MEM, max_wait=30),
        create("gus", web.stack.next_image(), resources=CPU_MEM, resource_group="nowhere"),
    )
    assert gpu.get("status") == "RUNNING", gpu
    assert failed.get("status") in ("CANCELLED", "ERROR"), failed
    pulling = await create("pia", web.stack.next_big_image(), resources=CPU_MEM)  # ~10 s

    # While pia's kernel pulls: by owner it is not charged (shown apart), by agent it is.
    owner_row = "#occupancy table[data-occupancy='owner'] tr[data-key='pia']"
    await p.wait_for_selector(f"{owner_row} >> text=1 kernel(s)", timeout=10_000)
    cells = await p.locator(f"{owner_row} td").all_inner_texts()
    assert cells[:2] == ["pia", "0"], cells  # no kernel charged to pia's quota
    view = await ask(client, SESSION_GET, {"session_id": pulling["session_id"]})
    (pull_agent,) = {k["agent_id"] for k in view["kernels"]}
    agent_cells = await p.locator(
        f"#occupancy table[data-occupancy='agent'] tr[data-key='{pull_agent}'] td"
    ).all_inner_texts()
    assert int(agent_cells[1]) >= 1 and "1 kernel(s)" in agent_cells[4], agent_cells
    # The status filter: only what is PULLING now.
    await p.select_option("select[data-filter='status']", "PULLING")
    await p.wait_for_selector(f"#sessions tr[data-session='{gpu['session_id']}']", state="detached")
    shown = p.locator("#sessions tr[data-session]")
    assert await p.locator(f"#sessions tr[data-session='{pulling['session_id']}']").count() == 1
    statuses = await p.locator("#sessions tr[data-session] > td:nth-child(6)").all_inner_texts()
    assert set(statuses) == {"PULLING"}, statuses
    await p.select_option("select[data-filter='status']", "")
    # The resource-group filter: the group with no agent holds gus's session alone.
    await p.select_option("select[data-filter='group']", "nowhere")
    await p.wait_for_selector(f"#sessions tr[data-session='{gpu['session_id']}']", state="detached")
    ids = await shown.evaluate_all("rows => rows.map(r => r.dataset.session)")
    assert ids == [elsewhere["session_id"]], ids
    await p.select_option("select[data-filter='group']", "")

    # The fleet: cpu, mem and disk bars on every card; gil's gpu holds 1 of its agent's 2.
    (gpu_agent,) = {k["agent_id"] for k in gpu["kernels"]}
    card = f"#fleet .card[data-agent='{gpu_agent}']"
    await p.wait_for_selector(f"{card} .row[data-slot='gpu'] .bar[aria-valuenow='50']")
    assert "1 free" in await p.inner_text(f"{card} .row[data-slot='gpu']")
    assert page.errors == []  # a stylesheet that failed to load would be named here
    for agent in ("agent-1", "agent-2"):
        rows = p.locator(f"#fleet .card[data-agent='{agent}'] .row")
        labels = await rows.locator(".label").all_text_contents()
        assert labels == ["cpu", "mem", "disk", "gpu"], labels
        # Laid out as a label, a bar and what is free (the stylesheet applies).
        assert await rows.first.evaluate("r => getComputedStyle(r).display") == "grid"
    used = await p.locator(f"{card} .row").first.locator(".bar").get_attribute("aria-valuenow")
    assert int(used or 0) > 0  # gil's kernel holds a cpu there

    # Images: held's size, preloaded and pinned on agent-1, preloaded only where the policy
    # pulled it (agent-2); the image gil's kernel uses says so inside its card.
    await spreading
    one = f"#fleet .card[data-agent='agent-1'] tr[data-image$='{held}']"
    two = f"#fleet .card[data-agent='agent-2'] tr[data-image$='{held}']"
    await p.wait_for_selector(f"{two} .mark", timeout=20_000)
    assert await p.locator(f"{one} .mark").all_inner_texts() == ["preloaded", "pinned"]
    assert await p.locator(f"{two} .mark").all_inner_texts() == ["preloaded"]
    assert "240.0 MiB" in await p.inner_text(one)
    using = p.locator(f"{card} tr[data-image$='{gpu['image']}'] td.using")
    assert await using.inner_text() == "1 using"
    card_box, using_box = await p.locator(card).bounding_box(), await using.bounding_box()
    assert card_box and using_box
    assert using_box["x"] + using_box["width"] <= card_box["x"] + card_box["width"]

    # Pulls: the failed one with its reason; held's with its bytes and duration.
    pulls = await p.inner_text("#pulls")
    failed_row = p.locator("#pulls tr", has_text="test/missing:1").first
    cells = await failed_row.locator("td").all_inner_texts()
    assert cells[2] == "failed" and cells[3], cells
    held_row = p.locator("#pulls tr", has_text=held).first
    cells = await held_row.locator("td").all_inner_texts()
    assert cells[2] == "pulled" and cells[4] == "240.0 MiB" and cells[5].endswith(" s"), pulls

    # The policy, and each agent's plan: held wanted everywhere, the unknown image skipped.
    await p.wait_for_selector("#policies tr[data-policy='web-pol']")
    for agent in ("agent-1", "agent-2"):
        plan = await p.locator(f"#policies tr[data-plan='{agent}'] td").all_inner_texts()
        assert held in plan[1] and unknown in plan[3] and "size unknown" in plan[3], plan
    assert page.errors == []
