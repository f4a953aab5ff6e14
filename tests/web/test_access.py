"""Who may use the web view, over plain HTTP against a real stack: the token (once in the query,
then a cookie; or a bearer header), a Hoist user's NATS name and password (who then sees and
destroys only what the manager lets them), and nobody else; the page's headers."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

from domain.subjects import SESSION_CREATE, SESSION_GET
from services.web.hub import MIN_INTERVAL_S, USER_REFRESH_S
from tests.cli.stack_harness import HOIST
from tests.web.conftest import Web, add_user, ask
from transport import progress
from transport.client import Client

CPU_MEM = {"cpu": 1, "mem": 256 * 1024**2}


async def first_message(http: httpx.AsyncClient, **kwargs: Any) -> dict[str, Any]:
    """The snapshot the events stream opens with."""
    async with http.stream("GET", "/events", **kwargs) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                return json.loads(line[len("data: ") :])  # type: ignore[no-any-return]
    raise AssertionError("no message")


async def next_message(lines: AsyncIterator[str], within_s: float) -> dict[str, Any]:
    """The next message of an events stream, within ``within_s`` seconds."""
    async with asyncio.timeout(within_s):
        async for line in lines:
            if line.startswith("data: "):
                return json.loads(line[len("data: ") :])  # type: ignore[no-any-return]
    raise AssertionError("the stream ended")


async def test_the_token_opens_the_view_and_nothing_else_does(web: Web) -> None:
    async with httpx.AsyncClient(base_url=web.url, timeout=10) as http:
        for path in ("/", "/events", "/static/app.js", "/api/sessions/x/history"):
            assert (await http.get(path)).status_code == 401, path
        assert (await http.get("/", params={"token": web.token + "x"})).status_code == 401
        assert (await http.get("/", headers={"Authorization": "Bearer nope"})).status_code == 401
        bad_basic = httpx.BasicAuth("nobody", "wrong")
        assert (await http.get("/", auth=bad_basic)).status_code == 401

        login = await http.get("/", params={"token": web.token, "x": "1"})
        # Relative: nothing taken from the Host header (which the client chose).
        assert login.status_code == 303 and login.headers["location"] == "/?x=1"
        forged = await http.get("/", params={"token": web.token}, headers={"Host": "evil.example"})
        assert forged.status_code == 303 and forged.headers["location"] == "/"
        cookie = login.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        page = await http.get("/")  # the cookie now
        assert page.status_code == 200 and "<title>Hoist</title>" in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        snapshot = await first_message(http)
        assert snapshot["kind"] == "snapshot" and snapshot["admin"] is True
        agents = {a["agent_id"] for a in snapshot["sections"]["agents"]["rows"]}
        assert agents == {"agent-1", "agent-2"}
    forged = {"hoist_web_token": "nope"}
    async with httpx.AsyncClient(base_url=web.url, timeout=10, cookies=forged) as http:
        assert (await http.get("/")).status_code == 401
    bearer = {"Authorization": f"Bearer {web.token}"}
    async with httpx.AsyncClient(base_url=web.url, timeout=10, headers=bearer) as http:
        assert (await http.get("/")).status_code == 200
        # The one write needs a header a cross-site form cannot send.
        refused = await http.post("/api/sessions/abc/destroy")
        assert refused.status_code == 400 and "X-Hoist-Request" in refused.json()["error"]
        unknown = await http.post(
            "/api/sessions/no-such-session/destroy", headers={"X-Hoist-Request": "destroy"}
        )
        assert unknown.status_code == 404, unknown.text
        # An unknown session is 404 for every call, as for destroy.
        for call in ("history", "logs"):
            answer = await http.get(f"/api/sessions/no-such-session/{call}")
            assert answer.status_code == 404, (call, answer.text)
            assert "unknown session no-such-session" in answer.json()["error"], answer.text
        # A bad query parameter: 400 naming it, never Python's own words.
        for after in ("abc", "-1", "1.5", ""):
            bad = await http.get("/api/sessions/no-such-session/history", params={"after": after})
            assert bad.status_code == 400, (after, bad.text)
            error = bad.json()["error"]
            assert error.startswith("after:") and "invalid literal" not in error, error
        bad_id = await http.get("/api/sessions/a.b/history")
        assert bad_id.status_code in (400, 404)
    assert urlsplit(web.url).hostname == "127.0.0.1"  # nothing served beyond this machine


async def test_a_hoist_user_sees_and_destroys_only_their_own(web: Web, client: Client) -> None:
    added = web.stack.hoist("user", "add", "ann", env={"HOIST_NATS_URL": web.stack.creds("admin")})
    assert added.returncode == 0, added.stderr
    nats = urlsplit(web.stack.hoist("creds", "user", "ann").stdout.strip())
    ann = httpx.BasicAuth(unquote(nats.username or ""), unquote(nats.password or ""))
    mine = await ask(
        client,
        SESSION_CREATE,
        {"owner": "ann", "image": web.stack.next_image(), "resources": CPU_MEM, "max_wait": 30},
    )
    theirs = await ask(
        client,
        SESSION_CREATE,
        {"owner": "ben", "image": web.stack.next_image(), "resources": CPU_MEM, "max_wait": 30},
    )
    async with httpx.AsyncClient(base_url=web.url, timeout=15, auth=ann) as http:
        assert (await http.get("/")).status_code == 200
        snapshot = await first_message(http)
        assert snapshot["who"] == "ann" and snapshot["admin"] is False
        owners = {s["owner"] for s in snapshot["sections"]["sessions"]["rows"]}
        assert owners == {"ann"}
        assert "admin_only" in snapshot["sections"]["plans"]  # an admin's, said as such
        history = await http.get(f"/api/sessions/{mine['session_id']}/history")
        assert "SessionEnqueued" in {e["type"] for e in history.json()["events"]}
        # Another user's session is unknown to them, as one that never was: 404 either way.
        other = await http.get(f"/api/sessions/{theirs['session_id']}/history")
        assert other.status_code == 404 and "unknown session" in other.json()["error"]
        never = await http.get("/api/sessions/no-such-session/history")
        assert never.status_code == 404 and never.json()["error"] == other.json()["error"].replace(
            theirs["session_id"], "no-such-session"
        )
        other_logs = await http.get(f"/api/sessions/{theirs['session_id']}/logs")
        assert other_logs.status_code == 404, other_logs.text
        destroy = {"X-Hoist-Request": "destroy"}
        refused = await http.post(f"/api/sessions/{theirs['session_id']}/destroy", headers=destroy)
        assert refused.status_code in (403, 404), refused.text
        done = await http.post(f"/api/sessions/{mine['session_id']}/destroy", headers=destroy)
        assert done.status_code == 200 and done.json()["session_id"] == mine["session_id"]
    wrong = httpx.BasicAuth("ann", "not-her-password")
    async with httpx.AsyncClient(base_url=web.url, timeout=10, auth=wrong) as http:
        assert (await http.get("/")).status_code == 401


async def test_a_plain_users_view_is_refreshed_at_once_and_says_what_is_for_admins(
    web: Web, client: Client
) -> None:
    """A plain user's hub asks only the queries the user may make: no section carries an error
    (nor another query's permission violation), the fleet-wide ones say they are for admins,
    and a new session of theirs arrives within a refresh, not after a query's timeout."""
    pat = httpx.BasicAuth(*add_user(web, "pat"))
    async with (
        httpx.AsyncClient(base_url=web.url, timeout=15, auth=pat) as http,
        http.stream("GET", "/events") as events,
    ):
        assert events.status_code == 200
        lines = events.aiter_lines()
        snapshot = await next_message(lines, 10)
        assert snapshot["kind"] == "snapshot" and snapshot["admin"] is False
        sections = snapshot["sections"]
        assert {n for n, v in sections.items() if "error" in v} == set(), sections
        for name in ("agents", "images", "occupancy_agent", "pulls", "policies", "plans"):
            assert sections[name].get("admin_only"), (name, sections[name])
        assert sections["sessions"]["rows"] == []
        created = await ask(
            client,
            SESSION_CREATE,
            {"owner": "pat", "image": web.stack.next_image(), "resources": CPU_MEM},
        )
        started = time.monotonic()
        while True:
            message = await next_message(lines, 5)
            assert all("error" not in v for v in message.get("sections", {}).values()), message
            rows = message.get("sections", {}).get("sessions", {}).get("rows", [])
            if any(r["session_id"] == created["session_id"] for r in rows):
                break
        assert time.monotonic() - started < 2.5  # one refresh (1 s), not a 5 s query timeout


async def test_an_admin_users_view_is_an_admins(web: Web) -> None:
    """The manager serves an admin user the fleet: the view says it is an admin's (the page
    then offers Destroy on any session) and shows the fleet-wide sections."""
    ada = httpx.BasicAuth(*add_user(web, "ada", admin=True))
    async with httpx.AsyncClient(base_url=web.url, timeout=15, auth=ada) as http:
        snapshot = await first_message(http)
    assert snapshot["who"] == "ada" and snapshot["admin"] is True
    sections = snapshot["sections"]
    assert {n for n, v in sections.items() if "error" in v or "admin_only" in v} == set()
    assert {a["agent_id"] for a in sections["agents"]["rows"]} == {"agent-1", "agent-2"}
    assert "plans" in sections["plans"]


async def test_a_login_name_no_hoist_user_may_have_gets_401_without_a_traceback(
    web: Web,
) -> None:
    log = web.stack.data_dir / "logs" / "web.log"
    before = log.read_text(errors="replace")
    async with httpx.AsyncClient(base_url=web.url, timeout=10) as http:
        for name in ("ann@evil", "ann\x00", "ann.evil", "admin", ""):
            auth = base64.b64encode(f"{name}:some-password".encode()).decode()
            response = await http.get("/", headers={"Authorization": f"Basic {auth}"})
            assert response.status_code == 401, (name, response.text)
            assert response.headers["www-authenticate"].startswith("Basic")
    after = log.read_text(errors="replace")[len(before) :]
    assert "Traceback" not in after and "Exception" not in after, after


def test_hoist_web_serves_its_own_view_with_a_new_token(web: Web) -> None:
    proc = subprocess.Popen(
        [HOIST, "--data-dir", str(web.stack.data_dir), "web", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("web ready at http://127.0.0.1:"), line
        url = line.split(" at ", 1)[1].strip()
        token = url.split("?token=", 1)[1]
        assert token != web.token
        with httpx.Client(timeout=10) as http:
            assert http.get(url.split("?")[0]).status_code == 401
            assert http.get(url, follow_redirects=True).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


async def test_a_view_started_mid_pull_shows_where_the_pull_stands_at_once(
    web: Web, client: Client
) -> None:
    created = await ask(
        client,
        SESSION_CREATE,
        {"owner": "late", "image": web.stack.next_big_image(), "resources": CPU_MEM},
    )
    sid = created["session_id"]
    deadline = asyncio.get_running_loop().time() + 15
    while True:  # the pull is under way before the new view exists
        view = await ask(client, SESSION_GET, {"session_id": sid})
        if view["status"] == "PULLING":
            break
        assert asyncio.get_running_loop().time() < deadline, view
        await asyncio.sleep(0.2)
    while not await _pulled_some(client, view):  # and has bytes to show
        assert asyncio.get_running_loop().time() < deadline, view
        await asyncio.sleep(0.1)
    proc = await asyncio.create_subprocess_exec(
        HOIST, "--data-dir", str(web.stack.data_dir), "web", "--port", "0",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = (await proc.stdout.readline()).decode().split(" at ", 1)[1].strip()
        base, token = url.split("?token=")
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            snapshot = await first_message(http, headers={"Authorization": f"Bearer {token}"})
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
    tasks = {k["pull_task_id"] for k in view["kernels"]}
    pulls = [p for p in snapshot["progress"] if p["task_id"] in tasks]
    assert pulls, snapshot["progress"]  # the first message already has them: no empty bar
    assert all(p["current"] > 0 and p["total"] > 0 for p in pulls), pulls


async def _pulled_some(client: Client, view: dict[str, Any]) -> bool:
    """Whether the progress stream holds bytes pulled for each of the view's kernels."""
    for k in view["kernels"]:
        last = await progress.latest(client.jetstream(), k["agent_id"], k["pull_task_id"])
        if last is None or last.current <= 0:
            return False
    return True


async def test_a_kernels_output_comes_with_its_session(web: Web, client: Client) -> None:
    created = await ask(
        client,
        SESSION_CREATE,
        {"owner": "out", "image": web.stack.next_image(), "resources": CPU_MEM, "max_wait": 30,
         "command": ["echo", "<hello from the kernel>"], "session_type": "batch"},
    )  # fmt: skip
    bearer = {"Authorization": f"Bearer {web.token}"}
    async with httpx.AsyncClient(base_url=web.url, timeout=15, headers=bearer) as http:
        logs = await http.get(f"/api/sessions/{created['session_id']}/logs")
    assert logs.status_code == 200, logs.text
    assert "<hello from the kernel>" in logs.json()["logs"]


async def test_a_pull_that_ended_while_nobody_watched_is_not_shown_under_way(
    web: Web, client: Client
) -> None:
    """The only page leaves mid-pull (the hub stops following the progress) and comes back
    after the pull ended: the snapshot says it ended, nothing stays "in progress"."""
    bearer = {"Authorization": f"Bearer {web.token}"}
    created = await ask(
        client,
        SESSION_CREATE,
        {"owner": "gone", "image": web.stack.next_big_image(), "resources": CPU_MEM},
    )
    sid = created["session_id"]
    async with (
        httpx.AsyncClient(base_url=web.url, timeout=15, headers=bearer) as http,
        http.stream("GET", "/events") as events,
    ):
        lines = events.aiter_lines()
        await next_message(lines, 10)
        deadline = time.monotonic() + 20
        while True:  # the page has seen the pull under way
            view = await ask(client, SESSION_GET, {"session_id": sid})
            tasks = {k["pull_task_id"] for k in view["kernels"] if k.get("pull_task_id")}
            message = await next_message(lines, 5)
            seen = [p for p in message.get("progress", []) if p["task_id"] in tasks]
            if any(not p["done"] and p["current"] > 0 for p in seen):
                break
            assert time.monotonic() < deadline, view
    while True:  # nobody watches while it ends
        view = await ask(client, SESSION_GET, {"session_id": sid})
        if view["status"] not in ("PENDING", "SCHEDULED", "PREPARING", "PULLING"):
            break
        assert time.monotonic() < deadline + 30, view
        await asyncio.sleep(0.3)
    async with httpx.AsyncClient(base_url=web.url, timeout=15) as http:
        snapshot = await first_message(http, headers=bearer)
    pulls = [p for p in snapshot["progress"] if p["task_id"] in tasks]
    assert pulls and all(p["done"] for p in pulls), pulls


async def test_a_disabled_users_stream_says_their_access_ended_and_stops(web: Web) -> None:
    """`hoist user disable` closes the user's NATS connection: their open stream gets one
    message saying access ended, then ends (the page shows "signed out"), and they are
    refused afterwards; the web view stops asking queries for them."""
    carl = httpx.BasicAuth(*add_user(web, "carl"))
    log = web.stack.data_dir / "logs" / "web.log"
    async with (
        httpx.AsyncClient(base_url=web.url, timeout=15, auth=carl) as http,
        http.stream("GET", "/events") as events,
    ):
        lines = events.aiter_lines()
        assert (await next_message(lines, 10))["kind"] == "snapshot"
        disabled = web.stack.hoist(
            "user", "disable", "carl", env={"HOIST_NATS_URL": web.stack.creds("admin")}
        )
        assert disabled.returncode == 0, disabled.stderr
        while True:
            message = await next_message(lines, 15)
            if message["kind"] == "ended":
                break
        assert "carl" in message["reason"] and "disabled" in message["reason"], message
        with contextlib.suppress(StopAsyncIteration):  # and the stream ends
            async with asyncio.timeout(5):
                async for line in lines:
                    assert not line.startswith("data: "), line
        before = log.read_text(errors="replace")
        await asyncio.sleep(2 * USER_REFRESH_S + MIN_INTERVAL_S)  # two refreshes' time
        assert "query failed" not in log.read_text(errors="replace")[len(before) :]
        assert (await http.get("/")).status_code == 401
