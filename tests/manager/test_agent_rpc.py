"""A call in flight to an agent whose process is gone ends at once, not at its timeout."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.msg import Msg

from domain import rpc
from domain.subjects import agent_rpc
from services.manager.agent_rpc import AgentRpc, AgentUnreachable
from transport.client import Client


async def test_a_call_to_an_agent_gone_ends_at_once_with_the_reason(nc: Client) -> None:
    heard: list[Msg] = []
    both_asked = asyncio.Event()

    async def never_answers(msg: Msg) -> None:  # the agent's process died mid-create
        heard.append(msg)
        if len(heard) == 2:
            both_asked.set()

    await nc.subscribe(agent_rpc("a1", rpc.CREATE_KERNEL), cb=never_answers)
    await nc.subscribe(agent_rpc("a2", rpc.CREATE_KERNEL), cb=never_answers)
    await nc.flush()
    calls = AgentRpc(nc)
    request = rpc.CheckAndPull(images=["img:1"])  # any payload: nobody answers
    first = asyncio.ensure_future(calls.call("a1", rpc.CREATE_KERNEL, request))
    other = asyncio.ensure_future(calls.call("a2", rpc.CREATE_KERNEL, request))
    await asyncio.wait_for(both_asked.wait(), 5)
    calls.agent_gone("a1", "the agent restarted during the call")
    with pytest.raises(AgentUnreachable, match="a1 create-kernel: the agent restarted"):
        await asyncio.wait_for(first, 5)  # not the call's 60 s
    assert not other.done()  # another agent's call goes on
    other.cancel()
    with pytest.raises(asyncio.CancelledError):
        await other
    assert not calls._gone  # nothing kept for calls that ended
