"""A user's dotfiles (Backend.AI's ``prepare_dotfiles``), kept as events: files each of their
kernels finds in its home when it starts.

A ``Dotfiles`` aggregate per owner (subject ``hoist.events.dotfiles.<owner>``, a kind only the
manager writes) holds one file per path: ``DotfileSet {path, content, mode, by}`` adds or
replaces one, ``DotfileRemoved {path, by}`` takes it away.  Setting a path to the content and
mode it has records nothing.  The owner is a Hoist user's name (a subject token); the manager
sends the owner's files with each create-kernel, and the agent's runtime writes them into the
kernel's home before its command starts.

The bounds (domain.limits): a path is relative to the home (``.bashrc``,
``.config/git/config``): not absolute, no empty, ``.`` or ``..`` step, printable, at most
``MAX_DOTFILE_PATH`` characters; a file holds at most ``MAX_DOTFILE`` bytes (64 KiB); an owner
keeps at most ``MAX_DOTFILES`` (32) and ``MAX_DOTFILES_BYTES`` (384 KiB) in all, so every
owner's files fit in one create-kernel message under NATS' 1 MB ``max_payload``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventsourcing.domain import BaseAggregate

from domain import events as ev
from domain.errors import InvalidField, NotFound
from domain.limits import (
    MAX_DOTFILE,
    MAX_DOTFILE_MODE,
    MAX_DOTFILE_PATH,
    MAX_DOTFILES,
    MAX_DOTFILES_BYTES,
    PRINTABLE,
    quote,
)
from domain.subjects import DOTFILES
from domain.user import check_name

KIND = DOTFILES
DEFAULT_MODE = 0o644
_PRINTABLE = re.compile(PRINTABLE)


@dataclass(frozen=True)
class Dotfile:
    path: str
    content: bytes
    mode: int = DEFAULT_MODE


class Dotfiles(BaseAggregate[str]):
    KIND = KIND

    if TYPE_CHECKING:  # set by the events
        files: dict[str, Dotfile]
        by: str

    @staticmethod
    def set(
        existing: Dotfiles | None,
        *,
        owner: str,
        path: str,
        content: bytes,
        mode: int = DEFAULT_MODE,
        by: str,
    ) -> Dotfiles:
        """Keep ``content`` at ``path`` for ``owner`` (a new file, or a replaced one)."""
        check_path(path)
        check_content(content)
        check_mode(mode)
        files = {} if existing is None else existing.files
        others = {p: f for p, f in files.items() if p != path}
        for other in others:  # a file and a folder of one name cannot both be in the home
            if other.startswith(f"{path}/") or path.startswith(f"{other}/"):
                raise InvalidField(
                    "path",
                    f"{path} and the dotfile {other} cannot both be: one would be a folder of"
                    " the other; remove it first (hoist dotfile rm)",
                )
        if len(others) >= MAX_DOTFILES:
            raise InvalidField(
                "path",
                f"{owner!r} keeps {len(others)} dotfiles, the most one may: remove one"
                " (hoist dotfile rm PATH) or replace one of the same path",
            )
        total = sum(len(f.content) for f in others.values()) + len(content)
        if total > MAX_DOTFILES_BYTES:
            raise InvalidField(
                "content",
                f"the dotfiles of {owner!r} would hold {total} bytes, more than"
                f" {MAX_DOTFILES_BYTES} ({MAX_DOTFILES_BYTES // 1024} KiB) in all;"
                " remove one (hoist dotfile rm PATH)",
            )
        fields = {"path": path, "content": content, "mode": mode, "by": by}
        if existing is None:
            return Dotfiles._create(ev.DotfileSet, id=check_owner(owner), **fields)
        if files.get(path) == Dotfile(path, content, mode):
            return existing  # the same file again: nothing new to record
        existing.trigger_event(ev.DotfileSet, originator_topic=_topic(), **fields)
        return existing

    def remove(self, path: str, by: str) -> None:
        if path not in self.files:
            raise NotFound("path", f"{self.id!r} keeps no dotfile {path!r}; hoist dotfile list")
        self.trigger_event(ev.DotfileRemoved, path=path, by=by)

    def listed(self) -> list[Dotfile]:
        return [self.files[p] for p in sorted(self.files)]

    # --- state changes (Event.apply calls WHEN) ---------------------------------------------

    def _on_set(self, e: ev.DotfileSet) -> None:
        if not hasattr(self, "files"):
            self.files = {}
        self.files[e.path] = Dotfile(e.path, e.content, e.mode)
        self.by = e.by

    def _on_removed(self, e: ev.DotfileRemoved) -> None:
        del self.files[e.path]
        self.by = e.by

    WHEN = {
        ev.DotfileSet: _on_set,
        ev.DotfileRemoved: _on_removed,
    }


def _topic() -> str:
    from eventsourcing.utils import get_topic

    return get_topic(Dotfiles)


def check_owner(owner: str) -> str:
    """Whose dotfiles: a name a Hoist user can have (domain.user), never a role's."""
    try:
        return check_name(owner)
    except InvalidField as e:
        raise InvalidField("owner", str(e).removeprefix("name: ")) from None


def check_path(path: object) -> str:
    """A path relative to the home, or InvalidField naming ``path`` and what is wrong."""
    if not isinstance(path, str) or not path:
        raise InvalidField("path", f"must be a path relative to the home, got {quote(path)}")
    if "\x00" in path:
        raise InvalidField("path", f"must not hold a NUL character, got {quote(path)}")
    if len(path.encode()) > MAX_DOTFILE_PATH:  # bytes: what a filesystem counts
        raise InvalidField(
            "path", f"must be at most {MAX_DOTFILE_PATH} bytes, got {len(path.encode())}"
        )
    if path.startswith("/") or path.startswith("~"):
        raise InvalidField(
            "path", f"must be relative to the home (e.g. .bashrc), got {quote(path)}"
        )
    steps = path.split("/")
    if ".." in steps:
        raise InvalidField("path", f"must not step out of the home with '..', got {quote(path)}")
    if any(step in ("", ".") for step in steps):
        raise InvalidField(
            "path", f"must have no empty or '.' step (no '//', no trailing '/'), got {quote(path)}"
        )
    if not _PRINTABLE.match(path):
        raise InvalidField("path", f"must be printable text, got {quote(path)}")
    return path


def check_content(content: object) -> bytes:
    if not isinstance(content, bytes):
        raise InvalidField("content", "must be bytes")
    if len(content) > MAX_DOTFILE:
        raise InvalidField(
            "content",
            f"is {len(content)} bytes, more than {MAX_DOTFILE} ({MAX_DOTFILE // 1024} KiB)"
            " a dotfile may hold",
        )
    return content


def check_mode(mode: object) -> int:
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= MAX_DOTFILE_MODE:
        raise InvalidField(
            "mode", f"must be permission bits 0o000-0o777 (e.g. 0o644), got {quote(mode)}"
        )
    return mode
