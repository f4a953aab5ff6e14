"""`hoist up`'s processes live and die with it: SIGKILL or SIGHUP of `hoist up` leaves no child
behind, one stack per data dir (also against a dying stack's processes), and a restart on the
same data dir and port works at once, TIME_WAIT sockets or not."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.stack.natsserver import free_port
from services.stack.up import LOCK_WAIT_S, _running
from tests.cli.stack_harness import HOIST, Stack, Terminal, start_stack, stop_stack, wait_for
from transport.pdeathsig import NoParentDeathSignal, die_with_parent


def _pids(stack: Stack) -> dict[str, int]:
    return _pids_in(stack.data_dir)


def _pids_in(data_dir: Path) -> dict[str, int]:
    return json.loads((data_dir / "stack.json").read_text())["pids"]


def _alive(pids: dict[str, int]) -> dict[str, int]:
    return {name: pid for name, pid in pids.items() if _running(pid)}


def _kill_left(pids: dict[str, int]) -> None:
    """Whatever a failed test left running: not the next test's problem."""
    for pid in _alive(pids).values():
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def recorded() -> Iterator[dict[str, int]]:
    pids: dict[str, int] = {}
    yield pids
    _kill_left(pids)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
def test_no_child_outlives_up_and_up_starts_again_at_once(
    tmp_path: Path, port: int, recorded: dict[str, int], sig: signal.Signals
) -> None:
    data_dir = tmp_path / "data"
    stack = start_stack(data_dir, "--agents", "2", "--no-demo", "--nats-port", str(port))
    recorded.update(_pids(stack))
    assert set(recorded) == {"nats-server", "manager", "agent-1", "agent-2", "web"}
    assert _alive(recorded) == recorded

    stack.proc.send_signal(sig)
    if sig == signal.SIGHUP:  # its terminal closed: an orderly stop, as on Ctrl-C
        assert stack.proc.wait(30) == 0
        assert "Hoist stack stopped" in stack.log.read_text()
        assert not (data_dir / "stack.json").exists()
        assert not _alive(recorded)
    else:
        stack.proc.wait(5)  # a killed process cleans nothing up: only the kernel ends its children

    # At once, without waiting for anything: the new `hoist up` waits for the old processes
    # to release the data dir's lock (they all hold it), then finds the port free.
    started = time.monotonic()
    again = start_stack(data_dir, "--agents", "2", "--no-demo", "--nats-port", str(port))
    took = time.monotonic() - started
    assert not _alive(recorded), "a process of the killed stack outlived it"
    recorded.update({f"again-{k}": v for k, v in _pids(again).items()})
    print(f"{sig.name}: restart ready in {took:.1f}s")
    try:
        agents = again.hoist("agents")
        assert agents.returncode == 0, agents.stderr
        assert "agent-1" in agents.stdout and "agent-2" in agents.stdout
    finally:
        assert stop_stack(again) == 0, again.log.read_text()
    assert not _alive(recorded)


def test_closing_its_terminal_stops_the_stack(tmp_path: Path, recorded: dict[str, int]) -> None:
    data_dir = tmp_path / "data"
    term = Terminal()
    try:
        term.type(
            f"{HOIST} --data-dir {data_dir} up --runtime dummy --agents 1 --no-demo"
            f" --nats-port {free_port()}"
        )
        wait_for(lambda: "Running; Ctrl-C" in term.screen(), timeout=60)
        recorded.update(_pids_in(data_dir))
        assert set(recorded) == {"nats-server", "manager", "agent-1", "web"}
    finally:
        term.close()  # the terminal goes away: its processes get SIGHUP
    # Stopped in order, not killed: hoist up removes stack.json after its last child is gone
    # (a killed one would leave it, and this would time out).
    stack_file = data_dir / "stack.json"
    wait_for(lambda: not _alive(recorded) and not stack_file.exists(), timeout=15, interval=0.05)


