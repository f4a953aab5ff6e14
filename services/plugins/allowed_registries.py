"""An example lifecycle hook (domain.hooks): refuse sessions whose image comes from a registry
outside an allowed list.

Installed with Hoist (entry point ``allowed-registries`` of group ``hoist.hooks``) and idle
until the manager's environment names the registries: ``HOIST_ALLOWED_REGISTRIES=
registry.example.com,127.0.0.1:5000`` (``docker.io`` for Docker Hub's images).  Read at each
call, so a manager restarted with another list applies it at once.
"""

from __future__ import annotations

import os

from domain.hooks import SessionInfo

ENV = "HOIST_ALLOWED_REGISTRIES"


class AllowedRegistries:
    def on_enqueue(self, session: SessionInfo) -> str | None:
        allowed = [r.strip() for r in os.environ.get(ENV, "").split(",") if r.strip()]
        if not allowed:
            return None
        registry = session.image.split("/", 1)[0]  # images arrive canonical: registry first
        if registry in allowed:
            return None
        return (
            f"image {session.image} is from registry {registry}, which is not allowed here;"
            f" use an image from {', '.join(allowed)}"
        )
