"""Calling an agent: request/reply on ``hoist.agent.<id>.<verb>`` with the domain.rpc payloads.

Two outcomes besides a reply, which callers treat differently: AgentUnreachable (no answer:
nothing is known, ask again later) and AgentRefused (the agent answered with an error reply
and changed nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from domain import rpc
from domain.subjects import agent_rpc
from services.transport.client import Client


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

    async def call(
        self, agent_id: str, verb: str, request: object, *, wait_s: float | None = None
    ) -> Any:
        timeout = wait_s if wait_s is not None else self.timeouts.get(verb, 10)
        try:
            msg = await self.nc.request(
                agent_rpc(agent_id, verb), rpc.encode(request), timeout=timeout
            )
        except (NoRespondersError, NatsTimeoutError, TimeoutError) as e:
            raise AgentUnreachable(f"agent {agent_id} {verb}: {type(e).__name__}") from None
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
