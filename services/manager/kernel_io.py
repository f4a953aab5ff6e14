"""A kernel's output and commands, and the agents' named volumes: ``hoist.api.session.logs``,
``.exec``, ``hoist.api.stream.read``, ``hoist.api.volume.list`` and ``.remove``
(domain.contracts.sessions says what each takes and answers).

Clients never talk to agents: the manager checks the session and kernel, asks the kernel's
agent to open a stream of output (``logs``, ``exec``), and relays each read of it.  The reader
sets the pace (each read asks for the bytes after its cursor), so a slow reader costs the
agent nothing but its bounded buffer (the agent says how many bytes a reader fell behind).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from domain import rpc
from domain.contracts.sessions import (
    ListVolumes,
    ReadStream,
    RemoveVolume,
    SessionExec,
    SessionLogs,
    StreamOpened,
    VolumeRemoval,
    VolumesView,
    VolumeView,
)
from domain.errors import unknown_session
from domain.rpc import RequestError
from domain.session import CLUSTER_ENV_PREFIX, Session
from domain.status import Kernel, KernelStatus
from services.manager.agent_rpc import AgentRefused, AgentRpc, AgentUnreachable
from services.manager.fleet import Fleet

S = KernelStatus
# A stream read waits up to 30 s on the agent: the relay waits that long and a bit more.
_READ_MARGIN_S = 5.0


class KernelIO:
    def __init__(self, fleet: Fleet, agents: AgentRpc) -> None:
        self.fleet = fleet
        self.agents = agents

    async def logs(self, req: SessionLogs) -> StreamOpened:
        session = await self._session(req.session_id)
        kernel = _kernel(session, req.kernel_id)
        if kernel.container_id is None or kernel.agent_id is None:
            raise RequestError(
                "not-found",
                f"kernel_id: kernel {kernel.kernel_id} is {kernel.status} ({kernel.status_info})"
                " and never had a container: it has no logs",
            )
        request = rpc.Logs(kernel_id=kernel.kernel_id, tail=req.tail, follow=req.follow)
        return await self._open(session, kernel, rpc.LOGS, request)

    async def exec(self, req: SessionExec) -> StreamOpened:
        if reserved := sorted(k for k in req.env if k.startswith(CLUSTER_ENV_PREFIX)):
            raise RequestError(
                "invalid-request",
                f"env: {', '.join(reserved)}: names starting {CLUSTER_ENV_PREFIX} are Hoist's own",
            )
        session = await self._session(req.session_id)
        kernel = _kernel(session, req.kernel_id)
        if kernel.status is not S.RUNNING or kernel.agent_id is None:
            raise RequestError(
                "conflict",
                f"kernel_id: kernel {kernel.kernel_id} is {kernel.status} ({kernel.status_info});"
                " exec needs a RUNNING kernel",
            )
        request = rpc.Exec(
            kernel_id=kernel.kernel_id,
            command=req.command,
            env=req.env,
            workdir=req.workdir,
            timeout=req.timeout,
        )
        return await self._open(session, kernel, rpc.EXEC, request)

    async def read(self, req: ReadStream) -> rpc.StreamChunk:
        if req.agent_id not in self.fleet.agents:
            raise RequestError("not-found", f"agent_id: no agent {req.agent_id!r}")
        request = rpc.StreamRead(
            stream_id=req.stream_id, cursor=req.cursor, wait=req.wait, max_bytes=req.max_bytes
        )
        reply = await self._call(
            req.agent_id, rpc.STREAM_READ, request, wait_s=req.wait + _READ_MARGIN_S
        )
        return msgspec.convert(reply, rpc.StreamChunk)

    async def list_volumes(self, req: ListVolumes) -> VolumesView:
        live = [a for a, state in self.fleet.agents.items() if state.live]

        async def volumes_of(agent_id: str) -> tuple[str, Any]:
            try:
                reply = await self.agents.call(
                    agent_id, rpc.VOLUMES, rpc.ListVolumes(owner=req.owner)
                )
                return agent_id, msgspec.convert(reply, rpc.VolumesListed)
            except (AgentUnreachable, AgentRefused, msgspec.ValidationError) as e:
                return agent_id, e

        volumes, unreachable = [], []
        for agent_id, result in await asyncio.gather(*(volumes_of(a) for a in live)):
            if isinstance(result, Exception):
                unreachable.append(agent_id)
                continue
            volumes += [
                VolumeView(agent_id=agent_id, name=v.name, owner=v.owner, used_by=v.used_by)
                for v in result.volumes
            ]
        volumes.sort(key=lambda v: (v.name, v.agent_id))
        return VolumesView(volumes=volumes, unreachable=sorted(unreachable))

    async def remove_volume(self, req: RemoveVolume) -> VolumeRemoval:
        if req.agent_id is not None:
            if req.agent_id not in self.fleet.agents:
                raise RequestError("not-found", f"agent_id: no agent {req.agent_id!r}")
            agents = [req.agent_id]
        else:
            agents = [a for a, state in self.fleet.agents.items() if state.live]
        request = rpc.RemoveVolume(name=req.name, owner=req.owner)

        async def remove_on(agent_id: str) -> tuple[str, bool | str]:
            try:
                reply = await self.agents.call(agent_id, rpc.VOLUME_REMOVE, request)
                return agent_id, msgspec.convert(reply, rpc.VolumeRemoved).removed
            except AgentRefused as e:
                return agent_id, f"{e.code}: {e.message}"
            except (AgentUnreachable, msgspec.ValidationError) as e:
                return agent_id, f"unreachable: {e}"

        removed, refused = [], {}
        for agent_id, result in await asyncio.gather(*(remove_on(a) for a in agents)):
            if result is True:
                removed.append(agent_id)
            elif isinstance(result, str):
                refused[agent_id] = result
        if not removed and not refused:
            raise RequestError(
                "not-found", f"name: no volume {req.name!r} on any live agent; see hoist volumes"
            )
        return VolumeRemoval(removed=sorted(removed), refused=refused)

    # -- helpers -----------------------------------------------------------------------------

    async def _session(self, session_id: str) -> Session:
        session = await self.fleet.committed(session_id)
        if session is None:
            raise RequestError("not-found", f"session_id: {unknown_session(session_id)}")
        return session

    async def _open(
        self, session: Session, kernel: Kernel, verb: str, request: object
    ) -> StreamOpened:
        assert kernel.agent_id is not None
        reply = msgspec.convert(await self._call(kernel.agent_id, verb, request), rpc.StreamOpened)
        return StreamOpened(
            session_id=session.id,
            kernel_id=kernel.kernel_id,
            agent_id=kernel.agent_id,
            stream_id=reply.stream_id,
            idle_s=reply.idle_s,
        )

    async def _call(
        self, agent_id: str, verb: str, request: object, wait_s: float | None = None
    ) -> Any:
        try:
            return await self.agents.call(agent_id, verb, request, wait_s=wait_s)
        except AgentUnreachable as e:
            raise RequestError(
                "unavailable", f"{e}: the kernel's agent did not answer; try again"
            ) from None
        except AgentRefused as e:
            code = e.code if e.code in ("not-found", "conflict", "invalid-request") else "conflict"
            said = e.message if e.message.startswith(f"agent {agent_id}") else None
            raise RequestError(code, said or f"agent {agent_id}: {e.message}") from None


def _kernel(session: Session, kernel_id: str | None) -> Kernel:
    """The kernel asked for (by id, or by hostname such as ``sub1``), or the main one."""
    if kernel_id is None:
        return session.main_kernel
    if kernel_id in session.kernels:
        return session.kernels[kernel_id]
    for kid in session.kernels:
        if session.hostname(kid) == kernel_id:
            return session.kernels[kid]
    raise RequestError(
        "not-found",
        f"kernel_id: session {session.id} has no kernel {kernel_id!r}; its kernels:"
        f" {', '.join(f'{session.hostname(k)} ({k})' for k in session.kernels)}",
    )
