"""Pieces every area's contract shares."""

from __future__ import annotations

import msgspec


class NoRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A command or query that takes nothing: ``{}``."""
