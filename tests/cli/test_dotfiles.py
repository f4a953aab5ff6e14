"""Dotfiles on a running `hoist up` stack (dummy agents), through the CLI only: a user adds
them, each of their kernels finds them in its home (its command and `hoist exec` read them
back), `hoist dotfile list` and `rm`; the client role names any owner with --owner, another
user may not; bad input is refused in one line naming the flag or field, and records nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.cli.stack_harness import Stack
from tests.cli.test_errors import one_line_error

BASHRC = b"alias ll='ls -l'\nexport EDITOR=vi\n"
GITCONFIG = b"[user]\n\tname = Dana\n"


def dotfile_events(stack: Stack, owner: str) -> list[dict[str, Any]]:
    done = stack.hoist("events", "-o", "json")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    return [e for e in events if e["aggregate"] == "dotfiles" and e["id"] == owner]


def test_a_users_kernels_find_their_dotfiles_in_their_home(
    hoist_stack: Stack, tmp_path: Path
) -> None:
    for name in ("dana", "eli"):
        assert hoist_stack.hoist("user", "add", name).returncode == 0
    (tmp_path / "bashrc").write_bytes(BASHRC)
    (tmp_path / "gitconfig").write_bytes(GITCONFIG)
    added = hoist_stack.hoist(
        "--user", "dana", "dotfile", "add", ".bashrc", "--from", str(tmp_path / "bashrc")
    )
    assert added.returncode == 0, added.stderr
    assert added.stdout == f"dotfile .bashrc added ({len(BASHRC)} bytes, mode 644)\n"
    git = ("dotfile", "add", ".config/git/config", "--from", str(tmp_path / "gitconfig"))
    added = hoist_stack.hoist("--user", "dana", *git, "--mode", "600")
    assert added.returncode == 0 and "mode 600" in added.stdout, added.stderr
    again = hoist_stack.hoist("--user", "dana", *git, "--mode", "600")
    assert "unchanged" in again.stdout, again.stdout + again.stderr
    assert [e["type"] for e in dotfile_events(hoist_stack, "dana")] == ["DotfileSet"] * 2
    listed = hoist_stack.hoist("--user", "dana", "dotfile", "list")
    assert listed.stdout.splitlines() == [
        f"644  {len(BASHRC):>6}  .bashrc",
        f"600  {len(GITCONFIG):>6}  .config/git/config",
    ], listed.stdout + listed.stderr

    image = hoist_stack.next_image()
    # The kernel's own command finds them at its start ...
    batch = hoist_stack.hoist(
        "--user", "dana", "run", "--batch", image, "--", "sh", "-c", "cat $HOME/.bashrc"
    )
    assert (batch.returncode, batch.stdout) == (0, BASHRC.decode()), batch.stderr
    # ... and so does an exec in a running one.
    run = hoist_stack.hoist(
        "--user", "dana", "run", image, "-d", "--max-wait", "30", "--", "sleep", "infinity"
    )
    assert run.returncode == 0 and " RUNNING " in run.stdout, run.stdout + run.stderr
    sid = run.stdout.split()[1]
    read = hoist_stack.hoist("--user", "dana", "exec", sid, "cat", "~/.bashrc")
    assert (read.returncode, read.stdout) == (0, BASHRC.decode()), read.stderr
    read = hoist_stack.hoist("--user", "dana", "exec", sid, "cat", ".config/git/config")
    assert (read.returncode, read.stdout) == (0, GITCONFIG.decode()), read.stderr

    # The client role names any owner; another user may not.
    theirs = hoist_stack.hoist("dotfile", "list", "--owner", "dana", "-o", "json")
    assert [f["path"] for f in json.loads(theirs.stdout)["dotfiles"]] == [
        ".bashrc",
        ".config/git/config",
    ], theirs.stderr
    peek = hoist_stack.hoist("--user", "eli", "dotfile", "list", "--owner", "dana")
    one_line_error(peek, "--owner: 'dana' is not 'eli'")
    eli = hoist_stack.hoist("--user", "eli", "dotfile", "list")
    assert eli.stdout == "eli keeps no dotfiles (hoist dotfile add PATH --from FILE)\n"

    removed = hoist_stack.hoist("dotfile", "rm", ".bashrc", "--owner", "dana")
    assert removed.returncode == 0, removed.stderr
    assert [e["type"] for e in dotfile_events(hoist_stack, "dana")][-1] == "DotfileRemoved"
    gone = hoist_stack.hoist("--user", "dana", "run", "--batch", image, "--", "cat", ".bashrc")
    assert gone.returncode == 1 and "cat: .bashrc: No such file" in gone.stdout, gone.stdout
    one_line_error(
        hoist_stack.hoist("--user", "dana", "dotfile", "rm", ".bashrc"),
        "keeps no dotfile '.bashrc'",
    )
    assert hoist_stack.hoist("destroy", sid).returncode == 0


def test_bad_dotfiles_are_refused_naming_the_field_and_record_nothing(
    hoist_stack: Stack, tmp_path: Path
) -> None:
    small = tmp_path / "small"
    small.write_bytes(b"x\n")
    big = tmp_path / "big"
    big.write_bytes(b"x" * (64 * 1024 + 1))

    def add(path: str, source: Path = small, *more: str) -> Any:
        return hoist_stack.hoist(
            "dotfile", "add", path, "--from", str(source), "--owner", "fay", *more
        )

    one_line_error(add(".bashrc", big), f"--from {big}: more than 65536 bytes (64 KiB)")
    one_line_error(add(".bashrc", tmp_path / "none"), f"--from {tmp_path / 'none'}: ")
    for path, why in [
        ("/etc/profile", "PATH must be relative to the home"),
        ("../.bashrc", "PATH must not step out of the home with '..'"),
        (".config//x", "PATH must have no empty or '.' step"),
        ("x" * 256, "PATH must be at most 255 bytes"),
    ]:
        one_line_error(add(path), why)
    assert dotfile_events(hoist_stack, "fay") == []
    for i in range(32):
        assert add(f".f{i}").returncode == 0
    one_line_error(add(".f32"), "'fay' keeps 32 dotfiles, the most one may")
    events = dotfile_events(hoist_stack, "fay")
    assert len(events) == 32 and all(e["type"] == "DotfileSet" for e in events)
    listed = hoist_stack.hoist("dotfile", "list", "--owner", "fay", "-o", "json")
    assert len(json.loads(listed.stdout)["dotfiles"]) == 32
