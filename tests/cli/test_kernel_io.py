"""What kernels run, through the command line, on dummy agents: `hoist run` with a command
(batch and interactive), `hoist logs`, `hoist exec`, `hoist volumes`, and the flag errors."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.cli.stack_harness import HOIST, Stack, run_hoist

_CREATED = re.compile(r"session ([0-9a-f]{32}) created")


@pytest.fixture(scope="module")
def image(hoist_stack: Stack) -> str:
    """One image for the module: pulled by the first test that runs it, held after."""
    return hoist_stack.next_image()


def session_of(stderr: str) -> str:
    m = _CREATED.search(stderr)
    assert m, stderr
    return m[1]


def interactive(stack: Stack, image: str, *args: str) -> str:
    """A RUNNING interactive session of ``sleep infinity``; its id."""
    done = stack.hoist("run", image, "-d", "--max-wait", "30", *args, "--", "sleep", "infinity")
    assert done.returncode == 0 and " RUNNING " in done.stdout, done.stdout + done.stderr
    return done.stdout.split()[1]


def test_a_batch_run_prints_the_output_and_exits_with_the_command_code(
    hoist_stack: Stack, image: str
) -> None:
    # A process: the command's code becomes the binary's, its output alone on the real stdout.
    done = hoist_stack.hoist_process(
        "run", "--batch", image, "--", "sh", "-c", "echo hello; exit 3"
    )
    assert done.returncode == 3, done.stdout + done.stderr
    # stdout is the command's output alone; the pull view and status lines go to stderr
    assert done.stdout == "hello\n"
    assert "TERMINATED exited: code 3" in done.stderr
    session_id = session_of(done.stderr)

    logs = hoist_stack.hoist("logs", session_id)
    assert logs.returncode == 0 and logs.stdout == "hello\n", logs.stderr
    logs = hoist_stack.hoist("logs", session_id, "--kernel", "main1", "--tail", "1", "-f")
    assert logs.returncode == 0 and logs.stdout == "hello\n", logs.stderr

    history = hoist_stack.hoist("history", session_id)
    assert '"exit_code":3' in history.stdout, history.stdout

    # a command without --batch is attached too (an interactive session whose command ends)
    done = hoist_stack.hoist("run", "-e", "GREETING=hi", image, "--", "sh", "-c", "echo $GREETING")
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
    done = hoist_stack.hoist("run", image, "echo", "plain", "words")  # no options: no `--`
    assert (done.returncode, done.stdout) == (0, "plain words\n"), done.stderr


def test_a_closed_stdout_ends_the_run_quietly(hoist_stack: Stack, image: str) -> None:
    # A process: its stdout is a pipe that closes, and the exit status is what a shell sees.
    pipeline = (
        f"{HOIST} --data-dir {hoist_stack.data_dir} run --batch {image} --"
        " sh -c 'echo one; sleep 1; echo two; sleep 1; echo three'"
        " | head -1; echo status=${PIPESTATUS[0]}"
    )
    done = subprocess.run(
        ["bash", "-c", pipeline], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout == "one\nstatus=0\n", done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Broken pipe" not in done.stderr, done.stderr


def test_exec_streams_the_output_and_exits_with_its_code(hoist_stack: Stack, image: str) -> None:
    session_id = interactive(hoist_stack, image, "-p", "8080")
    done = hoist_stack.hoist("exec", session_id, "--", "sh", "-c", "echo hi; exit 4")
    assert (done.returncode, done.stdout) == (4, "hi\n"), done.stderr
    # a command without options may follow SESSION without `--` (flags go before SESSION then)
    done = hoist_stack.hoist("exec", "-k", "main1", "-e", "X=y", session_id, "printenv", "X")
    assert (done.returncode, done.stdout) == (0, "y\n"), done.stderr
    done = hoist_stack.hoist("exec", session_id, "printenv", "HOIST_CLUSTER_ROLE")
    assert done.stdout.strip() == "main", done.stdout + done.stderr
    done = hoist_stack.hoist("exec", session_id, "--timeout", "0.5", "--", "sleep", "5")
    assert done.returncode == 124 and "timed out" in done.stderr, done.stdout + done.stderr

    done = hoist_stack.hoist("exec", session_id, "--kernel", "sub7", "--", "true")
    assert done.returncode == 1 and "sub7" in done.stderr and "Traceback" not in done.stderr

    # the port it publishes, as the session view and ps show it
    hoist_stack.in_read_model(session_id)
    ps = hoist_stack.hoist("ps", "--session", session_id)
    assert re.search(r"8080->[\d.]+:\d+", ps.stdout), ps.stdout
    assert hoist_stack.hoist("destroy", session_id).returncode == 0


def test_volumes_list_what_sessions_mounted(hoist_stack: Stack, image: str) -> None:
    done = hoist_stack.hoist(
        "run", "--batch", "--owner", "vic", "-v", "scratch:/data", image, "--", "true"
    )
    assert done.returncode == 0, done.stdout + done.stderr

    listed = hoist_stack.hoist("volumes", "--owner", "vic", "--json")
    assert listed.returncode == 0, listed.stderr
    volumes = json.loads(listed.stdout)["volumes"]
    assert [(v["name"], v["owner"]) for v in volumes] == [("scratch", "vic")]
    table = hoist_stack.hoist("volumes")
    assert re.search(r"agent-\d\s+scratch\s+vic", table.stdout), table.stdout
    assert "used by" in table.stdout

    refused = hoist_stack.hoist("volume", "rm", "scratch", "--owner", "eve")
    assert refused.returncode == 1 and "another owner" in refused.stderr, refused.stderr
    missing = hoist_stack.hoist("volume", "rm", "nothing-here")
    assert missing.returncode == 1 and "no volume 'nothing-here'" in missing.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("-e", "1X=y"), "-e 1X=y: '1X' is not a variable name"),
        (("-e", "HOIST_SESSION_ID=x"), "-e HOIST_SESSION_ID=x: HOIST_* variables are set by"),
        (("-v", "data"), "-v data: no path"),
        (("-v", "data:relative"), "-v data:relative: 'relative' must be an absolute path"),
        (("-v", "data:/d:rx"), "-v data:/d:rx: the mode after the path is ro or rw"),
        (("-p", "0"), "-p 0: a container port is a number from 1 to 65535"),
        (("-p", "80", "-p", "80"), "-p 80: port 80 is given twice"),
        (("-r", "gpu=many"), "-r gpu=many: gpu takes an amount"),
        (("-r", "cpu=0"), "-r cpu=0: cpu takes a number of cores > 0"),
        (("--workdir", "tmp"), "--workdir tmp: must be an absolute path"),
        (("--batch",), "--batch needs a command"),
    ],
)
def test_flag_errors_name_the_flag(tmp_path: Path, args: tuple[str, ...], expected: str) -> None:
    # Checked before connecting: no stack needed.
    command = () if "--batch" in args else ("--", "true")
    done = run_hoist(["--data-dir", str(tmp_path), "run", "test/image:1", *args, *command])
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(f"hoist: {expected}"), done.stderr


def test_cluster_mode_choices_are_named(tmp_path: Path) -> None:
    done = run_hoist(
        ["--data-dir", str(tmp_path), "run", "x:1", "--cluster-mode", "one", "--", "true"]
    )
    assert done.returncode == 2 and "--cluster-mode" in done.stderr


def test_the_readme_tour_runs_on_the_dummy_runtime(hoist_stack: Stack, image: str) -> None:
    """Issue 38, item 8: the tour's `hoist run` and `hoist exec` are what every runtime runs
    (its image swapped for one the test agents know), exiting as its comment says."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    tour = readme.split("## A five-minute tour", 1)[1].split("```sh\n", 1)[1].split("```")[0]
    argvs = [shlex.split(line.split("#")[0])[1:] for line in tour.splitlines()]
    run = next(argv for argv in argvs if argv[0] == "run")[1:]  # the first example
    assert run[0] == "python:3.12-slim", run
    done = hoist_stack.hoist_process("run", image, *run[1:])
    assert (done.returncode, done.stdout) == (3, "hello\n"), done.stderr
    assert "then hello; exits 3" in tour
    session_id = interactive(hoist_stack, image)
    exec_argv = next(argv for argv in argvs if argv[0] == "exec")[1:]
    assert exec_argv[0] == "1a2b3c", exec_argv
    ran = hoist_stack.hoist("exec", session_id, *exec_argv[1:])
    assert ran.returncode == 0 and re.fullmatch(r"[0-9a-f]{32}\n", ran.stdout), ran
