"""A command line `hoist` cannot parse (issue 38, item 4): one line on stderr naming what is
wrong, the nearest command, flag or choice, and the help to read; exit code 2, as argparse."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli.stack_harness import HOIST, run_hoist


def parse_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hoist: "), result.stderr  # no usage block
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["pss"], "hoist: 'pss' is not a hoist command; did you mean 'ps'? See `hoist --help`."),
        (
            ["admin", "cancel-kernl", "k"],
            "'cancel-kernl' is not a hoist admin command; did you mean 'cancel-kernel'?"
            " See `hoist admin --help`.",
        ),
        (
            ["run", "--clustr-size", "2", "IMG"],
            "hoist: unknown flag --clustr-size for hoist run; did you mean --cluster-size?"
            " See `hoist run --help`.",
        ),
        # A misspelt flag also leaves SESSION missing: the flag is what to say.
        (["destroy", "--forcd"], "unknown flag --forcd for hoist destroy; did you mean --forced?"),
        (["--dta-dir", "/tmp", "ps"], "unknown flag --dta-dir for hoist; did you mean --data-dir?"),
        (["ps", "--alll"], "unknown flag --alll for hoist ps; did you mean --all?"),
        (
            ["up", "--runtime", "dumy"],
            "--runtime takes one of docker, dummy, not 'dumy'; did you mean 'dummy'?",
        ),
    ],
)
def test_the_nearest_command_flag_or_choice_is_named(argv: list[str], expected: str) -> None:
    assert expected in parse_error(run_hoist(argv))


def test_nothing_near_says_where_to_look() -> None:
    line = parse_error(run_hoist(["xyzzy"]))
    assert line == "hoist: 'xyzzy' is not a hoist command. See `hoist --help`."
    # A command's own options without `--`: the way to give them.
    line = parse_error(run_hoist(["run", "python:3.12-slim", "python", "-c", "print(1)"]))
    assert "unknown flag -c for hoist run (a command with options goes after `--`" in line
    assert "did you mean" not in line
    line = parse_error(run_hoist(["ps", "extra"]))
    assert line == "hoist: unexpected argument 'extra' for hoist ps. See `hoist ps --help`."


def test_valid_lines_still_parse(tmp_path: Path) -> None:
    """Abbreviated long flags, short flags with their values attached, negative numbers and a
    command after `--` are not misspellings: they reach the command (no stack here: exit 1)."""
    for argv in (
        ["run", "--cluster-s", "2", "IMG", "--", "ls", "-l"],
        ["run", "-n2", "-dr", "cpu=1", "IMG"],
        ["ps", "-a"],
    ):
        result = subprocess.run(
            [HOIST, "--data-dir", str(tmp_path), *argv], capture_output=True, text=True
        )
        assert result.returncode == 1, result.stderr
        assert "is not running" in result.stderr, result.stderr
