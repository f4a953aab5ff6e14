"""`hoist down` stops a stack from any terminal (every process of it, only those), again and
again; `hoist up` brings it back with its data; `hoist status` says what runs and what not."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from services.cli.stack_cmds import _docker
from services.stack.up import DEFAULT_PORT, _running, remembered_port
from tests.cli.stack_harness import Stack, run_hoist, start_stack, stop_stack, wait_for


def _hoist(cwd: Path, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`hoist ARGS` from ``cwd``, the stack named by $HOIST_HOME only; `down` as a process
    (PROCESS_ONLY: it stops a stack by signals, as from another terminal)."""
    env = {k: v for k, v in os.environ.items() if k != "HOIST_NATS_URL"}
    return run_hoist(args, env={**env, "HOIST_HOME": str(data_dir)}, cwd=cwd, timeout=90)


def _pids(data_dir: Path) -> dict[str, int]:
    return json.loads((data_dir / "stack.json").read_text())["pids"]


def _status(cwd: Path, data_dir: Path) -> tuple[int, dict[str, dict[str, object]]]:
    result = _hoist(cwd, data_dir, "status", "-o", "json")
    doc = json.loads(result.stdout)
    assert doc["ok"] == (result.returncode == 0)
    return result.returncode, {c["check"]: c for c in doc["checks"]}


