"""Prepull policies: the admin's commands (served by services.manager.prepull).

- ``hoist.admin.image.policy.set {name, rules, resource_groups=[], priority=0, dry_run=false}``
  records PrepullPolicySet (unless ``dry_run``) and answers the plan with it:
  ``{"policy": {...}, "recorded": bool, "plans": {agent: plan}}``;
- ``hoist.admin.image.policy.remove {name, dry_run=false}`` records PrepullPolicyRemoved;
- ``hoist.admin.image.policy.list {}`` -> ``{"policies": [...]}``;
- ``hoist.admin.image.policy.plan {}`` -> ``{"plans": {...}, "converged": bool}``.
A plan is ``{"budget", "bytes", "desired": [{"image", "size_bytes", "policy", "why"}],
"to_pull": [...], "skipped": [{"image", "why"}]}`` (domain.prepull.plan_agent); a policy
``{"name", "resource_groups", "rules", "priority", "removed", "reason"}``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from domain import events as ev
from domain.contracts.common import NoRequest
from domain.limits import MAX_LIST, Id
from domain.prepull import AgentPlan, PrepullPolicy

__all__ = ["NoRequest", "RemovePolicy", "SetPolicy", "plan_view", "policy_view"]


class SetPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Id  # a subject token: hoist.events.prepull-policy.<name>
    rules: Annotated[list[ev.Rule], msgspec.Meta(min_length=1, max_length=64)]
    resource_groups: Annotated[list[Id], msgspec.Meta(max_length=MAX_LIST)] = []
    priority: Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)] = 0  # as PrepullPolicySet
    dry_run: bool = False


class RemovePolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Id
    dry_run: bool = False


def plan_view(plan: AgentPlan) -> dict[str, Any]:
    return {
        "budget": plan.budget,
        "bytes": plan.bytes,
        "desired": [
            {"image": w.image, "size_bytes": w.size_bytes, "policy": w.policy, "why": w.why}
            for w in plan.desired
        ],
        "to_pull": plan.to_pull,
        "refresh": plan.refresh,
        "skipped": [{"image": i, "why": why} for i, why in plan.skipped],
    }


def policy_view(p: PrepullPolicy) -> dict[str, Any]:
    return {
        "name": p.id,
        "resource_groups": p.resource_groups,
        "rules": msgspec.to_builtins(p.rules),
        "priority": p.priority,
        "removed": p.removed,
        "reason": p.reason,
    }
