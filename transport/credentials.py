"""How a process logs in to a stack's nats-server: the role users' credentials a stack wrote
in its data dir (services.stack.natsauth generates them and the server's permissions) and the
URL that carries them.  The manager, the agents and the CLI read them; only the stack writes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from domain.errors import InvalidField
from domain.subjects import check_token
from domain.user import check_name

ROLES = ("manager", "agent", "client", "admin")
CREDENTIALS_FILE = "credentials.json"


@dataclass(frozen=True, slots=True)
class HoistUser:
    """A Hoist user's NATS user (services.stack.natsauth.user_permissions): its password and
    whether it also has the admin role's grants."""

    password: str
    admin: bool = False


@dataclass(frozen=True, slots=True)
class Credentials:
    """One password per role user; ``agents`` maps agent id to that agent's password; ``users``
    maps each enabled Hoist user (domain.user) to its NATS user."""

    manager: str
    client: str
    admin: str
    agents: dict[str, str] = field(default_factory=dict)
    users: dict[str, HoistUser] = field(default_factory=dict)

    def password(self, role: str, agent_id: str | None = None) -> str:
        if role == "agent":
            agent_id = agent_id_checked(agent_id)
            if agent_id not in self.agents:
                raise KeyError(
                    f"no credentials for agent {agent_id!r}: generate them with"
                    " generate_credentials(data_dir, [agent_id]) and reload nats-server"
                )
            return self.agents[agent_id]
        if agent_id is not None:
            raise ValueError(f"agent_id is only for role 'agent', not {role!r}")
        return str(getattr(self, check_role(role)))


def user_name(role: str, agent_id: str | None = None) -> str:
    if check_role(role) == "agent":
        return f"agent-{agent_id_checked(agent_id)}"
    return role


def load_credentials(data_dir: Path) -> Credentials:
    """The credentials a stack generated in ``data_dir``; never creates any."""
    path = Path(data_dir) / CREDENTIALS_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"no credentials in {data_dir}: start the stack with `hoist up --data-dir {data_dir}`"
            " (it generates them)"
        )
    stored = read_json(path)
    try:
        return Credentials(
            manager=stored["manager"],
            client=stored["client"],
            admin=stored["admin"],
            agents=dict(stored.get("agents") or {}),
            users=users_of(stored),
        )
    except KeyError as err:
        raise ValueError(
            f"{path} lacks the {err} password: start the stack again to fill it in"
        ) from None


def role_url(base_url: str, role: str, creds: Credentials, agent_id: str | None = None) -> str:
    """``base_url`` (nats://host:port, or several of them comma-separated: a cluster's
    servers) carrying the role user's name and password."""
    return logged_in(base_url, user_name(role, agent_id), creds.password(role, agent_id))


def user_url(base_url: str, name: str, creds: Credentials) -> str:
    """``base_url`` carrying Hoist user ``name``'s NATS user and password."""
    user = creds.users.get(name)
    if user is None:
        try:
            check_name(name)
        except InvalidField as e:  # e.g. a role's name: no Hoist user can have it
            reason = str(e).removeprefix("name: ")
            raise KeyError(f"{name!r} cannot be a Hoist user's name ({reason})") from None
        raise KeyError(
            f"no NATS user for Hoist user {name!r} in this stack (never added, or disabled):"
            f" an admin adds them, or enables them again, with `hoist user add {name}` (on the"
            " stack's host, with its data dir)"
        )
    return logged_in(base_url, name, user.password)


def logged_in(base_url: str, user: str, password: str) -> str:
    """Every server of ``base_url`` (comma-separated) carrying ``user`` and ``password``."""
    out = []
    for url in base_url.split(","):
        parts = urlsplit(url.strip())
        if parts.scheme not in ("nats", "tls") or not parts.hostname:
            raise ValueError(f"base_url must look like nats://host:port, got {base_url!r}")
        host = parts.netloc.rpartition("@")[2]
        netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
        out.append(urlunsplit((parts.scheme, netloc, parts.path, "", "")))
    return ",".join(out)


def users_of(stored: dict[str, Any]) -> dict[str, HoistUser]:
    """The ``users`` of a credentials.json: name -> {"password", "admin"}."""
    users: dict[str, HoistUser] = {}
    for name, value in dict(stored.get("users") or {}).items():
        if isinstance(value, dict) and isinstance(value.get("password"), str):
            users[check_token(name, "user name")] = HoistUser(
                value["password"], bool(value.get("admin", False))
            )
    return users


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def agent_id_checked(agent_id: str | None) -> str:
    if agent_id is None:
        raise ValueError("role 'agent' needs an agent_id (one NATS user per agent)")
    return check_token(agent_id, "agent id")


def read_json(path: Path) -> dict[str, Any]:
    try:
        stored = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path} is not valid JSON ({err}): delete it to generate new credentials"
        ) from None
    if not isinstance(stored, dict):
        raise ValueError(f"{path} must hold a JSON object: delete it to generate new credentials")
    return stored
