"""A `hoist` command on PATH for every terminal (what `hoist up`'s banner tells people to type):
`./dev up` installs a tiny script that runs this checkout's virtualenv `hoist`.

Where: /usr/local/bin as root (always on PATH); otherwise the first of ~/.local/bin and ~/bin
that is on PATH, else ~/.local/bin (a fresh machine's login shell adds it to PATH only when it
exists at login) with the one line that makes it reachable now. A `hoist` there that is not
ours is never overwritten.

    python -m services.cli.path_wrapper --hoist /abs/.venv/bin/hoist [--bin-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

MARK = "# hoist wrapper, installed by ./dev up"


class WrapperError(Exception):
    """The wrapper cannot be installed there; the message says why."""


@dataclass(frozen=True)
class Place:
    bin_dir: Path
    on_path: bool


def choose_bin_dir(path_env: str, home: Path, is_root: bool) -> Place:
    on_path = _dirs(path_env)
    candidates = [Path("/usr/local/bin")] if is_root else []
    candidates += [home / ".local" / "bin", home / "bin"]
    for candidate in candidates:
        if candidate in on_path:
            return Place(candidate, True)
    return Place(candidates[0], False)


def _dirs(path_env: str) -> set[Path]:
    return {Path(p).absolute() for p in path_env.split(os.pathsep) if p}


def script(hoist: Path) -> str:
    target = shlex.quote(str(hoist))
    return (
        f"#!/bin/sh\n{MARK}: runs {hoist}\n"
        f"if [ ! -x {target} ]; then\n"
        f'    echo "hoist: {hoist} is gone: run ./dev up in the Hoist checkout, or remove $0" >&2\n'
        "    exit 127\n"
        "fi\n"
        f'exec {target} "$@"\n'
    )


def install(hoist: Path, bin_dir: Path) -> tuple[Path, bool]:
    """Write the wrapper ``bin_dir/hoist`` running ``hoist``; (its path, whether it changed)."""
    path = bin_dir / "hoist"
    text = script(hoist)
    try:
        if path.is_symlink() or path.exists():
            current = path.read_text(errors="replace") if path.is_file() else ""
            if MARK not in current:
                raise WrapperError(f"{path} exists and is not Hoist's wrapper: left as it is")
            if current == text:
                return path, False
            other = _target(current)
            if other is not None and os.access(other, os.X_OK):  # another checkout's, alive
                raise WrapperError(
                    f"{path} runs another checkout's hoist ({other}): left as it is; remove it"
                    " and run ./dev up again to make it this one's"
                )
        bin_dir.mkdir(parents=True, exist_ok=True)
        tmp = bin_dir / ".hoist.tmp"
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(path)
    except OSError as e:
        raise WrapperError(f"cannot write {path}: {e.strerror or e}") from None
    return path, True


def _target(wrapper: str) -> str | None:
    """The hoist a wrapper runs (its MARK line says), None if it does not say."""
    for line in wrapper.splitlines():
        if line.startswith(f"{MARK}: runs "):
            return line.removeprefix(f"{MARK}: runs ")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.cli.path_wrapper")
    parser.add_argument("--hoist", type=Path, required=True, help="the virtualenv's hoist")
    parser.add_argument("--bin-dir", type=Path, help="where to put it (default: see --help)")
    args = parser.parse_args(argv)
    hoist = args.hoist.absolute()
    path_env = os.environ.get("PATH", "")
    place = choose_bin_dir(path_env, Path.home(), os.geteuid() == 0)
    if args.bin_dir is not None:
        place = Place(args.bin_dir.absolute(), args.bin_dir.absolute() in _dirs(path_env))
    fallback = f"alias hoist={shlex.quote(str(hoist))}"
    try:
        path, changed = install(hoist, place.bin_dir)
    except WrapperError as e:
        print(f"==> could not put hoist on PATH ({e}); in another terminal use: {fallback}")
        return 0
    if changed:
        print(f"==> installed {path}: `hoist` runs {hoist}")
    if not place.on_path:
        print(
            f"==> {place.bin_dir} is not on your PATH; in another terminal run:"
            f' export PATH="{place.bin_dir}:$PATH"  (or: {fallback})'
        )
    elif shutil.which("hoist", path=path_env) != str(path):
        found = shutil.which("hoist", path=path_env)
        print(f"==> `hoist` on your PATH is {found}, not {path}; use: {fallback}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
