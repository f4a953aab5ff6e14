"""The web view's HTTP side (Starlette): one static page, its server-sent events, and a few JSON
calls, each a documented NATS request made for whoever is logged in.

Access (``Access``): the token `hoist up` prints (``?token=`` once, then an HttpOnly cookie; or
``Authorization: Bearer``), which acts as the stack's admin role like the person who ran
`hoist up`; or a Hoist user's NATS name and password (HTTP Basic, what `hoist creds user NAME`
holds), which acts as that user on their own subjects: the manager decides what they may see
and destroy, exactly as for their CLI.  Anything else is 401.  Tokens are compared in constant
time.  The one write, destroy, is a POST that must carry ``X-Hoist-Request`` (a header a
cross-site form cannot send) besides the SameSite=Strict cookie.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from client import session_log
from client.connection import CliError, Connection, ReplyError
from client.events import describe
from domain import subjects
from domain.errors import unknown_session
from domain.subjects import SESSION_DESTROY, SESSION_LOGS
from domain.user import check_name
from services.web.hub import Hub

log = logging.getLogger(__name__)

COOKIE = "hoist_web_token"
MAX_STREAMS = 32  # open /events streams per principal (the next ones get 429)
KEEPALIVE_S = 15.0  # an SSE comment this often keeps proxies from closing an idle stream
LOGS_MAX_BYTES = 256 * 1024
LOGS_WAIT_S = 3.0
_HEADERS = {
    # The page loads only its own script and style; nothing may frame it.
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class Principal:
    hub: Hub
    streams: int = 0  # its /events streams open now (at most MAX_STREAMS)

    @property
    def conn(self) -> Connection:
        return self.hub.conn


@dataclass
class Access:
    """Who may use the view: the token's admin connection, and Hoist users by their NATS
    password (a connection each, opened on their first request and kept)."""

    token: str
    admin: Connection
    nats_url: str  # the server's, for users' connections (its credentials are not used)
    users: dict[tuple[str, str], Principal] = field(default_factory=dict)
    _admin: Principal | None = None
    _opening: asyncio.Lock = field(default_factory=asyncio.Lock)

    def admin_principal(self) -> Principal:
        if self._admin is None:
            self._admin = Principal(Hub(self.admin, "admin (token)", role=True))
        return self._admin

    def token_ok(self, offered: str | None) -> bool:
        return (
            offered is not None
            and offered != ""
            and hmac.compare_digest(
                offered.encode(),
                self.token.encode(),
            )
        )

    async def principal(self, request: Request) -> Principal | None:
        auth = request.headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer":
            return self.admin_principal() if self.token_ok(value.strip()) else None
        if scheme.lower() == "basic":
            return await self._user(value.strip())
        if self.token_ok(request.cookies.get(COOKIE)):
            return self.admin_principal()
        return None

    async def _user(self, encoded: str) -> Principal | None:
        try:
            name, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not name or not password:
            return None
        try:
            check_name(name)  # what `hoist user add` takes: a subject token, no role's name
        except ValueError:
            return None  # no Hoist user has it: no connection is tried
        key = (name, hashlib.sha256(password.encode()).hexdigest())
        async with self._opening:
            known = self.users.get(key)
            if known is not None and not known.conn.nc.is_closed:
                return known
            parts = urlsplit(self.nats_url)
            host = parts.netloc.rpartition("@")[2]
            netloc = f"{quote(name, safe='')}:{quote(password, safe='')}@{host}"
            url = urlunsplit((parts.scheme, netloc, "", "", ""))
            try:
                conn = await Connection.open(url, name=f"hoist-web-{name}")
            except (CliError, ValueError):
                return None  # the server refused the name and password
            if conn.user is None:  # a role's NATS user, not a Hoist user's: not this door
                await conn.close()
                return None
            principal = Principal(Hub(conn, name, role=False))
            self.users[key] = principal
            return principal

    async def close(self) -> None:
        for principal in self.users.values():
            await principal.conn.close()


def static(name: str) -> bytes:
    return resources.files("services.web").joinpath("static", name).read_bytes()


def make_app(access: Access) -> Starlette:
    def guarded(
        handler: Callable[[Request, Principal], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            offered = request.query_params.get("token")
            if offered is not None:
                if not access.token_ok(offered):
                    return _unauthorized(challenge=False)  # a login prompt fixes no token
                # Once: the token goes into a cookie and out of the address bar and history.
                # A relative Location: nothing of the Host header the client sent.
                target = request.url.remove_query_params("token")
                location = "/" + quote(target.path.lstrip("/"), safe="/")  # never //host
                if target.query:
                    location += f"?{target.query}"
                redirect = RedirectResponse(location, status_code=303)
                redirect.set_cookie(
                    COOKIE, offered, httponly=True, samesite="strict", path="/", secure=False
                )
                return redirect
            principal = await access.principal(request)
            if principal is None:
                return _unauthorized()
            response = await handler(request, principal)
            response.headers.update(_HEADERS)
            return response

        return endpoint

    async def page(request: Request, _p: Principal) -> Response:
        return Response(static("index.html"), media_type="text/html; charset=utf-8")

    async def asset(request: Request, _p: Principal) -> Response:
        name = request.path_params["name"]
        types = {"app.js": "text/javascript", "app.css": "text/css"}
        if name not in types:
            return PlainTextResponse("not found", status_code=404)
        return Response(static(name), media_type=f"{types[name]}; charset=utf-8")

    async def events(request: Request, p: Principal) -> Response:
        if p.streams >= MAX_STREAMS:
            return JSONResponse(
                {"error": f"too many open event streams: at most {MAX_STREAMS} per login"},
                status_code=429,
            )
        p.streams += 1  # counted from here, so a burst of requests cannot pass the check

        async def stream() -> AsyncIterator[bytes]:
            updates = p.hub.watch().__aiter__()
            next_update: asyncio.Task[dict[str, Any]] | None = None
            try:
                while True:
                    if next_update is None:
                        next_update = asyncio.ensure_future(updates.__anext__())
                    done, _ = await asyncio.wait({next_update}, timeout=KEEPALIVE_S)
                    if not done:
                        yield b": keepalive\n\n"
                        continue
                    try:
                        message = next_update.result()
                    except StopAsyncIteration:
                        return  # the hub ended it (the login's access ended)
                    next_update = None
                    yield f"data: {json.dumps(message, default=str)}\n\n".encode()
            finally:
                if next_update is not None:
                    next_update.cancel()
                with contextlib.suppress(Exception):
                    await updates.aclose()  # type: ignore[attr-defined]

        return _Counted(p, stream(), media_type="text/event-stream")

    async def history(request: Request, p: Principal) -> Response:
        sid = request.path_params["session_id"]
        try:
            subjects.check_token(sid, "session_id")
            after = _whole_number(request.query_params.get("after", "0"), "after")
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        rows: list[dict[str, Any]] = []
        known = False
        try:
            async with asyncio.timeout(10):
                async for rec in session_log.records(p.conn, sid):
                    known = True
                    if rec.seq > after:
                        rows.append(describe(rec))
        except ReplyError as e:
            return _refused(e)
        except (CliError, TimeoutError) as e:
            return JSONResponse({"error": str(e) or "timed out"}, status_code=502)
        if not known:  # no event at all: no such session (the log itself, for the token)
            return _refused(ReplyError("not-found", f"session_id: {unknown_session(sid)}"))
        body = json.dumps({"events": rows}, default=str)  # times, and whatever a payload holds
        return Response(body, media_type="application/json")

    async def logs(request: Request, p: Principal) -> Response:
        sid = request.path_params["session_id"]
        try:
            subjects.check_token(sid, "session_id")
            opened = await p.conn.request(SESSION_LOGS, {"session_id": sid, "tail": 500})
            text = await _read_all(p.conn, opened)
        except ReplyError as e:
            return _refused(e)
        except (CliError, ValueError) as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return JSONResponse({"logs": text})

    async def destroy(request: Request, p: Principal) -> Response:
        if request.headers.get("x-hoist-request") != "destroy":
            return JSONResponse({"error": "missing X-Hoist-Request: destroy"}, status_code=400)
        sid = request.path_params["session_id"]
        try:
            subjects.check_token(sid, "session_id")
            view = await p.conn.request(SESSION_DESTROY, {"session_id": sid})
        except ReplyError as e:
            return _refused(e)
        except (CliError, ValueError) as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        p.hub.poke()
        return JSONResponse(view)

    async def no_icon(request: Request) -> Response:
        return Response(status_code=204)  # no favicon: a 404 would be a console error

    app = Starlette(
        routes=[
            Route("/favicon.ico", no_icon),
            Route("/", guarded(page)),
            Route("/static/{name}", guarded(asset)),
            Route("/events", guarded(events)),
            Route("/api/sessions/{session_id}/history", guarded(history)),
            Route("/api/sessions/{session_id}/logs", guarded(logs)),
            Route("/api/sessions/{session_id}/destroy", guarded(destroy), methods=["POST"]),
        ]
    )
    return app


class _Counted(StreamingResponse):
    """An events stream that gives its principal's count back when it ends, however it ends
    (even before its first byte)."""

    def __init__(self, principal: Principal, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.principal = principal

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.principal.streams -= 1


# The manager's error codes as HTTP statuses; an unknown session (or another user's, which
# the manager reports the same) is 404 for every call.
_STATUS = {"not-found": 404, "forbidden": 403, "invalid-request": 400}


def _refused(e: ReplyError) -> Response:
    status = _STATUS.get(e.code, 409)
    return JSONResponse({"error": e.message, "code": e.code}, status_code=status)


def _whole_number(value: str, name: str) -> int:
    """A query parameter that must be a whole number >= 0; ValueError naming it if not."""
    if not value.isascii() or not value.isdigit() or len(value) > 19:
        raise ValueError(f"{name}: a whole number of at least 0 is needed, got {value[:40]!r}")
    return int(value)


def _unauthorized(challenge: bool = True) -> Response:
    """401; ``challenge``: ask the browser for a Hoist user's name and password (Basic)."""
    headers = dict(_HEADERS)
    if challenge:
        headers["WWW-Authenticate"] = 'Basic realm="hoist", charset="UTF-8"'
    return PlainTextResponse(
        "401 unauthorized: open the URL `hoist up` printed (it carries ?token=...), or log in"
        " as a Hoist user with the name and password of `hoist creds user NAME`\n",
        status_code=401,
        headers=headers,
    )


async def _read_all(conn: Connection, opened: dict[str, Any]) -> str:
    """A kernel's output so far (at most LOGS_MAX_BYTES), read off the stream it opened."""
    out = bytearray()
    cursor = 0
    async with asyncio.timeout(LOGS_WAIT_S * 4):
        while len(out) < LOGS_MAX_BYTES:
            chunk = await conn.request(
                subjects.STREAM_READ,
                {
                    "agent_id": opened["agent_id"],
                    "stream_id": opened["stream_id"],
                    "cursor": cursor,
                    "wait": 0.5,
                },
                wait_s=LOGS_WAIT_S + 5,
            )
            data = base64.b64decode(chunk.get("data") or "")
            out += data
            cursor = chunk["cursor"]
            if chunk.get("done") or not data:
                break
    return out[:LOGS_MAX_BYTES].decode(errors="replace")
