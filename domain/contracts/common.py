"""Pieces every area's contract shares."""

from __future__ import annotations

from typing import Annotated

import msgspec

from domain.limits import MAX_LIST, MAX_REASON, PRINTABLE, Id

# Agents a command names: at least one (none at all is a mistake, not "every agent": a command
# that means every agent leaves the field out, or says ``all``).
AgentIds = Annotated[list[Id], msgspec.Meta(min_length=1, max_length=MAX_LIST)]
# A reason a person types (an admin's cancel): printable, since it is shown in every terminal
# that lists the kernel and copied into its siblings' status.
TypedReason = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REASON, pattern=PRINTABLE)]


class NoRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A command or query that takes nothing: ``{}``."""