def test_down_stops_every_process_and_up_brings_the_data_back(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    stack = start_stack(data_dir, "--agents", "2", "--no-demo")
    pids = _pids(data_dir)
    try:
        run = stack.hoist("run", "-d", stack.next_image())
        assert run.returncode == 0, run.stderr
        session_id = run.stdout.split()[1]
        # A dead agent is a problem `hoist status` names, with its log. `hoist up` starts a
        # dead child again after a second, sooner than a loaded CI starts `hoist status`
        # (which then saw the new pid alive): it is paused until the status is read.
        os.kill(stack.proc.pid, signal.SIGSTOP)
        try:
            os.kill(pids["agent-2"], signal.SIGKILL)
            # Dead once the kernel has delivered the kill: a status asked in-process comes
            # sooner than that can be on a loaded machine.
            wait_for(lambda: not _running(pids["agent-2"]), 10, interval=0.01)
            code, checks = _status(elsewhere, data_dir)
        finally:
            os.kill(stack.proc.pid, signal.SIGCONT)
        assert code == 1
        assert not checks["agent-2"]["ok"] and "gone" in str(checks["agent-2"]["detail"])
        assert f"{data_dir}/logs/agent-2.log" in str(checks["agent-2"]["next"])
        assert checks["agent-1"]["ok"] and checks["nats"]["ok"] and checks["queries"]["ok"]

        port = int(json.loads((data_dir / "stack.json").read_text())["url"].rsplit(":", 1)[1])
        down = _hoist(elsewhere, data_dir, "down")
        assert down.returncode == 0, down.stderr
        # `hoist up --data-dir D`, as advised, comes back on the port it had (not 4222).
        assert remembered_port(data_dir) == port
        assert f"stopped the Hoist stack in {data_dir}" in down.stdout
        assert f"`hoist up --data-dir {data_dir}`" in down.stdout
        assert stack.proc.wait(30) == 0  # `hoist up` stopped in order, as on Ctrl-C
        assert "Hoist stack stopped" in stack.log.read_text()
        assert not any(_running(pid) for pid in pids.values()), pids
        assert not (data_dir / "stack.json").exists()

        again = _hoist(elsewhere, data_dir, "down")  # idempotent
        assert again.returncode == 0
        assert again.stdout.strip() == f"no Hoist stack runs in {data_dir}: nothing to stop"
    finally:
        stop_stack(stack)

    restarted = start_stack(data_dir, "--agents", "1", "--no-demo")
    try:
        sessions = _hoist(elsewhere, data_dir, "sessions", "--json")
        assert session_id in {r["session_id"] for r in json.loads(sessions.stdout)["rows"]}
    finally:
        assert _hoist(elsewhere, data_dir, "down").returncode == 0
        assert restarted.proc.wait(30) == 0


def test_down_stops_the_processes_a_killed_up_left_and_nothing_else(tmp_path: Path) -> None:
    # Processes still holding the data dir's lock after their `hoist up` is gone (as in
    # test_up_lifetime): down stops them; a pid stack.json names but that holds no lock
    # (the system gave the number to another process) is left alone.
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    lock = os.open(data_dir / "stack.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    orphan = subprocess.Popen(sleep, pass_fds=(lock,))
    os.close(lock)
    stranger = subprocess.Popen(sleep)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    state = {"pid": gone.pid, "pids": {"manager": orphan.pid, "agent-1": stranger.pid}}
    (data_dir / "stack.json").write_text(json.dumps({"url": "nats://127.0.0.1:1", **state}))
    try:
        code, checks = _status(tmp_path, data_dir)
        assert code == 1 and "processes still hold it" in str(checks["stack"]["detail"])
        assert "hoist down" in str(checks["stack"]["next"])

        down = _hoist(tmp_path, data_dir, "down")
        assert down.returncode == 0, down.stderr
        assert f"stopped the Hoist stack in {data_dir} (manager)" in down.stdout
        assert orphan.wait(10) == -signal.SIGTERM
        assert stranger.poll() is None
    finally:
        for proc in (orphan, stranger):
            proc.kill()
            proc.wait()


def test_status_of_a_running_and_a_stopped_stack(hoist_stack: Stack, tmp_path: Path) -> None:
    running = _hoist(tmp_path, hoist_stack.data_dir, "status")
    assert running.returncode == 0, running.stdout + running.stderr
    lines = running.stdout.splitlines()
    assert all(line.startswith("ok ") for line in lines), running.stdout
    for name in ("stack", "nats-server", "manager", "agent-1", "nats", "queries", "disk"):
        assert any(line.split()[1] == name for line in lines), (name, running.stdout)
    code, checks = _status(tmp_path, hoist_stack.data_dir)
    assert code == 0
    assert checks["agents"]["detail"] == "2 alive (agent-1, agent-2)"
    assert str(checks["read models"]["detail"]).startswith(("up to date", "caught up"))
    assert "docker" not in checks  # dummy agents: no engine to check

    stopped = tmp_path / "stopped"
    result = _hoist(tmp_path, stopped, "status")
    assert result.returncode == 1
    assert result.stdout.splitlines()[0] == (
        f"PROBLEM  stack  not running in {stopped}: start it with `hoist up --data-dir {stopped}`"
    )
    code, checks = _status(tmp_path, stopped)
    assert code == 1 and set(checks) == {"stack", "disk"} and checks["disk"]["ok"]


def test_status_checks_the_docker_engine_of_docker_agents(
    docker_engine: str, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    stack = start_stack(
        data_dir,
        "--runtime",
        "docker",
        "--docker-host",
        docker_engine,
        "--agents",
        "1",
        "--no-demo",
    )
    try:
        code, checks = _status(tmp_path, data_dir)
        assert code == 0, checks
        assert checks["docker"]["ok"]
        assert f"at {docker_engine}" in str(checks["docker"]["detail"])
        assert str(checks["docker"]["detail"]).startswith("Docker Engine ")
    finally:
        assert stop_stack(stack) == 0


def test_an_unreachable_docker_engine_is_a_problem_with_what_to_do() -> None:
    check = _docker("unix:///nonexistent/docker.sock")
    assert not check.ok and "no Docker Engine reachable at unix:///nonexistent" in check.detail
    assert "start dockerd" in check.next


def test_a_data_dir_without_a_good_remembered_port_gets_the_default(tmp_path: Path) -> None:
    assert remembered_port(tmp_path) == DEFAULT_PORT
    for text in ("", "x", "70000", "-1"):
        (tmp_path / "nats-port").write_text(text)
        assert remembered_port(tmp_path) == DEFAULT_PORT, text
    (tmp_path / "nats-port").write_text("4411\n")
    assert remembered_port(tmp_path) == 4411


def test_status_says_where_the_web_view_and_metrics_answer_and_what_dummy_simulates(
    hoist_stack: Stack, tmp_path: Path
) -> None:
    """Issue 38, items 5 and 8: the web view's login link (what `hoist web --url` prints), each
    process's /metrics, and on the dummy runtime that ports and volumes are simulated."""
    code, checks = _status(tmp_path, hoist_stack.data_dir)
    assert code == 0, checks
    login = str(checks["web-view"]["detail"])
    printed = _hoist(tmp_path, hoist_stack.data_dir, "web", "--url")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == f"{login}\n"
    assert login.startswith("http://127.0.0.1:") and "/?token=" in login
    with httpx.Client(follow_redirects=True, timeout=10) as web:
        assert web.get(login).status_code == 200  # the link logs the admin in
        assert web.get(login.split("?")[0]).status_code == 200  # by its cookie now
    assert httpx.get(login.split("?")[0], timeout=10).status_code == 401  # the token is needed
    metrics = dict(part.split(" ") for part in str(checks["metrics"]["detail"]).split(", "))
    assert {"manager", "agent-1", "agent-2"} <= set(metrics), metrics
    for url in metrics.values():
        answer = httpx.get(url, timeout=10)
        assert answer.status_code == 200 and "hoist_" in answer.text, url
    runtime = str(checks["runtime"]["detail"])
    assert runtime.startswith("dummy, which simulates pulls, and kernels that run only sleep,")
    assert "published ports and volumes are simulated too" in runtime
    text = _hoist(tmp_path, hoist_stack.data_dir, "status").stdout
    assert f"ok       web-view     {login}" in text, text
    # `hoist up` said the same when it started.
    assert f"the dummy runtime simulates {runtime.removeprefix('dummy, which simulates ')}" in (
        hoist_stack.log.read_text()
    )


def test_web_url_without_a_web_view_says_what_to_do(tmp_path: Path) -> None:
    result = _hoist(tmp_path, tmp_path / "none", "web", "--url")
    assert result.returncode == 1
    assert result.stderr == (
        f"hoist: no Hoist stack runs in {tmp_path / 'none'}: start one with"
        f" `hoist up --data-dir {tmp_path / 'none'}` (it starts the web view)\n"
    )
