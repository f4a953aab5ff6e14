"""domain.user: users added, disabled and added again, as events."""

from __future__ import annotations

import pytest

from domain import events as ev
from domain.contracts.commands import COMMANDS
from domain.errors import DomainError, InvalidField
from domain.subjects import HISTORY, QUERY_NAMES
from domain.user import UNSCOPED, User


def test_add_disable_and_add_again() -> None:
    user = User.add(None, name="alice", by="admin")
    assert (user.admin, user.enabled, user.by) == (False, True, "admin")
    assert User.add(user, name="alice", by="admin") is user
    assert [type(e) for e in user.pending_events] == [ev.UserAdded]  # the same again: nothing
    user.disable(by="admin")
    assert not user.enabled
    with pytest.raises(DomainError, match="already disabled"):
        user.disable(by="admin")
    User.add(user, name="alice", admin=True, by="admin")
    assert (user.admin, user.enabled) == (True, True)
    assert [type(e) for e in user.collect_events()] == [
        ev.UserAdded,
        ev.UserDisabled,
        ev.UserAdded,
    ]


@pytest.mark.parametrize(
    "name",
    [
        "a.b",
        "",
        "a b",
        "manager",
        "client",
        "admin",
        "agent-1",
        "session",
        "kernels",
        "quota",
        "history",
        "default",
        "-x",  # a new name reads as an option on the command line
    ],
)
def test_names_are_subject_tokens_and_no_roles_user(name: str) -> None:
    with pytest.raises(InvalidField, match="name"):
        User.add(None, name=name, by="admin")


def test_no_user_name_is_a_token_of_an_unscoped_subject() -> None:
    # hoist.api.<user>.> must never cover an unscoped command (served as the client role's,
    # any owner), nor hoist.admin.<user>.> the admin role's: the reserved names follow the
    # subjects, so a new command cannot silently hand a user someone else's subjects.
    tokens = {s.split(".")[2] for s in COMMANDS} | set(QUERY_NAMES) | {HISTORY}
    assert tokens <= UNSCOPED, tokens - UNSCOPED
