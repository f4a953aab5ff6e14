"""domain.user_scope: what a user may see and do on their own subjects, admin or owner."""

from __future__ import annotations

import pytest

from domain.errors import Forbidden, NotFound
from domain.user_scope import UserScope

SUBJECT = "hoist.api.alice.sessions.create"


def test_a_user_not_enabled_is_forbidden_whatever_their_standing() -> None:
    for admin in (False, True):
        with pytest.raises(Forbidden, match="'alice' is not an enabled Hoist user"):
            UserScope.of("alice", enabled=False, admin=admin)
    assert UserScope.of("alice", enabled=True, admin=True) == UserScope("alice", admin=True)


def test_only_an_admin_passes_require_admin() -> None:
    UserScope("root", admin=True).require_admin("; hoist.admin.x is admin's")
    with pytest.raises(Forbidden) as e:
        UserScope("alice", admin=False).require_admin("; hoist.admin.x is admin's")
    assert str(e.value) == "user 'alice' is no admin; hoist.admin.x is admin's"


@pytest.mark.parametrize("given", [None, "alice", ["alice"]])
def test_the_owner_of_a_users_request_is_the_user(given: object) -> None:
    assert UserScope("alice", admin=False).owner(given, SUBJECT) == "alice"


@pytest.mark.parametrize("given", ["bob", ["alice", "bob"], ""])
def test_another_owner_is_forbidden_naming_owner(given: object) -> None:
    with pytest.raises(Forbidden) as e:
        UserScope("alice", admin=False).owner(given, SUBJECT)
    assert str(e.value).startswith("owner: ")
    assert f"({SUBJECT})" in str(e.value) and "leave owner out" in str(e.value)


def test_a_user_sees_their_own_an_admin_everyones_and_none_sees_what_is_not() -> None:
    alice, root = UserScope("alice", admin=False), UserScope("root", admin=True)
    assert alice.sees("alice") and not alice.sees("bob") and not alice.sees(None)
    assert root.sees("alice") and root.sees("bob") and not root.sees(None)


def test_another_users_session_reads_as_one_that_does_not_exist() -> None:
    alice = UserScope("alice", admin=False)
    alice.session("s1", "alice")
    with pytest.raises(NotFound) as theirs:
        alice.session("s2", "bob")
    with pytest.raises(NotFound) as none:
        alice.session("s2", None)
    assert str(theirs.value) == str(none.value)
    assert str(none.value).startswith("session_id: unknown session s2")
    assert none.value.field == "session_id"
    UserScope("root", admin=True).session("s2", "bob")
