"""Calling an agent: request/reply on ``hoist.agent.<id>.<verb>`` with the domain.rpc payloads.

Two outcomes besides a reply, which callers treat differently: AgentUnreachable (no answer:
nothing is known, ask again later) and AgentRefused (the agent answered with an error reply
and changed nothing).  A call in flight to an agent that restarts or is declared lost ends
at once as AgentUnreachable (``agent_gone``): the process it asked is gone, and its answer would
never come before the call's timeout (a minute for a create).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from domain import rpc
from domain.subjects import agent_rpc
from transport.client import Client


class AgentUnreachable(Exception):
    """No reply (agent down, restarting, slow): nothing is known, ask again later."""


class AgentRefused(Exception):
    """The agent answered with an error reply: it changed nothing."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


AgentCallFailed = (AgentUnreachable, AgentRefused)


class AgentRpc:
    def __init__(self, nc: Client, timeouts: dict[str, float] | None = None) -> None:
        self.nc = nc
        self.timeouts = {
            rpc.CHECK_AND_PULL: 15.0,  # the agent waits up to 10 s for ImagePullStarted
            rpc.CREATE_KERNEL: 60.0,
            rpc.DESTROY_KERNEL: 30.0,
            rpc.PULL_STATUS: 5.0,
            **(timeouts or {}),
        }
        # agent id -> a future per call in flight to it, given a reason when the agent is gone
        self._gone: defaultdict[str, set[asyncio.Future[str]]] = defaultdict(set)

    def agent_gone(self, agent_id: str, why: str) -> None:
        """End every call in flight to ``agent_id``: its process restarted or was lost."""
        for gone in self._gone.pop(agent_id, ()):
            if not gone.done():
                gone.set_result(why)

    async def call(
        self, agent_id: str, verb: str, request: object, *, wait_s: float | None = None
    ) -> Any:
        timeout = wait_s if wait_s is not None else self.timeouts.get(verb, 10)
        gone: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._gone[agent_id].add(gone)
        asking = asyncio.ensure_future(
            self.nc.request(agent_rpc(agent_id, verb), rpc.encode(request), timeout=timeout)
        )
        try:
            either: set[asyncio.Future[Any]] = {asking, gone}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not asking.done():
                raise AgentUnreachable(f"agent {agent_id} {verb}: {gone.result()}")
            msg = asking.result()
        except (NoRespondersError, NatsTimeoutError, TimeoutError) as e:
            raise AgentUnreachable(f"agent {agent_id} {verb}: {type(e).__name__}") from None
        finally:
            asking.cancel()  # done already, or no longer wanted
            if (calls := self._gone.get(agent_id)) is not None:
                calls.discard(gone)
                if not calls:
                    del self._gone[agent_id]
        reply = msgspec.json.decode(msg.data)
        if isinstance(reply, dict) and isinstance(reply.get("error"), dict):
            error = reply["error"]
            raise AgentRefused(str(error.get("code")), str(error.get("message")))
        return reply

    async def check_image(
        self, agent_id: str, image: str, kernel_ids: Sequence[str] = ()
    ) -> str | None:
        """check-and-pull of one image for ``kernel_ids`` (they wait for its pull): the
        background pull's task id, or None when the agent holds the image (AgentRefused also
        for an answer without the image)."""
        request = rpc.CheckAndPull(images=[image], kernel_ids=list(kernel_ids))
        reply = await self.call(agent_id, rpc.CHECK_AND_PULL, request)
        try:
            answer = reply[image]
            return answer.get("task_id") or None
        except (KeyError, TypeError, AttributeError):
            raise AgentRefused("bad-reply", f"no answer for {image!r}") from None
