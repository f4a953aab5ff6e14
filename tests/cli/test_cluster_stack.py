"""`hoist up --nats-nodes 3`: three nats-servers as one cluster that every command knows, one
auth.conf reloaded on all three, remembered by the data dir; and the durability opt-out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.chaos import ClusterStack
from services.stack import natsauth
from services.stack.natsserver import cluster_nodes
from services.transport import credentials
from services.transport.client import server_list


def test_a_three_node_stack_is_known_to_status_users_and_down(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ClusterStack(data, 1) as stack:
        assert len(server_list(stack.info().url)) == 3
        assert (data / "nats-nodes").read_text().strip() == "3"
        status = stack.hoist("status").stdout
        for name in ("nats-1", "nats-2", "nats-3"):
            assert f"{name}" in status and "pid" in status, status
        added = stack.hoist("user", "add", "bob")
        assert added.returncode == 0, added.stderr
        for name in ("nats-1", "nats-2", "nats-3"):  # each node re-read the one auth.conf
            log = (data / f"{name}.log").read_text()
            assert "Reloaded server configuration" in log, name
        assert all('include "auth.conf"' in (data / f"{n}.conf").read_text() for n in
                   ("nats-1", "nats-2", "nats-3"))  # fmt: skip
        down = stack.hoist("down")
        assert down.returncode == 0, down.stderr
        for name in ("nats-1", "nats-2", "nats-3"):
            assert name in down.stdout, down.stdout
    # The data dir's log is on three nodes: one node would start an empty log beside it.
    refused = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "--data-dir", str(data), "up",
         "--runtime", "dummy", "--nats-nodes", "1", "--no-demo"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "--nats-nodes 3" in refused.stderr, refused.stderr


def test_sync_always_is_the_default_and_the_opt_out_leaves_it_out(tmp_path: Path) -> None:
    creds = natsauth.generate_credentials(tmp_path)
    strict = natsauth.write_server_config(tmp_path, creds, tmp_path / "js").read_text()
    assert "\n  sync_interval: always" in strict
    nodes = cluster_nodes(3, 4222)
    lazy = natsauth.write_server_config(
        tmp_path, creds, tmp_path / "js", node=nodes[1], nodes=nodes, sync_always=False
    ).read_text()
    assert "\n  sync_interval: always" not in lazy
    assert 'server_name: "nats-2"' in lazy and "listen: 127.0.0.1:6223" in lazy
    assert lazy.count("nats-route://") == 3


def test_urls_of_several_servers_carry_the_credentials_on_each() -> None:
    creds = credentials.Credentials("m", "c", "a")
    url = credentials.role_url("nats://h:1,nats://h:2", "client", creds)
    assert server_list(url) == ["nats://client:c@h:1", "nats://client:c@h:2"]
