"""The command-line conventions people expect, on a real stack: short ids, errors in the
flags' terms, --version, -o json on every command that prints data, ps / ps -a, a quiet
closed pipe, shell completion."""

from __future__ import annotations

import json
import subprocess
from importlib import metadata
from typing import Any

import pytest

from client.connection import ReplyError
from domain.errors import unknown_session
from services.cli.did_you_mean import innermost as command_parser
from services.cli.flag_errors import in_flag_terms
from services.cli.main import build_parser
from tests.cli.stack_harness import HOIST, Stack, run_hoist
from tests.cli.test_errors import one_line_error


def hoist_json(stack: Stack, *args: str) -> Any:
    result = stack.hoist(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def in_read_model(stack: Stack, session_id: str, status: str | None = None) -> None:
    """The sessions query has the session (in ``status``), as of its last event so far:
    prefixes resolve through it."""
    row = stack.in_read_model(session_id)
    assert status in (None, row["status"]), row


def created(stack: Stack, *args: str) -> dict[str, Any]:
    """`hoist run -d -o json IMAGE ...`: the created session."""
    session = hoist_json(stack, "run", "-d", "-o", "json", *args)
    assert isinstance(session, dict)
    return session


def test_a_unique_prefix_names_the_session(hoist_stack: Stack) -> None:
    session = created(hoist_stack, hoist_stack.next_image(), "--max-wait", "30")
    sid = session["session_id"]
    assert session["status"] == "RUNNING" and session["created"] is True, session
    in_read_model(hoist_stack, sid)
    short = sid[:12]  # what the tables print

    watched = hoist_stack.hoist("watch", short)
    assert watched.returncode == 0 and f"session {sid} RUNNING" in watched.stdout, watched
    history = hoist_stack.hoist("history", short)
    assert history.returncode == 0 and f"session:{sid}  SessionEnqueued" in history.stdout
    rows = hoist_json(hoist_stack, "ps", "--session", short[:8], "-o", "json")["rows"]
    assert {r["session_id"] for r in rows} == {sid}
    destroyed = hoist_stack.hoist("destroy", short)
    assert destroyed.returncode == 0 and destroyed.stdout.startswith(f"session {sid} ")

    one_line_error(hoist_stack.hoist("destroy", "zz"), unknown_session("zz"))
    one_line_error(hoist_stack.hoist("logs", "zz"), unknown_session("zz"))

    # Several at once, as `docker rm`: one that fails is said, the others still go.
    two = [created(hoist_stack, hoist_stack.next_image())["session_id"] for _ in range(2)]
    for sid in two:
        in_read_model(hoist_stack, sid)
    several = hoist_stack.hoist("destroy", two[0][:12], "zz", two[1])
    assert several.returncode == 1, several
    assert [line.split()[1] for line in several.stdout.splitlines()] == two, several.stdout
    assert several.stderr == f"hoist: zz: {unknown_session('zz')}\n", several.stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("run", "test/image-0:1", "-n", "0"), "-n/--cluster-size must be at least 1"),
        (("run", "test/image-0:1", "-d", "--max-wait", "5000"), "--max-wait must be at most"),
        (
            ("run", "test/image-0:1", "-d", "--resource-group", "a b"),
            "--resource-group must be 1-128 letters, digits, '_' or '-'",
        ),
        (
            ("run", "test/image-0:1", "-d", "--resource-group", "defualt"),
            "--resource-group: no resource group 'defualt' is known (no admin defined it and no"
            " agent joined it); did you mean 'default'? `hoist group list` shows them",
        ),
        (("ps", "--limit", "0"), "--limit must be an integer from 1 to 10000, got 0"),
    ],
)
def test_wire_errors_name_the_flag(hoist_stack: Stack, args: tuple[str, ...], line: str) -> None:
    result = hoist_stack.hoist(*args)
    one_line_error(result, line)
    assert result.stderr.startswith(f"hoist: {line}"), result.stderr
    assert "$." not in result.stderr and "Expected" not in result.stderr


