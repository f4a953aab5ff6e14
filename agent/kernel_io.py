"""A kernel's output and volumes: logs, exec, stream-read, volumes, volume-remove."""

from __future__ import annotations

import contextlib

from agent.kernels import Kernels, check_id
from agent.runtime.base import (
    ExecRun,
    KernelContainer,
    KernelCreateError,
    KernelNotFound,
    VolumeInUse,
)
from agent.streams import Streams
from agent.volume_names import VolumeNames
from domain import rpc


class KernelIo:
    def __init__(self, kernels: Kernels, streams: Streams, volume_names: VolumeNames) -> None:
        self.kernels = kernels
        self.runtime = kernels.runtime
        self.streams = streams
        self.volume_names = volume_names

    async def _live(self, kernel_id: str) -> KernelContainer:
        check_id(kernel_id, "kernel_id")
        k = await self.kernels.container(kernel_id)
        if k is None:
            raise rpc.RequestError(
                "not-found",
                f"agent {self.kernels.agent_id} has no container for kernel {kernel_id}",
            )
        return k

    async def logs(self, request: rpc.Logs) -> rpc.StreamOpened:
        # A kernel without a container is refused here, on every runtime: the docker runtime's
        # logs is an async generator, which raises KernelNotFound only at its first read (in
        # the stream, too late for a refusal).
        k = await self._live(request.kernel_id)
        try:
            output = self.runtime.logs(request.kernel_id, request.tail, request.follow)
        except KernelNotFound as e:  # removed since (a runtime that checks at once)
            raise rpc.RequestError("not-found", str(e)) from None
        try:
            stream = self.streams.logs(output, k.session_id)  # counts against its session
        except rpc.RequestError:
            aclose = getattr(output, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            raise
        return rpc.StreamOpened(stream_id=stream.id, idle_s=self.streams.idle_s)

    async def exec(self, request: rpc.Exec) -> rpc.StreamOpened:
        k = await self._live(request.kernel_id)
        if k.exit is not None:
            raise rpc.RequestError(
                "conflict",
                f"kernel {k.kernel_id} has ended (exit code {k.exit.exit_code}): exec needs it"
                " running (its logs stay readable until its container is removed)",
            )
        if not k.running:
            raise rpc.RequestError(
                "conflict",
                f"kernel {k.kernel_id}'s container is not running (never started, or paused):"
                " exec needs it running",
            )

        async def start() -> ExecRun:
            try:
                return await self.runtime.exec(
                    request.kernel_id, request.command, request.env, request.workdir
                )
            except KernelNotFound as e:
                raise rpc.RequestError("not-found", str(e)) from None
            except KernelCreateError as e:
                raise rpc.RequestError("conflict", f"exec failed: {e.reason}") from None

        stream = await self.streams.exec(start, request.timeout, k.session_id)
        return rpc.StreamOpened(stream_id=stream.id, idle_s=self.streams.idle_s)

    async def stream_read(self, request: rpc.StreamRead) -> rpc.StreamChunk:
        stream = self.streams.get(request.stream_id)
        return await stream.read(request.cursor, request.wait, request.max_bytes)

    async def volumes(self, request: rpc.ListVolumes) -> rpc.VolumesListed:
        held = await self.runtime.list_volumes()
        self.volume_names.listed([v.name for v in held])
        return rpc.VolumesListed(
            volumes=[
                rpc.VolumeInfo(name=v.name, owner=v.owner, used_by=list(v.used_by))
                for v in sorted(held, key=lambda v: v.name)
                if request.owner is None or v.owner == request.owner
            ]
        )

    async def volume_remove(self, request: rpc.RemoveVolume) -> rpc.VolumeRemoved:
        found = [v for v in await self.runtime.list_volumes() if v.name == request.name]
        if not found:
            return rpc.VolumeRemoved(removed=False)
        if request.owner is not None and found[0].owner != request.owner:
            raise rpc.RequestError("conflict", f"volume {request.name} belongs to another owner")
        self.volume_names.changed()
        try:
            removed = await self.runtime.remove_volume(request.name)
        except VolumeInUse as e:
            raise rpc.RequestError("conflict", str(e)) from None
        return rpc.VolumeRemoved(removed=removed)
