"""Resource groups: the aggregate and its fold, its subject binding, the access rule (a group no
admin defined is open to everyone, a removed one too)."""

from __future__ import annotations

import pytest

from domain import events as ev
from domain.admission import Inadmissible, admit, fold
from domain.codec import encode
from domain.errors import DomainError, InvalidField
from domain.resource_group import ResourceGroup, check_known, may_use, refusal, usable
from domain.subjects import MANAGER_KINDS, RESOURCE_GROUP, aggregate_subject

SUBJECT = aggregate_subject(RESOURCE_GROUP, "gpu")


def replayed(events: list[ev.Event], subject: str = SUBJECT) -> ResourceGroup:
    aggregate = None
    for e in events:
        data, headers = encode(e)
        aggregate = fold(aggregate, admit(subject, headers, data), subject)
    assert isinstance(aggregate, ResourceGroup)
    return aggregate


def test_set_set_again_remove_and_set_after_removal_fold_back_to_the_same_group() -> None:
    group = ResourceGroup.set(None, name="gpu", users=["bob", "alice", "alice"])
    assert group.users == ["alice", "bob"] and not group.public  # sorted, distinct
    ResourceGroup.set(group, name="gpu", users=["alice", "bob"])
    assert len(group.pending_events) == 1  # the same definition again: nothing new
    ResourceGroup.set(group, name="gpu", users=["alice"], description="the A100s")
    group.remove()
    with pytest.raises(DomainError):
        group.remove()
    ResourceGroup.set(group, name="gpu", public=True)
    events = list(group.collect_events())
    assert [type(e).__name__ for e in events] == [
        "ResourceGroupSet",
        "ResourceGroupSet",
        "ResourceGroupRemoved",
        "ResourceGroupSet",
    ]
    folded = replayed(events)
    assert folded.public and folded.users == [] and not folded.removed
    before = replayed(events[:2])
    assert before.users == ["alice"] and before.description == "the A100s"
    assert replayed(events[:3]).removed


def test_a_group_event_is_bound_to_its_own_manager_only_subject() -> None:
    assert RESOURCE_GROUP in MANAGER_KINDS
    (set_event,) = ResourceGroup.set(None, name="gpu", users=["alice"]).collect_events()
    data, headers = encode(set_event)
    assert isinstance(admit(SUBJECT, headers, data), ev.ResourceGroupSet)
    with pytest.raises(Inadmissible):  # a resource policy's subject
        admit(aggregate_subject("resource-policy", "gpu"), headers, data)
    with pytest.raises(Inadmissible):  # another group's subject
        admit(aggregate_subject(RESOURCE_GROUP, "cpu"), headers, data)
    with pytest.raises(Inadmissible):  # an agent may not write it on its own subject
        admit(aggregate_subject("agent", "gpu"), headers, data)
    (removed,) = [e for e in _removed_history() if isinstance(e, ev.ResourceGroupRemoved)]
    data, headers = encode(removed)
    with pytest.raises(Inadmissible, match="cannot start"):  # a removal starts nothing
        fold(None, admit(SUBJECT, headers, data), SUBJECT)


def _removed_history() -> list[ev.Event]:
    group = ResourceGroup.set(None, name="gpu", users=["alice"])
    group.remove()
    return list(group.collect_events())


def test_bad_fields_are_refused_naming_the_field() -> None:
    for kwargs, field in [
        ({"name": "gpu a100"}, "name"),
        ({"name": "gpu", "users": ["alice", "bob\n"]}, "users"),
        ({"name": "gpu", "users": [""]}, "users"),
        ({"name": "gpu", "users": ["alice"], "public": True}, "users"),
        ({"name": "gpu", "description": "x" * 2000}, "description"),
        ({"name": "gpu", "description": "bad\x1b[31m"}, "description"),
    ]:
        with pytest.raises(InvalidField) as e:
            ResourceGroup.set(None, **kwargs)  # type: ignore[arg-type]
        assert e.value.field == field, kwargs


def test_undefined_and_removed_groups_are_open_defined_ones_to_their_users() -> None:
    gpu = ResourceGroup.set(None, name="gpu", users=["alice"])
    lab = ResourceGroup.set(None, name="lab", public=True)
    closed = ResourceGroup.set(None, name="closed")  # neither users nor public: nobody
    groups = {"gpu": gpu, "lab": lab, "closed": closed}
    assert may_use("alice", "gpu", groups) and not may_use("bob", "gpu", groups)
    assert may_use("bob", "lab", groups) and may_use("Bob Smith", "lab", groups)
    assert not may_use("alice", "closed", groups)
    assert may_use("bob", "default", groups) and may_use("bob", "never-defined", groups)
    assert usable("bob", groups, known=["default", "gpu"]) == ["default", "lab"]
    assert usable("alice", groups, known=["default"]) == ["default", "gpu", "lab"]
    gpu.remove()  # removing takes the rule back: open to everyone again
    assert may_use("bob", "gpu", groups)
    assert "gpu" in usable("bob", groups, known=["gpu"])  # as any group its agents serve
    assert "gpu" not in usable("bob", groups, known=[])  # no longer defined, nobody serves it


def test_the_refusal_names_the_field_and_the_groups_the_user_may_use() -> None:
    groups = {"gpu": ResourceGroup.set(None, name="gpu", users=["alice"])}
    why = refusal("bob", "gpu", groups, known=["default", "gpu"])
    assert why.startswith("resource_group: 'bob' may not use resource group 'gpu'")
    assert "groups 'bob' may use: 'default'" in why
    closed = {"gpu": ResourceGroup.set(None, name="gpu")}
    assert "may use: none with agents yet, and any group no admin defined" in refusal(
        "bob", "gpu", closed, known=["gpu"]
    )


def test_a_group_nobody_defined_or_joined_is_refused_with_the_nearest_known_names() -> None:
    gpu = ResourceGroup.set(None, name="gpu", users=["alice"])
    gone = ResourceGroup.set(None, name="gone", public=True)
    gone.remove()
    groups = {"gpu": gpu, "gone": gone}
    for known in ("default", "gpu", "lab"):  # always; defined; an agent joined it (maybe lost)
        check_known(known, groups, joined=["lab"])
    with pytest.raises(InvalidField) as e:
        check_known("gpuu", groups, joined=["lab"])
    assert e.value.field == "resource_group"
    assert str(e.value) == (
        "resource_group: no resource group 'gpuu' is known (no admin defined it and no agent"
        " joined it); did you mean 'gpu'? `hoist group list` shows them"
    )
    with pytest.raises(InvalidField, match=r"'gone' is known .*\); `hoist group list`"):
        check_known("gone", groups, joined=[])  # removed, and no agent: as never defined
    with pytest.raises(InvalidField, match="did you mean 'lab-a' or 'lab-b'"):
        check_known("lab-c", {}, joined=["lab-a", "lab-b", "zzz"])
