"""The in-process `hoist` of tests/cli/stack_harness.py shows what a `hoist` process would: its
log records on stderr, none of another thread's output, and a command stuck past its timeout
does not write into the commands after it."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from services.stack import home as stack_home
from tests.cli import stack_harness
from tests.cli.stack_harness import run_hoist

log = logging.getLogger("services.cli.harness_test")
NOT_RUNNING = "is not running: start it with `hoist up"


def test_a_logged_warning_is_on_stderr_as_a_process_prints_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolve = stack_home.resolve_data_dir

    def warns(given: str | None) -> Path:
        try:
            raise OSError("the disk is gone")
        except OSError:
            log.exception("could not look")
        log.info("not shown: below WARNING")
        log.warning("careful: %s", "x")
        return resolve(given)

    monkeypatch.setattr(stack_home, "resolve_data_dir", warns)
    result = run_hoist(["--data-dir", str(tmp_path), "ps"], timeout=30)

    # What a `hoist` process prints for the same record (it configures no logging).
    code = "import logging, services.cli.main; logging.getLogger('t').warning('careful: %s', 'x')"
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stderr
    assert printed == "careful: x\n"
    lines = result.stderr.splitlines()
    assert lines[:2] == ["could not look", "Traceback (most recent call last):"], result.stderr
    assert "OSError: the disk is gone" in lines
    assert "careful: x" in lines and "not shown" not in result.stderr
    assert lines[-1].startswith("hoist: ") and NOT_RUNNING in lines[-1], result.stderr
    assert result.returncode == 1


def test_another_threads_output_stays_out_of_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inside, written = threading.Event(), threading.Event()
    resolve = stack_home.resolve_data_dir

    def waits(given: str | None) -> Path:
        inside.set()
        assert written.wait(10)
        return resolve(given)

    def elsewhere() -> None:
        assert inside.wait(10)
        print("from elsewhere")
        print("elsewhere err", file=sys.stderr)
        log.warning("elsewhere logged")
        written.set()

    monkeypatch.setattr(stack_home, "resolve_data_dir", waits)
    other = threading.Thread(target=elsewhere)
    other.start()
    result = run_hoist(["--data-dir", str(tmp_path), "ps"], timeout=30)
    other.join(10)

    assert result.stdout == "" and "elsewhere" not in result.stderr, result
    assert result.stderr.startswith("hoist: ") and NOT_RUNNING in result.stderr
    seen = capsys.readouterr()
    assert "from elsewhere" in seen.out and "elsewhere err" in seen.err


def test_after_a_command_outlives_its_timeout_commands_run_as_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack_harness, "_LEFT_RUNNING", [])
    entered: list[str | None] = []
    release = threading.Event()
    resolve = stack_home.resolve_data_dir

    def stuck(given: str | None) -> Path:
        entered.append(given)
        release.wait(30)
        print("late output")
        return resolve(given)

    monkeypatch.setattr(stack_home, "resolve_data_dir", stuck)
    argv = ["--data-dir", str(tmp_path), "ps"]
    with pytest.raises(subprocess.TimeoutExpired):
        run_hoist(argv, timeout=0.5)
    try:
        result = run_hoist(argv, timeout=30)
    finally:
        release.set()
        (left,) = stack_harness._LEFT_RUNNING
        left.join(10)
    assert len(entered) == 1, "the second command ran in this process"
    assert result.returncode == 1 and NOT_RUNNING in result.stderr, result
    assert "late output" not in result.stdout
