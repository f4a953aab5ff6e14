"""The names of the volumes this agent holds, as its heartbeat reports them."""

from __future__ import annotations

import logging
import time

from agent.runtime.base import Runtime

log = logging.getLogger(__name__)

VOLUMES_TTL_S = 30.0  # the heartbeat's volume names are listed again after this long


class VolumeNames:
    """A cache of ``runtime.volume_names``: listed again after VOLUMES_TTL_S, or at once after
    a change this agent made (``changed``)."""

    def __init__(self, agent_id: str, runtime: Runtime) -> None:
        self.agent_id = agent_id
        self.runtime = runtime
        self._cached: tuple[float, list[str]] | None = None  # (monotonic, names)

    def changed(self) -> None:
        self._cached = None

    def listed(self, names: list[str]) -> None:
        self._cached = (time.monotonic(), sorted(names))

    async def get(self) -> list[str]:
        cached = self._cached
        if cached is None or time.monotonic() - cached[0] > VOLUMES_TTL_S:
            # Names only (docker: one call; list_volumes asks which containers use each one).
            try:
                names = sorted(await self.runtime.volume_names())
            except Exception as e:  # the beat goes out anyway, with the names it had
                log.warning("agent %s: volumes not listed (%r)", self.agent_id, e)
                return cached[1] if cached is not None else []
            self._cached = cached = (time.monotonic(), names)
        return cached[1]
