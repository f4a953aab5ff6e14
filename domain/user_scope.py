"""What a Hoist user may see and do on their own subjects (``hoist.api.<user>.…``,
``hoist.query.<user>.…``, ``hoist.admin.<user>.…``): one rule for the command server, the
read-model queries and the history reader.

An enabled user sees and acts on their own sessions, streams and rows; an admin user on
everyone's, and only an admin user has the admin subjects.  Whatever is not the asker's reads
as not there (NotFound, with the wording of an id that never existed): a refusal would tell one
user that another's session exists."""

from __future__ import annotations

from dataclasses import dataclass

from domain.errors import Forbidden, NotFound, unknown_session
from domain.limits import quote
from domain.user import not_enabled


@dataclass(frozen=True)
class UserScope:
    user: str
    admin: bool

    @classmethod
    def of(cls, user: str, *, enabled: bool, admin: bool) -> UserScope:
        """The scope of ``user``, or Forbidden when they are no enabled Hoist user (never
        added, or disabled), whatever NATS let through."""
        if not enabled:
            raise Forbidden(not_enabled(user))
        return cls(user, admin)

    def require_admin(self, because: str) -> None:
        """Forbidden unless an admin user; ``because`` (e.g. "; <subject> is admin's") says
        why the request needs one."""
        if not self.admin:
            raise Forbidden(f"user {self.user!r} is no admin{because}")

    def owner(self, given: object, subject: str) -> str:
        """The owner a request of a user who is no admin stands for: always the user, the one
        whose subject it came on (left out, or named as themselves, alone or as a list of one);
        any other owner is Forbidden naming ``owner``."""
        if given is not None and given != self.user and given != [self.user]:
            raise Forbidden(
                f"owner: {quote(str(given))} is not {self.user!r}, the user whose subject"
                f" ({subject}) this came on; leave owner out"
            )
        return self.user

    def sees(self, owner: str | None) -> bool:
        """Whether something of ``owner`` (None: no such thing) is the user's to see."""
        return owner is not None and (self.admin or owner == self.user)

    def session(self, session_id: str, owner: str | None) -> None:
        """NotFound naming ``session_id`` unless the session (of ``owner``) is the user's."""
        if not self.sees(owner):
            raise NotFound("session_id", unknown_session(session_id))
