"""A user's dotfiles on the manager: ``hoist.api.dotfile.set``, ``.remove``, ``.list``
(domain.contracts.dotfiles).  Each change records an event on ``hoist.events.dotfiles.<owner>``
through the unit of work; the reactors send the owner's files with each create-kernel
(``files_of``)."""

from __future__ import annotations

from typing import Any

from domain.contracts.dotfiles import ListDotfiles, RemoveDotfile, SetDotfile, dotfile_view
from domain.dotfiles import Dotfile, Dotfiles, check_owner, check_path
from domain.errors import NotFound
from domain.subjects import DOTFILES
from services.manager.fleet import Fleet
from services.manager.requester import requester
from services.manager.uow import UnitOfWork


class DotfileCommands:
    def __init__(self, fleet: Fleet, uow: UnitOfWork) -> None:
        self.fleet = fleet
        self.uow = uow

    async def set(self, req: SetDotfile) -> dict[str, Any]:
        owner = check_owner(req.owner)
        by = requester("client")
        _, recorded = await self.uow.admin(
            DOTFILES,
            owner,
            lambda d: Dotfiles.set(
                d, owner=owner, path=req.path, content=req.content, mode=req.mode, by=by
            ),
        )
        return {
            "dotfile": dotfile_view(Dotfile(req.path, req.content, req.mode)),
            "recorded": recorded,
        }

    async def remove(self, req: RemoveDotfile) -> dict[str, Any]:
        owner = check_owner(req.owner)
        path = check_path(req.path)
        by = requester("client")

        def remove(d: Dotfiles | None) -> Dotfiles:
            if d is None:
                raise NotFound("path", f"{owner!r} keeps no dotfile {path!r}; hoist dotfile list")
            d.remove(path, by=by)
            return d

        _, recorded = await self.uow.admin(DOTFILES, owner, remove)
        return {"path": path, "recorded": recorded}

    async def list(self, req: ListDotfiles) -> dict[str, Any]:
        owner = check_owner(req.owner)  # a name no user can have is a mistake, said
        return {
            "owner": owner,
            "dotfiles": [dotfile_view(f) for f in files_of(self.fleet, owner)],
        }


def files_of(fleet: Fleet, owner: str) -> list[Dotfile]:
    """The dotfiles ``owner`` keeps, sorted by path (none for an owner who set none)."""
    dotfiles: Dotfiles | None = fleet.admin[DOTFILES].get(owner)
    return [] if dotfiles is None else dotfiles.listed()
