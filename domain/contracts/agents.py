"""Agent resource sync (served by services.manager.agent_sync).

- ``hoist.admin.agent.sync {agent_ids?}`` (none: every live agent) -> ``{"agents": {id:
  {"running", "terminated", "destroyed", "spared", "repaired": [kernel ids recorded
  TERMINATED]} | {"error"}}}``: the manager sends each agent its kernels by status
  (``sync-kernels``); the agent destroys containers of kernels the manager does not know (or
  that are over), but spares those created from a record its view has not folded yet, and
  answers which listed running ones have no live container, which the manager records
  TERMINATED.

The manager's configurable triggers (``--agent-resource-sync-trigger``): ``after-scheduling``
(the placed agents, right after a session is scheduled), ``before-kernel-creation`` (the agents
of a session's creates, first) and ``on-creation-failure`` (the default: every agent that
refused a create with insufficient-resources, then those creates are retried once).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from domain.contracts.common import AgentIds

TRIGGERS = ("after-scheduling", "before-kernel-creation", "on-creation-failure")
DEFAULT_TRIGGERS = frozenset({"on-creation-failure"})


class SyncAgents(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    agent_ids: AgentIds | None = None  # None: every live agent


def check_triggers(triggers: Iterable[str]) -> frozenset[str]:
    out = frozenset(triggers)
    unknown = out - set(TRIGGERS)
    if unknown:
        raise ValueError(
            f"agent resource sync trigger must be among {list(TRIGGERS)}, got {sorted(unknown)}"
        )
    return out
