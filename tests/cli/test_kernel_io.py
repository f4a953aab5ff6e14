"""What kernels run, through the command line, on dummy agents: `hoist run` with a command
(batch and interactive), `hoist logs`, `hoist exec`, `hoist volumes`, and the flag errors."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli.stack_harness import HOIST, Stack, run_hoist, wait_for

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


def test_describe_shows_the_spec_each_kernel_the_quota_and_the_last_events(
    hoist_stack: Stack, image: str
) -> None:
    session_id = interactive(
        hoist_stack, image, "-n", "2", "-e", "GREETING=hi", "-p", "8080", "-v", "notes:/notes"
    )
    hoist_stack.in_read_model(session_id)  # a prefix resolves once the read models have it
    done = hoist_stack.hoist("describe", session_id[:10])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"Session:     {session_id}" in out
    assert "Status:      RUNNING  (running)" in out
    assert re.search(rf"^Image:       \S*{re.escape(image)}$", out, re.M), out
    assert re.search(
        r"^Type:        interactive, cluster \S+ of 2 kernel\(s\), resource group default$",
        out,
        re.M,
    ), out
    assert "Command:     sleep infinity" in out and "Env:         GREETING=hi" in out
    assert "Ports:       8080" in out and "Volumes:     notes:/notes" in out
    # Each kernel: where, status and why, its container, published port, its HOIST_* env.
    for name in ("main1", "sub1"):
        kernel = re.search(rf"^  {name}\s+([0-9a-f]{{32}})\s+on (agent-\d)\s+RUNNING", out, re.M)
        assert kernel, out
    assert len(re.findall(r"^\s+container [0-9a-f]{12}", out, re.M)) == 2, out
    assert len(re.findall(r"^\s+port 8080 -> [\d.]+:\d+$", out, re.M)) == 2, out
    assert f"HOIST_SESSION_ID={session_id}" in out
    assert "HOIST_CLUSTER_HOST=sub1" in out and "HOIST_CLUSTER_SIZE=2" in out
    # The owner's quota row, and the last events with who caused them.
    assert re.search(r"^Quota:\n  \S+: policy none", out, re.M), out
    events = re.search(r"^Events \(the last (\d+) of (\d+); all: hoist history\):", out, re.M)
    assert events and int(events[1]) == min(10, int(events[2])), out
    assert re.search(r"KernelCreated .*by manager", out), out
    assert "pull " not in out  # a finished pull is no longer shown (its task id is in -o json)

    # -o json: the same as one document (inspect: docker's word for it).
    doc = json.loads(hoist_stack.hoist("inspect", session_id, "-o", "json", "--events", "3").stdout)
    assert doc["session_id"] == session_id and doc["spec"]["env"] == {"GREETING": "hi"}
    assert [k["env"]["HOIST_CLUSTER_HOST"] for k in doc["kernels"]] == ["main1", "sub1"]
    assert all(k["ports"][0]["port"] == 8080 for k in doc["kernels"])
    assert doc["quota"]["owner"] == doc["owner"] and doc["quota_error"] is None
    assert len(doc["events"]) == 3 and doc["events_total"] >= 3
    assert doc["events"][0]["type"] and doc["events"][-1]["actor"]
    assert hoist_stack.hoist("destroy", session_id).returncode == 0


def test_describe_of_a_pulling_kernel_shows_the_pull_and_how_far_it_is(
    hoist_stack: Stack,
) -> None:
    done = hoist_stack.hoist("run", hoist_stack.next_big_image(), "-d")  # ~10 s of pull
    assert done.returncode == 0, done.stderr
    session_id = done.stdout.split()[1]
    out = ""

    def pulling() -> bool:
        nonlocal out
        out = hoist_stack.hoist("describe", session_id).stdout
        return re.search(r"pull [0-9a-f-]+: [\d.]+ MiB / 800\.0 MiB \([\d.]+ %\)", out) is not None

    wait_for(pulling, 20, interval=0.3)
    assert "PULLING" in out, out
    assert hoist_stack.hoist("destroy", session_id).returncode == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("describe", "0" * 32), "unknown session"),
        (("describe", "x", "--events", "-1"), "--events -1: a number of events from 0 to 10000"),
    ],
)
def test_describe_refuses_what_names_nothing(
    hoist_stack: Stack, args: tuple[str, ...], said: str
) -> None:
    done = hoist_stack.hoist(*args)
    assert done.returncode == 1 and said in done.stderr, done.stdout + done.stderr
    assert done.stdout == ""


def test_names_and_labels_name_sessions_filter_tables_and_stay_in_the_log(
    hoist_stack: Stack, image: str
) -> None:
    web = interactive(hoist_stack, image, "--name", "web", "-l", "team=ml", "-l", "tier=front")
    # The name is taken until its session ends: a second is refused naming the holder.
    again = hoist_stack.hoist("run", image, "-d", "--name", "web", "--", "sleep", "infinity")
    assert again.returncode == 1, again.stdout
    assert f"--name: 'web' is the name of session {web}, which has not ended" in again.stderr
    # Names no session id can start with ("db" is hex: one run's other session began "db").
    db = interactive(hoist_stack, image, "--name", "store", "-l", "team=ml")
    hoist_stack.in_read_model(db)

    # Every command that takes a session id takes its name.
    described = hoist_stack.hoist("describe", "web")
    assert f"Session:     {web}" in described.stdout, described.stdout + described.stderr
    assert "Name:        web" in described.stdout
    assert "Labels:      team=ml,tier=front" in described.stdout
    done = hoist_stack.hoist("exec", "store", "printenv", "HOIST_SESSION_ID")
    assert done.stdout.strip() == db, done.stdout + done.stderr

    # Filters: every label given must match; a key alone matches any value.
    def ids(*args: str) -> set[str]:
        reply = json.loads(hoist_stack.hoist(*args, "-o", "json").stdout)
        return {row["session_id"] for row in reply["rows"]}

    assert ids("sessions", "-l", "team=ml") == {web, db}
    assert ids("sessions", "-l", "team=ml", "-l", "tier=front") == {web}
    assert ids("sessions", "-l", "tier") == {web}
    assert ids("ps", "-l", "tier=front") == {web}
    table = hoist_stack.hoist("sessions", "-l", "team=ml").stdout
    assert re.search(r"\bweb\b.*team=ml,tier=front", table), table

    # The name and labels are in the event that created the session (replay and audit).
    history = hoist_stack.hoist("history", "web").stdout
    assert '"name":"web"' in history and '"labels":{"team":"ml","tier":"front"}' in history

    # Ended, the name is free again; the name still finds the ended session until reused.
    assert hoist_stack.hoist("destroy", "web").returncode == 0
    reused = interactive(hoist_stack, image, "--name", "web")
    hoist_stack.in_read_model(reused)
    assert f"Session:     {reused}" in hoist_stack.hoist("describe", "web").stdout
    for sid in (db, reused):
        assert hoist_stack.hoist("destroy", sid).returncode == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--name=-bad",), "--name -bad: 1-63 letters, digits"),
        (("--name", "a b"), "--name a b: 1-63 letters, digits"),
        (("-l", "team"), "--label team: give key=value (e.g. --label team=ml)"),
        (("-l", "a b=c"), "--label a b=c: the key is 1-63 letters"),
        (("-l", "k=v v"), "--label k=v v: the value is at most 63"),
    ],
)
def test_bad_names_and_labels_are_refused_naming_the_flag(
    hoist_stack: Stack, image: str, args: tuple[str, ...], said: str
) -> None:
    done = hoist_stack.hoist("run", image, "-d", *args, "--", "true")
    assert done.returncode in (1, 2) and said in done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


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


def test_completion_offers_the_stacks_sessions_agents_and_images_in_bash_and_fish(
    hoist_stack: Stack, image: str, tmp_path: Path
) -> None:
    session_id = interactive(hoist_stack, image, "--name", "tabme")
    hoist_stack.in_read_model(session_id)
    env = {
        **os.environ,
        "PATH": f"{Path(HOIST).parent}:{os.environ['PATH']}",
        "HOIST_HOME": str(hoist_stack.data_dir),
    }
    bash, fish = tmp_path / "hoist.bash", tmp_path / "hoist.fish"
    bash.write_text(run_hoist(["completion", "bash"]).stdout)
    fish.write_text(run_hoist(["completion", "fish"]).stdout)

    def in_bash(line: str) -> list[str]:
        words = line.split(" ")
        driver = (
            f"source {bash}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1};"
            f" COMP_LINE='{line}'; COMP_POINT={len(line)}; _shtab_hoist;"
            ' printf "%s\\n" "${COMPREPLY[@]}"'
        )
        done = subprocess.run(["bash", "-c", driver], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    def in_fish(line: str) -> list[str]:
        driver = f"source {fish}; complete -C '{line}'"
        done = subprocess.run(["fish", "-c", driver], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return [row.split("\t")[0] for row in done.stdout.splitlines()]

    assert in_bash("hoist describe tab") == ["tabme"]
    assert session_id[:12] in in_bash(f"hoist destroy {session_id[:3]}")
    assert {"agent-1", "agent-2"} <= set(in_bash("hoist images --agent agent-"))
    assert "tabme" in in_fish("hoist watch ")
    assert session_id[:12] in in_fish("hoist logs ")
    assert f"{image}" in in_fish("hoist run test/")
    # Nothing to offer without a stack: no error on the user's prompt.
    gone = {**env, "HOIST_HOME": str(tmp_path / "none")}
    quiet = subprocess.run(
        [HOIST, "__complete", "sessions", ""], env=gone, capture_output=True, text=True
    )
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    assert hoist_stack.hoist("destroy", session_id).returncode == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("run", "x:1", "-d", "--name", "0123456789abcdef0123456789abcdef"),
            "looks like a session id",
        ),
        (("describe", "x", "--events", str(2**64)), "a number of events from 0 to 10000"),
        (("ps", "-l", "="), "-l =: give K=V or K"),
        (("sessions", "-l", "team=%"), "-l team=%: give K=V or K"),
        (("describe", "\x1b[2Jx"), "\\x1b[2Jx"),
    ],
)
def test_hostile_names_filters_and_numbers_get_one_clear_line(
    hoist_stack: Stack, args: tuple[str, ...], said: str
) -> None:
    done = hoist_stack.hoist(*args)
    assert done.returncode == 1 and said in done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "\x1b" not in done.stderr


def test_a_config_reload_mid_call_loses_no_agent_reply(hoist_stack: Stack, image: str) -> None:
    """`hoist user add` reloads nats-server; an agent answering the manager meanwhile (an exec
    streaming its output) still gets its replies through (found by a trial: they were refused
    as the reload reset the agent's response permissions)."""
    session_id = interactive(hoist_stack, image)
    argv = [HOIST, "--data-dir", str(hoist_stack.data_dir), "exec", session_id]
    exec_ = subprocess.Popen(
        [*argv, "--", "sh", "-c", "sleep 3; echo done"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(1)
        for name in ("reload1", "reload2"):
            assert hoist_stack.hoist("user", "add", name).returncode == 0
        out, err = exec_.communicate(timeout=30)
    finally:
        exec_.kill()
    assert (exec_.returncode, out) == (0, "done\n"), err
    assert hoist_stack.hoist("destroy", session_id).returncode == 0
