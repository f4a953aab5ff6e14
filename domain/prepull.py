"""Prepull policies: rules kept as events, and the pure function that turns them into
the images each agent should hold, within that agent's disk budget.

A ``PrepullPolicy`` aggregate (subject ``hoist.events.prepull-policy.<name>``) is set (created or
replaced) and removed by events.  ``plan_fleet`` computes every agent's desired images from the
live policies, what Hoist knows about images (``KnownImage``: size, last use, first seen), and
each agent's disk.

Priority order, for one agent: policies by ``priority`` (higher first), then by name; inside a
policy its rules in order; inside a rule its own order (newest tags first; for "large and
recent", the most recently used first, then the larger).  An image's size is the largest an
agent reported holding it, else what its registry's manifest says (the manager asks at each
round); a held image whose name the registry now maps to another manifest digest (a tag pushed
again) is pulled again.  Walking that order, an image is taken
when it fits what is left of the budget, otherwise skipped with the reason (first fit: a smaller
image further down may still fit).  The budget is ``fill`` (default 0.8, image GC's low
watermark, so prepulled images never make the GC run) of the agent's disk, minus the images it
holds that kernels use or are about to use, or that a preload job pinned: those stay whatever
the policy says.  So no agent is ever handed more than its budget.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import msgspec
from eventsourcing.domain import BaseAggregate

from domain import events as ev
from domain.errors import Conflict, InvalidField, convert, require_text
from domain.image_ref import (
    canonical_all,
    canonical_or_same,
    canonical_repository,
    repository_of,
)
from domain.subjects import check_token

DEFAULT_FILL = 0.8
_RULES = (
    '[{"kind": "newest-tags", "repository", "count"} | {"kind": "large-recent", "min_bytes",'
    ' "days"} | {"kind": "images", "images": [...]}]'
)


class PrepullPolicy(BaseAggregate[str]):
    KIND = "prepull-policy"

    if TYPE_CHECKING:  # set by the events
        resource_groups: list[str]
        rules: list[ev.Rule]
        priority: int
        removed: bool
        reason: str

    @staticmethod
    def set(
        existing: PrepullPolicy | None,
        *,
        name: str,
        resource_groups: Sequence[str],
        rules: Sequence[ev.Rule | Mapping[str, object]],
        priority: int = 0,
        reason: str = "set-by-admin",
    ) -> PrepullPolicy:
        """Create the policy, or replace the rules of ``existing`` (also a removed one)."""
        fields = _checked(resource_groups, rules, priority, reason)
        if existing is None:
            return PrepullPolicy._create(
                ev.PrepullPolicySet, id=check_token(name, "name"), **fields
            )
        if (
            not existing.removed
            and existing.resource_groups == fields["resource_groups"]
            and existing.rules == fields["rules"]
            and existing.priority == fields["priority"]
        ):
            return existing  # the same policy again: nothing new to record
        existing.trigger_event(ev.PrepullPolicySet, originator_topic=_topic(), **fields)
        return existing

    def remove(self, reason: str = "removed-by-admin") -> None:
        require_text(reason, "reason")
        if self.removed:
            raise Conflict("name", f"prepull policy {self.id!r} is already removed")
        self.trigger_event(ev.PrepullPolicyRemoved, reason=reason)

    # --- state changes: what each event does to the policy (Event.apply calls WHEN) ---------

    def _on_set(self, e: ev.PrepullPolicySet) -> None:
        self.resource_groups = list(e.resource_groups)
        self.rules = [_read_rule(r) for r in e.rules]  # older events: short forms
        self.priority = e.priority
        self.removed = False
        self.reason = e.reason

    def _on_removed(self, e: ev.PrepullPolicyRemoved) -> None:
        self.removed = True
        self.reason = e.reason

    WHEN = {  # event class -> state change, for Event.apply
        ev.PrepullPolicySet: _on_set,
        ev.PrepullPolicyRemoved: _on_removed,
    }


def _topic() -> str:
    from eventsourcing.utils import get_topic

    return get_topic(PrepullPolicy)


def _door_rule(rule: ev.Rule, i: int) -> ev.Rule:
    """``rule`` with its references canonical; InvalidField naming the bad one."""
    if isinstance(rule, ev.ListedImages):
        return msgspec.structs.replace(
            rule, images=canonical_all(rule.images, f"rules[{i}].images")
        )
    if isinstance(rule, ev.NewestTags):
        repo = canonical_repository(rule.repository, f"rules[{i}].repository")
        return msgspec.structs.replace(rule, repository=repo)
    return rule


def _read_rule(rule: ev.Rule) -> ev.Rule:
    if isinstance(rule, ev.ListedImages):
        images = list(dict.fromkeys(canonical_or_same(i) for i in rule.images))
        return msgspec.structs.replace(rule, images=images)
    if isinstance(rule, ev.NewestTags):
        repo = canonical_or_same(rule.repository)
        repo = repo.removesuffix(":latest") if repo != rule.repository else repo
        return msgspec.structs.replace(rule, repository=repo)
    return rule


def _checked(
    resource_groups: Sequence[str],
    rules: Sequence[ev.Rule | Mapping[str, object]],
    priority: int,
    reason: str,
) -> dict[str, object]:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidField("priority", f"must be an integer, got {priority!r}")
    groups = [check_token(g, f"resource_groups[{i}]") for i, g in enumerate(resource_groups)]
    checked = [
        _door_rule(r, i) for i, r in enumerate(convert(list(rules), list[ev.Rule], "rules", _RULES))
    ]
    if not checked:
        raise InvalidField("rules", f"must name at least one rule: {_RULES}")
    return {
        "resource_groups": sorted(set(groups)),
        "rules": checked,
        "priority": priority,
        "reason": require_text(reason, "reason"),
    }


# --- planning ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownImage:
    """What the log says about an image: its size once some agent held it, when a session last
    asked for it, when Hoist first saw it."""

    image: str
    size_bytes: int | None
    last_used: datetime | None
    first_seen: datetime
    # The manifest digest the registry says the reference names now (None: not asked, or it
    # did not answer); an agent holding another digest under the name pulls it again.
    digest: str | None = None


@dataclass(frozen=True)
class AgentDisk:
    agent_id: str
    resource_group: str
    disk: int  # bytes for images
    held: Mapping[str, int]  # image -> bytes
    kept: frozenset[str] = frozenset()  # held images no policy decides about (in use, pinned)
    digests: Mapping[str, str] = field(default_factory=dict)  # held image -> its digest


@dataclass(frozen=True)
class Wanted:
    image: str
    size_bytes: int
    policy: str
    why: str  # the rule that wants it


@dataclass
class AgentPlan:
    agent_id: str
    budget: int  # bytes the policies may fill
    desired: list[Wanted] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # image, why not
    to_pull: list[str] = field(default_factory=list)  # desired images the agent lacks
    # Of to_pull, those the agent holds under an older manifest: image -> the registry's digest
    # now (a tag pushed again since the agent pulled it).
    refresh: dict[str, str] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(w.size_bytes for w in self.desired)

    @property
    def images(self) -> list[str]:
        return [w.image for w in self.desired]


@dataclass(frozen=True)
class Policy:
    """A live policy, as planning needs it (from the aggregate or a dry-run candidate)."""

    name: str
    resource_groups: Sequence[str]
    rules: Sequence[ev.Rule]
    priority: int = 0

    @classmethod
    def of(cls, aggregate: PrepullPolicy) -> Policy:
        return cls(aggregate.id, aggregate.resource_groups, aggregate.rules, aggregate.priority)

    def applies_to(self, resource_group: str) -> bool:
        return not self.resource_groups or resource_group in self.resource_groups


def _version_key(tag: str) -> tuple[tuple[int, int, str], ...]:
    # Natural order: "2.16.1" after "2.3.1"; numbers sort below words at the same place.
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", tag))


def candidates(rule: ev.Rule, catalog: Mapping[str, KnownImage], now: datetime) -> list[str]:
    """The images a rule wants, in its own priority order."""
    if isinstance(rule, ev.ListedImages):
        return list(dict.fromkeys(rule.images))
    if isinstance(rule, ev.NewestTags):
        tags = [k for k in catalog.values() if repository_of(k.image)[0] == rule.repository]
        tags.sort(
            key=lambda k: (_version_key(repository_of(k.image)[1]), k.first_seen), reverse=True
        )
        return [k.image for k in tags[: rule.count]]
    since = now - timedelta(days=rule.days)
    recent = [
        k
        for k in catalog.values()
        if k.size_bytes is not None
        and k.size_bytes >= rule.min_bytes
        and k.last_used is not None
        and k.last_used >= since
    ]
    recent.sort(key=lambda k: (k.last_used, k.size_bytes), reverse=True)
    return [k.image for k in recent]


def _describe(rule: ev.Rule) -> str:
    if isinstance(rule, ev.NewestTags):
        return f"newest {rule.count} tags of {rule.repository}"
    if isinstance(rule, ev.LargeRecent):
        return f"images >= {rule.min_bytes} bytes used in the last {rule.days:g} days"
    return "listed images"


def plan_agent(
    agent: AgentDisk,
    policies: Iterable[Policy],
    catalog: Mapping[str, KnownImage],
    now: datetime,
    fill: float = DEFAULT_FILL,
) -> AgentPlan:
    """One agent's desired images (see the module docstring for the order and the budget)."""
    if not 0 < fill <= 1:
        raise InvalidField("fill", f"must be in (0, 1], got {fill!r}")
    kept_bytes = sum(agent.held.get(i, 0) for i in agent.kept)
    plan = AgentPlan(agent.agent_id, max(0, int(agent.disk * fill) - kept_bytes))
    left = plan.budget
    seen: set[str] = set()
    applicable = sorted(
        (p for p in policies if p.applies_to(agent.resource_group)),
        key=lambda p: (-p.priority, p.name),
    )
    for policy in applicable:
        for index, rule in enumerate(policy.rules, 1):
            why = f"{policy.name} rule {index}: {_describe(rule)}"
            for image in candidates(rule, catalog, now):
                if image in seen:
                    continue
                seen.add(image)
                known = catalog.get(image)
                size = agent.held.get(image, known.size_bytes if known else None)
                if size is None:
                    plan.skipped.append(
                        (
                            image,
                            "size unknown: no agent has held it and the registry did not say"
                            " (the manager's log says why); preload it on one",
                        )
                    )
                    continue
                cost = 0 if image in agent.kept else size
                if cost > left:
                    plan.skipped.append((image, f"over budget: needs {cost} bytes, {left} left"))
                    continue
                left -= cost
                plan.desired.append(Wanted(image, size, policy.name, why))
                if image not in agent.held:
                    plan.to_pull.append(image)
                elif (
                    known
                    and known.digest
                    and agent.digests.get(image, known.digest) != known.digest
                ):
                    plan.to_pull.append(image)
                    plan.refresh[image] = known.digest
    return plan


def plan_fleet(
    agents: Iterable[AgentDisk],
    policies: Sequence[Policy],
    catalog: Mapping[str, KnownImage],
    now: datetime,
    fill: float = DEFAULT_FILL,
) -> dict[str, AgentPlan]:
    return {a.agent_id: plan_agent(a, policies, catalog, now, fill) for a in agents}
