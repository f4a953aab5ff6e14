"""The local stack behind `hoist up`: an embedded nats-server with generated credentials, the
streams, and (as later parts land) the manager, projections and agents."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.aio.client import Client

from domain import subjects
from services import natsauth
from services.eventstore.store import EventStore
from services.natsserver import NatsServer

DEFAULT_DATA_DIR = Path(".hoist")
DEFAULT_PORT = 4222
STATE_FILE = "stack.json"  # where a running stack says which port it listens on


@dataclass
class StackInfo:
    """What a running stack tells other `hoist` commands (written to the data dir)."""

    url: str
    pid: int

    @classmethod
    def read(cls, data_dir: Path) -> StackInfo | None:
        path = data_dir / STATE_FILE
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        return cls(url=raw["url"], pid=raw["pid"])

    def write(self, data_dir: Path) -> None:
        path = data_dir / STATE_FILE
        path.write_text(json.dumps({"url": self.url, "pid": self.pid}))


def start_nats(
    data_dir: Path, port: int, agent_ids: list[str]
) -> tuple[NatsServer, natsauth.Credentials]:
    """Start nats-server on the project's nats.conf with this data dir's credentials."""
    data_dir.mkdir(parents=True, exist_ok=True)
    creds = natsauth.generate_credentials(data_dir, agent_ids)
    store_dir = data_dir / "jetstream"
    config = natsauth.write_server_config(data_dir, creds, store_dir)
    server = NatsServer(store_dir, port=port, config=config, log_file=data_dir / "nats-server.log")
    return server.start(), creds


async def connect(url: str, name: str) -> Client:
    return await nats.connect(url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5)


def event_store(nc: Client) -> EventStore:
    return EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
