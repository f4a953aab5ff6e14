"""Resource groups on the manager: the admin's commands.

Commands (admin): ``hoist.admin.group.set``, ``.remove``, ``.list``; what each takes and answers
is in domain.contracts.groups.  A create for a group its owner may not use is refused by
services.manager.sessions (``forbidden``, domain.resource_group's rule); agents join groups as
before (``hoist agent --resource-group``) and the scheduler places a session on its group's
agents only.
"""

from __future__ import annotations

from typing import Any

from domain.contracts.groups import ListGroups, RemoveGroup, SetGroup, group_view
from domain.resource_group import ResourceGroup
from domain.subjects import RESOURCE_GROUP
from services.manager.fleet import Fleet
from services.manager.uow import UnitOfWork, removal


class Groups:
    def __init__(self, fleet: Fleet, uow: UnitOfWork) -> None:
        self.fleet = fleet
        self.uow = uow

    async def set(self, req: SetGroup) -> dict[str, Any]:
        group, recorded = await self.uow.admin(
            RESOURCE_GROUP,
            req.name,
            lambda g: ResourceGroup.set(
                g, name=req.name, users=req.users, public=req.public, description=req.description
            ),
        )
        return {"group": group_view(group.id, group), "recorded": recorded}

    async def remove(self, req: RemoveGroup) -> dict[str, Any]:
        missing = (
            f"no resource group {req.name!r} is defined (an undefined group is open to"
            " everyone already); `hoist group list` shows them"
        )
        _, recorded = await self.uow.admin(RESOURCE_GROUP, req.name, removal(missing))
        return {"group": req.name, "recorded": recorded}

    async def list(self, req: ListGroups) -> dict[str, Any]:
        defined = self.fleet.resource_groups
        members: dict[str, list[dict[str, Any]]] = {}
        lost: dict[str, int] = {}
        for agent_id, state in sorted(self.fleet.agents.items()):
            name = state.agent.resource_group
            members.setdefault(name, [])
            if not state.live:
                lost[name] = lost.get(name, 0) + 1
                continue
            cap = state.agent.capacity
            members[name].append(
                {"agent_id": agent_id, "cpu": cap.cpu, "mem": cap.mem, "slots": dict(cap.slots)}
            )
        rows = []
        for name in sorted(defined.keys() | members.keys()):
            agents = members.get(name, [])
            slots: dict[str, float] = {}
            for a in agents:
                for slot, amount in a["slots"].items():
                    slots[slot] = round(slots.get(slot, 0.0) + amount, 9)
            rows.append(
                {
                    **group_view(name, defined.get(name)),
                    "agents": agents,
                    "lost_agents": lost.get(name, 0),
                    "capacity": {
                        "cpu": round(sum(a["cpu"] for a in agents), 9),
                        "mem": sum(a["mem"] for a in agents),
                        "slots": slots,
                    },
                }
            )
        return {"groups": rows}
