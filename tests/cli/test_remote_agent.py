"""An agent on another host joins a running stack: `hoist creds agent --agent-id NEW` gives it a
NATS user (the server reloads its users), and `hoist agent` with that URL registers."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from tests.cli.stack_harness import HOIST, Stack, wait_for


def test_a_new_agent_gets_credentials_and_joins(hoist_stack: Stack) -> None:
    got = hoist_stack.hoist("creds", "agent", "--agent-id", "remote-1")
    assert got.returncode == 0, got.stderr
    url = got.stdout.strip()
    assert url.startswith("nats://agent-remote-1:")
    # Asked again, the same credentials: nothing is regenerated.
    assert hoist_stack.hoist("creds", "agent", "--agent-id", "remote-1").stdout.strip() == url
    agent = subprocess.Popen(  # a process: `hoist agent` execs the agent
        [HOIST, "agent", "--id", "remote-1", "--runtime", "dummy", "--resource-group", "default",
         "--cpu", "2", "--mem", "1g", "--disk", "10g"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "HOIST_NATS_URL": url},  # as the README says: not in `ps`
    )  # fmt: skip
    try:
        assert agent.stdout is not None
        assert agent.stdout.readline().strip() == "agent remote-1 ready"
        assert url.encode() not in Path(f"/proc/{agent.pid}/cmdline").read_bytes()

        def listed() -> bool:
            reply = hoist_stack.hoist("agents", "--json")
            rows = json.loads(reply.stdout)["rows"] if reply.returncode == 0 else []
            return any(r["agent_id"] == "remote-1" and r["alive"] for r in rows)

        wait_for(listed, 45)
    finally:
        agent.terminate()
        assert agent.wait(20) == 0


def test_no_process_of_the_stack_shows_a_password(hoist_stack: Stack) -> None:
    mine = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended meanwhile
        if str(hoist_stack.data_dir) in args:
            mine.append(args)
            assert not re.search(r"nats://[^\s/@]+:[^\s/@]+@", args), args
    assert sum(" agent " in a for a in mine) == 2  # the stack's agents were looked at
    assert any("services.manager" in a for a in mine)
