"""A user's dotfiles (served by services.manager.dotfiles; domain.dotfiles says the rule).

- ``hoist.api.dotfile.set {owner, path, content, mode?}`` records DotfileSet (``content``: the
  file's bytes, base64 in JSON; ``mode``: permission bits, 0o644 unless given) and answers
  ``{"dotfile": {...}, "recorded": bool}`` (false: the same content and mode were there);
- ``hoist.api.dotfile.remove {owner, path}`` records DotfileRemoved: ``{"path", "recorded":
  true}``; ``not-found`` naming ``path`` when the owner keeps no such file;
- ``hoist.api.dotfile.list {owner}`` -> ``{"owner", "dotfiles": [...]}``, sorted by path.
A dotfile is ``{"path", "size", "mode"}``.  On a Hoist user's own subject ``owner`` is the
user (left out, it is filled in; another is ``forbidden``); the client and admin roles, and an
admin user, name any owner.  A bad path, content or mode is ``invalid-request`` naming it, and
records nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec

from domain.dotfiles import DEFAULT_MODE, Dotfile
from domain.limits import Owner


class SetDotfile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    owner: Owner
    path: str  # checked by domain.dotfiles.check_path, which says what is wrong
    content: bytes  # the request's size bounds it; domain.dotfiles.check_content says more
    mode: int = DEFAULT_MODE


class RemoveDotfile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    owner: Owner
    path: str


class ListDotfiles(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    owner: Owner


def dotfile_view(f: Dotfile) -> dict[str, Any]:
    return {"path": f.path, "size": len(f.content), "mode": f.mode}
