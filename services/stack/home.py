"""Which data dir (which stack) a `hoist` command means when none is named, so that `hoist up`
and every other command agree wherever they run:

1. ``--data-dir D``: what the user wrote;
2. ``$HOIST_HOME``: a choice made for the whole shell (as GIT_DIR beats discovery);
3. the nearest ``.hoist`` directory from the current directory up (a project's own stack, as
   git finds ``.git``): a checkout that ran `hoist up` before this rule keeps its data;
4. the per-user state dir (``platformdirs.user_state_dir("hoist")``, e.g.
   ``~/.local/state/hoist``): a fresh checkout's stack, found from any directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import platformdirs

PROJECT_DIR = ".hoist"
HOME_ENV = "HOIST_HOME"


def state_dir() -> Path:
    """The per-user default data dir."""
    return Path(platformdirs.user_state_dir("hoist"))


def project_dir(start: Path) -> Path | None:
    """The nearest ``.hoist`` directory at or above ``start``."""
    for parent in (start, *start.parents):
        candidate = parent / PROJECT_DIR
        if candidate.is_dir():
            return candidate
    return None


def resolve_data_dir(
    explicit: str | os.PathLike[str] | None,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Path:
    """The data dir a command means (see the module's docstring for the order), absolute: the
    messages that name it work from any directory."""
    if explicit is not None and str(explicit) != "":
        return Path(explicit).absolute()
    env = os.environ if env is None else env
    if env.get(HOME_ENV):
        return Path(env[HOME_ENV]).absolute()
    found = project_dir((cwd or Path.cwd()).resolve())
    return found if found is not None else state_dir()


def data_dir_flag(data_dir: Path) -> str:
    """`` --data-dir D`` for a command that must reach ``data_dir`` from any directory and
    shell; empty for the per-user default, which every command finds without it."""
    if data_dir.resolve() == state_dir().resolve():
        return ""
    return f" --data-dir {data_dir.resolve()}"


def start_command(data_dir: Path) -> str:
    """The exact command that starts the stack of ``data_dir``, from any directory."""
    return f"hoist up --data-dir {data_dir.absolute()}"
