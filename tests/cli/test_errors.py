"""Every error a person can meet ends in one line that says what to do, a non-zero exit code and
no traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from services.stack.natsserver import free_port
from tests.cli.stack_harness import HOIST, Stack, run_hoist


def one_line_error(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hoist: ") and expected in lines[0], lines[0]


def test_stack_not_running(tmp_path: Path) -> None:
    # A process: the binary's own exit status and stderr, end to end.
    result = subprocess.run(
        [HOIST, "--data-dir", str(tmp_path), "ps"], capture_output=True, text=True, timeout=30
    )
    one_line_error(result, f"the Hoist stack in {tmp_path} is not running: start it with `hoist up")


@pytest.mark.parametrize("cmd", [("run", "x:1"), ("watch", "abc")])
@pytest.mark.parametrize("wait", ["-1", "nan", "inf", "soon"])
def test_max_wait_takes_seconds_at_least_zero(
    tmp_path: Path, cmd: tuple[str, ...], wait: str
) -> None:
    """Refused before anything is asked (a newcomer's trial ran ``--max-wait -1``)."""
    result = run_hoist(["--data-dir", str(tmp_path), *cmd, "--max-wait", wait], timeout=30)
    assert result.returncode == 2, (result.stdout, result.stderr)
    [line] = result.stderr.strip().splitlines()
    assert line == (
        f"hoist: --max-wait: '{wait}': give seconds >= 0 like 30 (0: no limit)."
        f" See `hoist {cmd[0]} --help`."
    ), line


def test_an_overlong_variable_name_is_refused_in_the_clis_words(tmp_path: Path) -> None:
    """Not the wire validator's `$.env` text (a newcomer's trial), and before connecting."""
    result = run_hoist(["--data-dir", str(tmp_path), "run", "x:1", "-e", "A" * 300 + "=1"])
    one_line_error(
        result,
        "-e AAAAAAAAAAAAAAAA...: a variable name is at most 256 characters, this one has 300",
    )


def test_nats_unreachable(hoist_stack: Stack) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    result = hoist_stack.hoist("sessions", env={"HOIST_NATS_URL": url}, timeout=30)
    one_line_error(
        result, f"cannot reach NATS at {url} (Connection refused): is the stack running?"
    )


def test_wrong_credentials(hoist_stack: Stack) -> None:
    url = hoist_stack.creds("client")
    wrong = url.replace("client:", "client:x", 1)
    result = hoist_stack.hoist("sessions", env={"HOIST_NATS_URL": wrong}, timeout=30)
    one_line_error(result, "refused the credentials: print current ones with `hoist creds client`")
    assert wrong.split("@")[0].split(":")[-1] not in result.stderr  # no password in the message


def test_permission_refused_for_a_client(hoist_stack: Stack) -> None:
    result = hoist_stack.hoist(
        "admin", "cancel-kernel", "k1", env={"HOIST_NATS_URL": hoist_stack.creds("client")}
    )
    one_line_error(
        result,
        "permission denied for hoist.admin.kernel.cancel: the admin role is needed;"
        " use `hoist creds admin`",
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # One wording for an unknown session, whoever finds it (the CLI, the manager).
        (("watch", "0" * 32), f"unknown session {'0' * 32}: list sessions with `hoist sessions`"),
        (("destroy", "0" * 32), f"unknown session {'0' * 32}: list sessions with `hoist sessions`"),
        (("history", "0" * 32), f"unknown session {'0' * 32}: list sessions with `hoist sessions`"),
        (("logs", "0" * 32), f"unknown session {'0' * 32}: list sessions with `hoist sessions`"),
        (("admin", "cancel-kernel", "0" * 32), f"unknown kernel {'0' * 32}: list kernels with"),
        (
            ("admin", "cancel-kernel", "nope"),
            "unknown kernel nope: list kernels with `hoist ps -a`",
        ),
        # An empty prefix would match any session: refused by the CLI, not the query's field.
        (("destroy", ""), "SESSION is empty: give a session id or a unique prefix of one"),
        (("admin", "cancel-kernel", " "), "KERNEL is empty: give a kernel id or a unique prefix"),
        # After `--` a SESSION may start with a dash (argparse's own `--`, not run's command).
        (("destroy", "--", "-x"), "unknown session -x: list sessions with `hoist sessions`"),
        (
            ("run", "test/image-0:1", "-r", "mem=lots"),
            "-r mem=lots: mem takes a size like 512m or 2g",
        ),
        (
            ("run", "test/image-0:1", "-r", "mem=300t"),
            "-r mem=300t: mem takes a size like 512m or 2g, from 6 MiB to 256 TiB",
        ),
        (("run", "test/image-0:1", "-r", "mem=1.5"), "-r mem=1.5: mem takes a size like 512m"),
        (("run", "test/image-0:1", "-r", f"mem={'9' * 320}"), "mem takes a size like 512m"),
        (
            ("run", "test/image-0:1", "-r", "cpu=-1"),
            "-r cpu=-1: cpu takes a number of cores > 0",
        ),
        (("run", "test/image-0:1", "-r", "gpu=x"), "-r gpu=x: gpu takes an amount >= 0"),
        # JSON has no infinity: refused here, not as the wire's "Expected `float`, got `null`"
        (("run", "test/image-0:1", "-r", "cpu=inf"), "-r cpu=inf: cpu takes a number of cores"),
        (("run", "test/image-0:1", "-r", "gpu=1e400"), "-r gpu=1e400: gpu takes an amount >= 0"),
        (("destroy", "a" * 129), "SESSION has 129 characters: a session id has at most 128"),
        (("run", "test/image-0:1", "-r", "Gpu!=1"), "-r Gpu!=1: write cpu=CORES, mem=SIZE"),
        (
            ("run", "test/image-0:1", "-r", "cpu=1", "-r", "mem=1g", "-r", "CPU=2"),
            "-r CPU=2: cpu is already given (-r cpu=1); give it once",
        ),
        (("run", "test/image-0:1", "--cluster-size", "0"), "-n/--cluster-size must be at least 1"),
    ],
)
def test_bad_input(hoist_stack: Stack, args: tuple[str, ...], expected: str) -> None:
    one_line_error(hoist_stack.hoist(*args), expected)


def test_unknown_image_ends_cancelled_with_the_reason(hoist_stack: Stack) -> None:
    result = hoist_stack.hoist("run", "no/such-image:1")
    assert result.returncode == 1
    last = result.stdout.strip().splitlines()[-1]
    assert "CANCELLED image-pull-failed:" in last and "no/such-image:1 not found" in last, last
    assert "Traceback" not in result.stderr
