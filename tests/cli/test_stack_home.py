"""The stack is found wherever you stand ($HOIST_HOME, the nearest .hoist up from here, the
per-user state dir), a command aimed at a stopped stack names the command that starts that
stack, and the `hoist` wrapper `./dev up` installs works from any directory of a new terminal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from services.cli.path_wrapper import MARK, Place, choose_bin_dir
from services.stack.home import resolve_data_dir
from tests.cli.stack_harness import HOIST, Stack, Terminal, run_hoist, wait_for


def _env(**extra: str) -> dict[str, str]:
    """This environment without a HOIST_HOME of its own, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("HOIST_HOME", "HOIST_NATS_URL")}
    return {**env, **extra}


def _hoist(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`hoist ARGS` with no --data-dir, run in ``cwd`` with only ``env`` (a process for `up`)."""
    return run_hoist(args, env=env, cwd=cwd)


def test_ps_finds_the_stack_from_any_directory(hoist_stack: Stack, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # $HOIST_HOME, standing anywhere.
    found = _hoist(elsewhere, "ps", env=_env(HOIST_HOME=str(hoist_stack.data_dir)))
    assert found.returncode == 0, found.stderr
    assert "row(s) as of event" in found.stdout
    # A project's .hoist, from a directory deep inside the project.
    project = tmp_path / "project"
    deep = project / "domain" / "deeper"
    deep.mkdir(parents=True)
    (project / ".hoist").symlink_to(hoist_stack.data_dir)
    found = _hoist(deep, "ps", env=_env())
    assert found.returncode == 0, found.stderr
    # Neither: the per-user state dir (platformdirs honours XDG_STATE_HOME).
    state = tmp_path / "state"
    state.mkdir()
    (state / "hoist").symlink_to(hoist_stack.data_dir)
    found = _hoist(elsewhere, "ps", env=_env(XDG_STATE_HOME=str(state)))
    assert found.returncode == 0, found.stderr


def test_the_order_of_the_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    (project / ".hoist").mkdir(parents=True)
    (project / "sub").mkdir()
    home = tmp_path / "home"
    inside = project / "sub"
    assert resolve_data_dir("explicit", cwd=inside, env={"HOIST_HOME": str(home)}) == (
        Path.cwd() / "explicit"
    )
    assert resolve_data_dir(None, cwd=inside, env={"HOIST_HOME": str(home)}) == home
    assert resolve_data_dir(None, cwd=inside, env={}) == project / ".hoist"
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    assert resolve_data_dir(None, cwd=tmp_path, env={}) == state / "hoist"


def test_a_stopped_stack_names_the_command_that_starts_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "stopped"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = _hoist(elsewhere, "sessions", env=_env(HOIST_HOME=str(data_dir)))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"hoist: the Hoist stack in {data_dir} is not running: start it with"
        f" `hoist up --data-dir {data_dir}` (or set HOIST_NATS_URL)"
    )
    # A relative --data-dir is named absolute: the advice works from any directory.
    result = _hoist(tmp_path, "--data-dir", "stopped", "sessions", env=_env())
    assert f"`hoist up --data-dir {data_dir}`" in result.stderr


def test_the_wrapper_runs_hoist_from_another_directory_of_a_new_terminal(
    hoist_stack: Stack, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    install = [sys.executable, "-m", "services.cli.path_wrapper"]
    install += ["--hoist", HOIST, "--bin-dir", str(bin_dir)]
    first = subprocess.run(install, capture_output=True, text=True, timeout=30)
    assert first.returncode == 0, first.stderr
    assert f"installed {bin_dir / 'hoist'}" in first.stdout
    assert f'export PATH="{bin_dir}:$PATH"' in first.stdout  # not on this PATH: the line to type
    again = subprocess.run(install, capture_output=True, text=True, timeout=30)
    assert "installed" not in again.stdout  # idempotent

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # A process in a new shell: the wrapper found on PATH, the binary it runs.
    term = Terminal()
    try:
        term.type(
            f"cd {elsewhere} && export PATH={bin_dir}:/usr/bin:/bin"
            f" HOIST_HOME={hoist_stack.data_dir}; hoist agents; echo EXIT=$?"
        )
        wait_for(lambda: re.search(r"EXIT=\d", term.screen()), timeout=30)
        screen = term.screen()
        assert "EXIT=0" in screen, screen
        assert "agent-1" in screen and "agent-2" in screen
    finally:
        term.close()


def test_the_wrapper_never_replaces_someone_elses_hoist(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hoist").write_text("#!/bin/sh\necho another tool\n")
    install = [sys.executable, "-m", "services.cli.path_wrapper"]
    result = subprocess.run(
        [*install, "--hoist", HOIST, "--bin-dir", str(bin_dir)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0
    assert "is not Hoist's wrapper: left as it is" in result.stdout
    assert f"alias hoist={HOIST}" in result.stdout
    assert MARK not in (bin_dir / "hoist").read_text()


def test_the_wrapper_of_another_live_checkout_is_kept_and_of_a_gone_one_replaced(
    tmp_path: Path,
) -> None:
    """Two checkouts on one machine (two people, root): the second ./dev up does not take the
    first one's `hoist` away; once that checkout is gone, its wrapper is replaced."""
    from services.cli.path_wrapper import script

    bin_dir, other = tmp_path / "bin", tmp_path / "other-hoist"
    bin_dir.mkdir()
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    (bin_dir / "hoist").write_text(script(other))
    install = [sys.executable, "-m", "services.cli.path_wrapper", "--hoist", HOIST]
    install += ["--bin-dir", str(bin_dir)]
    kept = subprocess.run(install, capture_output=True, text=True, timeout=30)
    assert f"runs another checkout's hoist ({other}): left as it is" in kept.stdout, kept.stdout
    assert f"alias hoist={HOIST}" in kept.stdout
    assert (bin_dir / "hoist").read_text() == script(other)
    other.unlink()
    replaced = subprocess.run(install, capture_output=True, text=True, timeout=30)
    assert f"installed {bin_dir / 'hoist'}" in replaced.stdout, replaced.stdout
    assert (bin_dir / "hoist").read_text() == script(Path(HOIST))


def test_where_the_wrapper_goes() -> None:
    home = Path("/home/ann")
    path = "/usr/local/bin:/usr/bin:/bin"
    assert choose_bin_dir(path, Path("/root"), True) == Place(Path("/usr/local/bin"), True)
    assert choose_bin_dir(f"{home}/bin:{path}", home, False) == Place(home / "bin", True)
    # A fresh machine: ~/.local/bin is on PATH only once it exists at login.
    assert choose_bin_dir(path, home, False) == Place(home / ".local" / "bin", False)


def test_the_banner_commands_work_from_another_directory(
    hoist_stack: Stack, tmp_path: Path
) -> None:
    banner = hoist_stack.log.read_text()
    m = re.search(r"^  (.+) ps \| sessions", banner, re.M)
    assert m, banner
    term = Terminal()  # a process in a shell: the banner's command line as typed
    try:
        term.type(f"cd {tmp_path} && {m[1]} agents; echo EXIT=$?")
        wait_for(lambda: re.search(r"EXIT=\d", term.screen()), timeout=30)
        assert "EXIT=0" in term.screen(), term.screen()
    finally:
        term.close()


def test_up_on_a_port_another_stack_holds_names_that_stack(
    hoist_stack: Stack, tmp_path: Path
) -> None:
    port = json.loads((hoist_stack.data_dir / "stack.json").read_text())["url"].rsplit(":", 1)[1]
    up = ["up", "--runtime", "dummy", "--no-demo", "--nats-port", port]
    # `up` runs as a process (PROCESS_ONLY).
    result = _hoist(tmp_path, *up, env=_env(HOIST_HOME=str(tmp_path / "other")))
    assert result.returncode == 1
    data_dir = hoist_stack.data_dir.resolve()
    assert f"port {port} is in use: pick another with --nats-port; it is the Hoist stack in" in (
        result.stderr
    )
    assert (
        f"use it with --data-dir {data_dir}, or stop it with `hoist down --data-dir {data_dir}`"
        in result.stderr
    )
