"""What this agent's containers were given, against its capacity: CPU, memory, slots and
which GPUs each kernel holds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from agent.kernel_locks import KernelLocks
from agent.runtime.base import KernelContainer
from domain import events as ev
from domain import rpc
from domain.quota import fmt_mem

# A create that does not fit waits this long for other kernels' creates and destroys in flight
# (Room.wait_for), looking again every ROOM_POLL_S.
ROOM_WAIT_S = 5.0
ROOM_POLL_S = 0.02
# After the last create or destroy in flight ended, the manager's destroy of a kernel cancelled
# while its create ran is still on its way (it is sent once that create's reply is recorded).
ROOM_GRACE_S = 0.2


class Room:
    def __init__(self, agent_id: str, gpu_ids: Sequence[str], locks: KernelLocks) -> None:
        self.agent_id = agent_id
        self.gpu_ids = list(gpu_ids)
        self.locks = locks
        self.capacity: ev.Capacity | None = None  # measured at the agent's start
        self.reserved: dict[str, ev.Resources] = {}  # kernel id -> what its container was given
        # kernel id -> the GPUs (gpu_ids) its container was given: never two kernels one
        self.gpus: dict[str, tuple[str, ...]] = {}
        self._waiting: set[str] = set()  # creates in wait_for

    def recover(self, kernels: Sequence[KernelContainer]) -> None:
        """Containers that outlived a restart of this agent still hold what they were given
        (an ended one holds nothing: its process is gone)."""
        for k in kernels:
            if not k.running or k.exit is not None:
                continue
            if k.cpu and k.mem_bytes:
                self.reserved[k.kernel_id] = ev.Resources(
                    cpu=k.cpu, mem=k.mem_bytes, slots=dict(k.slots)
                )
            if k.gpu_ids:
                self.gpus[k.kernel_id] = tuple(k.gpu_ids)

    def free(self, disk_used: int = 0) -> rpc.FreeCapacity:
        assert self.capacity is not None, "the agent's start measures capacity first"
        reserved = self.reserved.values()
        return rpc.FreeCapacity(
            cpu=round(self.capacity.cpu - sum(r.cpu for r in reserved), 6),
            mem=self.capacity.mem - sum(r.mem for r in reserved),
            disk=max(0, self.capacity.disk - disk_used),
            slots={
                name: round(amount - sum(r.slots.get(name, 0.0) for r in reserved), 6)
                for name, amount in self.capacity.slots.items()
            },
        )

    async def wait_for(self, kernel_id: str, res: ev.Resources) -> None:
        """``check_fits``, waiting up to ROOM_WAIT_S while another kernel's create or destroy
        is in flight: a kernel cancelled while its create ran has its room free in the log
        already, and the manager's destroy of it follows the create here, so the kernel
        placed in that room next waits for it instead of failing for want of room."""
        deadline = time.monotonic() + ROOM_WAIT_S
        # How long a destroy may take to follow the last work that ended (before this create
        # came, too: the manager's destroy may still be on its way).
        quiet_until = self.locks.work_ended_at + ROOM_GRACE_S
        self._waiting.add(kernel_id)
        try:
            while True:
                try:
                    self.check_fits(kernel_id, res)
                    return
                except rpc.RequestError:
                    now = time.monotonic()
                    # Only work under way frees room: creates waiting here too do not.
                    if self.locks.any_in_flight(besides=self._waiting):
                        quiet_until = now + ROOM_GRACE_S
                    elif now >= quiet_until:
                        raise  # nothing was under way, or no destroy followed what was
                    if now >= deadline:
                        raise
                await asyncio.sleep(ROOM_POLL_S)
        finally:
            self._waiting.discard(kernel_id)

    def check_fits(self, kernel_id: str, res: ev.Resources) -> None:
        free = self.free()
        short = [
            f"{name} {amount:g} (free {free.slots.get(name, 0.0):g})"
            for name, amount in sorted(res.slots.items())
            if amount > 0 and amount > free.slots.get(name, 0.0) + 1e-9
        ]
        if res.cpu > free.cpu + 1e-9 or res.mem > free.mem:
            asked = f"cpu {res.cpu:g}, mem {fmt_mem(res.mem)}"
            short.insert(0, f"{asked} (free cpu {free.cpu:g}, mem {fmt_mem(free.mem)})")
        if short:
            raise rpc.RequestError(
                "insufficient-resources",
                f"kernel {kernel_id} asks {'; '.join(short)} on agent {self.agent_id}:"
                " schedule it elsewhere",
            )

    def pick_gpus(self, kernel_id: str, count: int) -> tuple[str, ...]:
        """``count`` of the agent's GPUs no kernel holds (in --gpu-ids order)."""
        if not count:
            return ()
        held = {gpu for ids in self.gpus.values() for gpu in ids}
        free = [gpu for gpu in self.gpu_ids if gpu not in held]
        if len(free) < count:
            raise rpc.RequestError(
                "insufficient-resources",
                f"kernel {kernel_id} asks gpu {count} (free GPUs {len(free)}) on agent"
                f" {self.agent_id}: schedule it elsewhere",
            )
        return tuple(free[:count])

    def reserve(self, kernel_id: str, res: ev.Resources, gpu_ids: tuple[str, ...]) -> None:
        self.reserved[kernel_id] = res
        if gpu_ids:
            self.gpus[kernel_id] = gpu_ids

    def release(self, kernel_id: str) -> None:
        """What the kernel's container was given is free again."""
        self.reserved.pop(kernel_id, None)
        self.gpus.pop(kernel_id, None)


def whole_gpus(res: ev.Resources) -> int:
    amount = res.slots.get("gpu", 0.0)
    if amount != int(amount):
        raise rpc.RequestError(
            "invalid-request",
            f"resources.gpu must be a whole number of GPUs (one GPU is not shared), got {amount:g}",
        )
    return int(amount)