def test_a_clean_stop_then_a_restart_on_the_same_port_despite_time_wait(
    tmp_path: Path, port: int, recorded: dict[str, int]
) -> None:
    data_dir = tmp_path / "data"
    stack = start_stack(data_dir, "--agents", "1", "--no-demo", "--nats-port", str(port))
    recorded.update(_pids(stack))
    # A connection nats-server closes first (at shutdown) leaves its side in TIME_WAIT on the
    # server's port once the peer closes too: the state that made a restart say "port in use".
    peer = threading.Thread(target=_read_until_closed, args=(port,))
    peer.start()
    assert stop_stack(stack) == 0
    peer.join(10)
    assert _time_wait_on(port), "the test needs a TIME_WAIT socket on the port"
    again = start_stack(data_dir, "--agents", "1", "--no-demo", "--nats-port", str(port))
    recorded.update({f"again-{k}": v for k, v in _pids(again).items()})
    try:
        assert again.hoist("agents").returncode == 0
    finally:
        assert stop_stack(again) == 0


def test_a_second_up_on_a_running_data_dir_is_refused_and_the_first_unharmed(
    tmp_path: Path, recorded: dict[str, int]
) -> None:
    data_dir = tmp_path / "data"
    stack = start_stack(data_dir, "--agents", "1", "--no-demo")
    recorded.update(_pids(stack))
    try:
        started = time.monotonic()
        second = stack.hoist(  # `up`: a process (PROCESS_ONLY)
            "up", "--runtime", "dummy", "--no-demo", "--nats-port", str(free_port()), timeout=30
        )
        assert time.monotonic() - started < LOCK_WAIT_S, "a running stack is refused at once"
        assert second.returncode == 1
        pid = stack.proc.pid
        assert f"a stack already runs in {data_dir.resolve()} (hoist up pid {pid}," in second.stderr
        assert f"`kill {pid}`" in second.stderr
        assert f"`hoist down --data-dir {data_dir.resolve()}`" in second.stderr
        assert "Traceback" not in second.stderr
        assert "stopped" not in second.stdout  # it never started anything
        assert _alive(recorded) == recorded
        assert _pids(stack) == recorded  # its stack.json is still the first stack's
        agents = stack.hoist("agents")
        assert agents.returncode == 0 and "agent-1" in agents.stdout
    finally:
        assert stop_stack(stack) == 0


def test_up_waits_for_and_names_the_processes_still_holding_the_data_dir(
    tmp_path: Path, recorded: dict[str, int]
) -> None:
    # An orphan of a `hoist up` that is gone (its pid is dead) still holds the lock: a child
    # that inherited the lock file, as the stack's processes do.
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    lock = os.open(data_dir / "stack.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(lock,)
    )
    os.close(lock)
    recorded["orphan"] = orphan.pid
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (data_dir / "stack.json").write_text(
        json.dumps({"url": "nats://127.0.0.1:1", "pid": gone.pid, "pids": {"manager": orphan.pid}})
    )
    started = time.monotonic()
    up = subprocess.run(  # a process: `up` runs until a signal stops it
        [HOIST, "--data-dir", str(data_dir), "up", "--runtime", "dummy", "--no-demo"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    waited = time.monotonic() - started
    assert up.returncode == 1
    assert f"still hold it after 5s (pids {orphan.pid})" in up.stderr
    assert f"`kill {orphan.pid}`" in up.stderr
    assert f"`hoist down --data-dir {data_dir.resolve()}`" in up.stderr
    assert waited >= 5
    orphan.kill()
    orphan.wait()
    # Once the holder is gone the same command starts (and the lock went with the holder).
    stack = start_stack(data_dir, "--agents", "0", "--no-demo")
    recorded.update(_pids(stack))
    assert stop_stack(stack) == 0


def _read_until_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as peer:
        while peer.recv(4096):
            pass


def _time_wait_on(port: int) -> bool:
    """Whether a TCP socket with local port ``port`` is in TIME_WAIT (state 06)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "06":
            return True
    return False


def test_die_with_parent_refuses_what_it_cannot_keep(monkeypatch: pytest.MonkeyPatch) -> None:
    errors: list[Exception] = []

    def off_main() -> None:
        try:
            die_with_parent(signal.SIGKILL)
        except NoParentDeathSignal as e:
            errors.append(e)

    thread = threading.Thread(target=off_main)
    thread.start()
    thread.join()
    assert errors and "spawn from the main thread" in str(errors[0])
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(NoParentDeathSignal, match="this needs Linux"):
        die_with_parent(signal.SIGKILL)
