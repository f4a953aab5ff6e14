"""Resource policies and quotas: the admin's commands (served by services.manager.quotas).

- ``hoist.admin.quota.set {name, max_cpu?, max_mem?, max_slots?, max_sessions?,
  max_kernels_per_session?, max_lifetime_s?, idle_timeout_s?}`` records ResourcePolicySet
  (every limit left out is unlimited; the whole policy is replaced) and answers
  ``{"policy": {...}, "recorded": bool}``;
- ``hoist.admin.quota.remove {name}`` records ResourcePolicyRemoved: ``{"policy", "recorded"}``;
- ``hoist.admin.quota.show {owner?}`` -> ``{"policies": [...], "owners": [...]}``: every policy
  (removed ones too), and for ``owner`` (or every owner holding something or waiting) the
  effective policy and usage: ``{"owner", "policy": name or null, "quota": {...} or null,
  "usage": {"cpu", "mem", "slots", "sessions"}, "pending": n}``.
``name`` is an owner (a subject token) or ``default`` (domain.quota says how a policy applies).
A policy is ``{"name", "max_cpu", "max_mem", "max_slots", "max_sessions",
"max_kernels_per_session", "max_lifetime_s", "idle_timeout_s", "removed", "reason"}``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from domain.limits import Id, Owner
from domain.quota import Quota, QuotaLimits, ResourcePolicy, Usage


class SetQuota(QuotaLimits, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Id  # an owner or "default": hoist.events.resource-policy.<name>

    def quota(self) -> Quota:
        limits = {f: getattr(self, f) for f in QuotaLimits.__struct_fields__}
        return Quota(**limits | {"max_slots": dict(self.max_slots)})


class RemoveQuota(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Id


class ShowQuotas(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    owner: Owner | None = None  # None: every owner holding something or waiting


class MyQuota(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``hoist.api.quota.mine``: one owner's effective policy, usage and pending sessions (a
    Hoist user's own subject fills in ``owner``): what anyone may see of their own quota."""

    owner: Owner


def quota_view(quota: Quota | None) -> dict[str, Any] | None:
    return None if quota is None else msgspec.structs.asdict(quota)


def resource_policy_view(p: ResourcePolicy) -> dict[str, Any]:
    return {
        "name": p.id,
        **msgspec.structs.asdict(p.quota),
        "removed": p.removed,
        "reason": p.reason,
    }


def usage_view(u: Usage) -> dict[str, Any]:
    return {"cpu": u.cpu, "mem": u.mem, "slots": dict(u.slots), "sessions": u.sessions}