def test_version(hoist_stack: Stack) -> None:
    # A process: the installed `hoist` entry point and its package's metadata.
    result = subprocess.run([HOIST, "--version"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert result.stdout == f"hoist {metadata.version('hoist')}\n"


def test_every_data_command_prints_json(hoist_stack: Stack) -> None:
    session = created(hoist_stack, hoist_stack.next_image(), "--max-wait", "30")
    sid = session["session_id"]
    assert session["status"] == "RUNNING" and len(session["kernels"]) == 1, session
    in_read_model(hoist_stack, sid)
    for command in ("ps", "sessions", "agents", "images", "occupancy", "pulls"):
        for flag in (("-o", "json"), ("--json",)):
            reply = hoist_json(hoist_stack, command, *flag)
            assert isinstance(reply["rows"], list) and reply["rows"], (command, reply)
    assert "volumes" in hoist_json(hoist_stack, "volumes", "-o", "json")
    lines = hoist_stack.hoist("history", sid, "-o", "json").stdout.splitlines()
    events = [json.loads(line) for line in lines]
    assert events[0]["type"] == "SessionEnqueued" and events[0]["id"] == sid, events[0]
    assert all(e["aggregate"] == "session" for e in events)
    first = json.loads(hoist_stack.hoist("events", "-o", "json").stdout.splitlines()[0])
    assert first["seq"] == 1
    # Admin ones (the stack's admin credentials from the data dir)
    assert "policies" in hoist_json(hoist_stack, "quota", "show", "-o", "json")
    assert "groups" in hoist_json(hoist_stack, "group", "list", "-o", "json")
    assert "users" in hoist_json(hoist_stack, "user", "list", "-o", "json")
    assert "plans" in hoist_json(hoist_stack, "image", "policy", "plan", "-o", "json")
    assert hoist_json(hoist_stack, "sql", "SELECT 1 AS one", "-o", "json")["rows"] == [[1]]
    destroyed = hoist_json(hoist_stack, "destroy", sid[:12], "-o", "json")
    assert destroyed["session_id"] == sid and destroyed["status"] in ("TERMINATING", "TERMINATED")
    wide = hoist_stack.hoist("ps", "-a", "-o", "wide", "--session", sid)
    assert sid in wide.stdout and "resource_group" in wide.stdout  # whole ids, every column


def test_ps_shows_live_kernels_and_ps_a_all(hoist_stack: Stack) -> None:
    live = created(hoist_stack, hoist_stack.next_image(), "--max-wait", "30")["session_id"]
    ended = created(hoist_stack, hoist_stack.next_image(), "--max-wait", "30")["session_id"]
    assert hoist_stack.hoist("destroy", ended, "--forced").returncode == 0
    in_read_model(hoist_stack, ended, "TERMINATED")
    in_read_model(hoist_stack, live, "RUNNING")
    shown = {r["session_id"] for r in hoist_json(hoist_stack, "ps", "-o", "json")["rows"]}
    every = {r["session_id"] for r in hoist_json(hoist_stack, "ps", "-a", "-o", "json")["rows"]}
    assert live in shown and ended not in shown
    assert {live, ended} <= every
    table = hoist_stack.hoist("ps").stdout
    assert live[:12] in table and ended[:12] not in table


@pytest.mark.parametrize("command", ["events", "ps", "sessions"])
def test_a_closed_pipe_ends_quietly(hoist_stack: Stack, command: str) -> None:
    # Some rows and events to write (several lines: head closes the pipe after the first).
    assert hoist_stack.hoist("run", "-d", hoist_stack.next_image(), "-n", "2").returncode == 0
    # A process: its stdout is a pipe that closes, and the exit status is what a shell sees.
    result = subprocess.run(
        ["bash", "-c", f"{HOIST} --data-dir {hoist_stack.data_dir} {command} | head -1;"
         " echo \"exit ${PIPESTATUS[0]}\""],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.stdout.splitlines()[-1] == "exit 0", result.stdout + result.stderr
    assert "Broken pipe" not in result.stderr and "hoist:" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_completion_scripts_come_from_the_parser(tmp_path: Any) -> None:
    bash = run_hoist(["completion", "bash"])
    assert bash.returncode == 0, bash.stderr
    for word in ("destroy", "history", "--cluster-size", "completion"):
        assert word in bash.stdout, word
    script = tmp_path / "hoist.bash"
    script.write_text(bash.stdout)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # Sourced, it completes the subcommands.
    complete = subprocess.run(
        ["bash", "-c", f"source {script}; complete -p hoist"], capture_output=True, text=True
    )
    assert complete.returncode == 0 and "hoist" in complete.stdout, complete.stderr

    zsh = run_hoist(["completion", "zsh"])
    assert zsh.returncode == 0 and zsh.stdout.startswith("#compdef hoist"), zsh.stderr
    assert "destroy" in zsh.stdout and "--cluster-size" in zsh.stdout
    (tmp_path / "_hoist").write_text(zsh.stdout)  # zsh and fish: installed by ./dev test
    assert subprocess.run(["zsh", "-n", str(tmp_path / "_hoist")]).returncode == 0

    fish = run_hoist(["completion", "fish"])
    assert fish.returncode == 0 and "complete -c hoist" in fish.stdout, fish.stderr
    (tmp_path / "hoist.fish").write_text(fish.stdout)
    assert subprocess.run(["fish", "-n", str(tmp_path / "hoist.fish")]).returncode == 0
    listed = subprocess.run(
        ["fish", "-c", f"source {tmp_path / 'hoist.fish'}; complete -C 'hoist desc'"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert listed.stdout.split("\t")[0] == "describe", listed.stdout + listed.stderr


def test_nested_and_renamed_fields_name_their_flags() -> None:
    parser = build_parser()

    def said(argv: list[str], message: str, code: str = "invalid-request") -> str:
        command = command_parser(parser, parser.parse_args(argv))
        return in_flag_terms(ReplyError(code, message), command)

    mount = (
        "hoist.api.session.create request: Expected `str` of length >= 2 - at `$.mounts[0].path`"
    )
    assert said(["run", "i"], mount) == "-v/--volume path must be at least 2 characters"
    mem = "hoist.api.session.create request: Expected `int` >= 6291456 - at `$.resources.mem`"
    assert said(["run", "i"], mem) == "-r mem must be at least 6291456"
    # The create door's own per-key checks, as the manager words them.
    floor = "$.resources.mem: must be at least 6 MiB (6291456 bytes), got 3145728"
    assert said(["run", "i"], floor) == "-r mem must be at least 6 MiB (6291456 bytes), got 3145728"
    # A field whose flag was left out was not the user's: said as it came.
    parsed = parser.parse_args(["exec", "abc", "--", "true"])
    gone = "kernel_id: kernel k1 is TERMINATED (exited: code 0); exec needs a RUNNING kernel"
    assert in_flag_terms(ReplyError("conflict", gone), command_parser(parser, parsed), parsed) == (
        f"{gone} (conflict)"
    )
    empty = "hoist.api.session.create request: Expected `str` of length >= 1 - at `$.image`"
    assert said(["run", "i"], empty) == "IMAGE must not be empty"
    bad = "image: invalid reference format (got 'A B'); use a reference like python:3.12"
    assert said(["run", "i"], bad) == (
        "IMAGE: invalid reference format (got 'A B'); use a reference like python:3.12"
    )
    quota = "hoist.admin.quota.set request: Expected `float` >= 0.0 - at `$.max_cpu`"
    assert said(["quota", "set", "bob"], quota) == "--cpu must be at least 0"  # as typed
    longest = "hoist.admin.quota.set request: Expected `float` <= 3600.0 - at `$.max_lifetime_s`"
    assert said(["quota", "set", "bob"], longest) == "--lifetime must be at most 3600"
    half = "hoist.admin.quota.set request: Expected `float` >= 0.5 - at `$.max_cpu`"
    assert said(["quota", "set", "bob"], half) == "--cpu must be at least 0.5"
    # A field the command has no flag for, or no field: as it came, with its code.
    assert said(["ps"], "owner: 'x' is not 'y'", "forbidden") == "--owner: 'x' is not 'y'"
    assert said(["agents"], "owner: 'x' is not 'y'", "forbidden") == (
        "owner: 'x' is not 'y' (forbidden)"
    )
    assert said(["ps"], "the manager is busy", "unavailable") == "the manager is busy (unavailable)"
