"""Resource policies: the aggregate and its fold, the effective policy, what never fits."""

from __future__ import annotations

import json

import pytest

from domain import events as ev
from domain.admission import Inadmissible, admit, fold
from domain.codec import SCHEMA_HEADER, decode, encode
from domain.errors import DomainError, InvalidField
from domain.events import Resources
from domain.quota import Quota, ResourcePolicy, Usage, effective, never_fits
from domain.subjects import aggregate_subject

GiB = 2**30
SUBJECT = aggregate_subject("resource-policy", "alice")


def replayed(events: list[ev.Event], subject: str = SUBJECT) -> ResourcePolicy:
    aggregate = None
    for e in events:
        data, headers = encode(e)
        aggregate = fold(aggregate, admit(subject, headers, data), subject)
    assert isinstance(aggregate, ResourcePolicy)
    return aggregate


def test_set_set_again_remove_and_set_after_removal_fold_back_to_the_same_policy() -> None:
    policy = ResourcePolicy.set(None, name="alice", quota=Quota(max_cpu=4, max_slots={"gpu": 1}))
    assert policy.quota == Quota(max_cpu=4.0, max_slots={"gpu": 1.0})
    assert ResourcePolicy.set(policy, name="alice", quota=Quota(max_cpu=4, max_slots={"gpu": 1}))
    assert len(policy.pending_events) == 1  # the same policy again: nothing new
    ResourcePolicy.set(policy, name="alice", quota=Quota(max_mem=8 * GiB, max_lifetime_s=60))
    policy.remove()
    with pytest.raises(DomainError):
        policy.remove()
    ResourcePolicy.set(policy, name="alice", quota=Quota(max_sessions=2))
    events = list(policy.collect_events())
    assert [type(e).__name__ for e in events] == [
        "ResourcePolicySet",
        "ResourcePolicySet",
        "ResourcePolicyRemoved",
        "ResourcePolicySet",
    ]
    folded = replayed(events)
    assert folded.quota == Quota(max_sessions=2) and not folded.removed
    assert replayed(events[:3]).removed


def test_a_v1_policy_set_has_no_idle_timeout() -> None:
    (set_event,) = ResourcePolicy.set(
        None, name="alice", quota=Quota(max_cpu=2, idle_timeout_s=30)
    ).collect_events()
    data, headers = encode(set_event)
    assert headers[SCHEMA_HEADER] == "2" and json.loads(data)["idle_timeout_s"] == 30.0
    v1 = json.loads(data)
    del v1["idle_timeout_s"]
    event = decode(json.dumps(v1).encode(), {**headers, SCHEMA_HEADER: "1"})
    assert replayed([event]).quota == Quota(max_cpu=2.0)


def test_a_policy_event_is_refused_elsewhere_and_other_events_here() -> None:
    (set_event,) = ResourcePolicy.set(None, name="alice", quota=Quota()).collect_events()
    data, headers = encode(set_event)
    with pytest.raises(Inadmissible):
        admit(aggregate_subject("prepull-policy", "alice"), headers, data)
    with pytest.raises(Inadmissible):  # another owner's subject
        admit(aggregate_subject("resource-policy", "bob"), headers, data)


def test_bad_limits_and_names_are_refused_naming_the_field() -> None:
    for quota, field in [
        (Quota(max_cpu=-1), "max_cpu"),
        (Quota(max_mem=-1), "max_mem"),
        (Quota(max_slots={"GPU!": 1}), "max_slots"),
        (Quota(max_lifetime_s=0), "max_lifetime_s"),
        (Quota(idle_timeout_s=-1), "idle_timeout_s"),
        (Quota(max_sessions=-2), "max_sessions"),
    ]:
        with pytest.raises(InvalidField) as e:
            ResourcePolicy.set(None, name="alice", quota=quota)
        assert e.value.field == field
    with pytest.raises(ValueError, match="name"):
        ResourcePolicy.set(None, name="alice smith", quota=Quota())


def test_the_effective_policy_is_the_owners_then_default_then_none() -> None:
    alice = ResourcePolicy.set(None, name="alice", quota=Quota(max_cpu=1))
    default = ResourcePolicy.set(None, name="default", quota=Quota(max_cpu=2))
    policies = {"alice": alice, "default": default}
    assert effective("alice", policies) is alice
    assert effective("bob", policies) is default
    assert effective("Alice Smith", policies) is default  # not a token: only default applies
    alice.remove()
    assert effective("alice", policies) is default
    default.remove()
    assert effective("alice", policies) is None


def test_never_fits_names_the_first_field_that_could_never_fit() -> None:
    q = Quota(max_cpu=4, max_mem=4 * GiB, max_slots={"gpu": 1}, max_kernels_per_session=2)
    r = Resources(cpu=1, mem=GiB)
    assert never_fits(q, r, 2) is None
    assert never_fits(q, r, 3)[0] == "cluster_size"  # type: ignore[index]
    assert never_fits(q, Resources(cpu=3, mem=GiB), 2)[0] == "resources.cpu"  # type: ignore[index]
    assert never_fits(q, Resources(cpu=1, mem=3 * GiB), 2)[0] == "resources.mem"  # type: ignore[index]
    assert never_fits(q, Resources(cpu=1, mem=GiB, slots={"gpu": 1}), 2)[0] == "resources.gpu"  # type: ignore[index]
    assert never_fits(Quota(max_sessions=0), r, 1)[0] == "owner"  # type: ignore[index]


def test_usage_adds_and_takes_back_exactly() -> None:
    u = Usage()
    for _ in range(10):
        u.add(0.1, GiB, {"gpu": 0.1}, 1)
    for _ in range(10):
        u.add(-0.1, -GiB, {"gpu": -0.1}, -1)
    assert u.empty and u == Usage()
