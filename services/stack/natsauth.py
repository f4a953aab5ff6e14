"""NATS users for Hoist's roles: generated passwords, the auth.conf granting each role only the
subjects it needs, and the server config the local stack runs.

Roles (one NATS user each; one user per agent, named ``agent-<id>``):

- manager: the control plane. Owns the streams (JetStream API), appends events, serves
  ``hoist.api|query|admin.>``, calls agents, watches heartbeats and progress. It creates the
  event stream when it is absent but may not update, delete, purge or restore it, nor delete a
  message of it: events are never removed, not even by the manager. It may repair the progress
  stream (a disposable view of the latest state per pull, which it can overwrite anyway).
- agent: publishes only its own facts, progress and heartbeats, serves its own RPC subjects,
  and reads the event stream (direct gets) to load its own aggregate. The event store's reads
  are direct-get batches on ``$JS.API.DIRECT.GET.HOIST`` whose subject does not name the
  aggregate, so an agent can read (never write) other aggregates too.
- client: sends commands and queries, watches progress, reads history (direct gets and
  ephemeral ordered consumers) and follows it (a core subscription on the event subjects wakes
  a following replay). Never appends events, never touches ``hoist.admin.>``, never
  changes streams, never pulls from or deletes consumers (the manager's durables).
- admin: a client that may also publish ``hoist.admin.>``. It does not append events either:
  admin commands go through the manager, which validates them and records their events, so the
  log holds only events the domain accepted. Nor may it change a stream: no Hoist credential
  can erase the log; only the server's operator, with access to its store dir, can.

Accounts (``accounts``): the manager and the streams in ``HOIST``, the only account with
JetStream; client, admin and every Hoist user in ``READERS``, each agent in ``AGENT_<id>``,
reaching what they may through exports and imports. nats-server answers a JetStream request on
any reply subject its requester names, and in an account without JetStream nothing stores it.

A cluster's routes (``hoist up --nats-nodes 3``) have a user and password of their own, no
role's: route-credentials.json (0600), generated once per data dir and written into each node's
config, so a nats-server without them cannot join the cluster (it would serve its own clients
every subject past these permissions). The routes also require mutual TLS with a private CA of
the data dir (route-ca.pem, route-cert.pem, route-key.pem, 0600; services/stack/natstls.py):
a node sends its route CONNECT, password included, only to a peer whose certificate that CA
signed, so a local user listening on a stopped node's route port never receives it.

Passwords are stored in plaintext in 0600 files in the data dir: credentials.json, which the
clients read (``hoist creds`` prints them), and route-credentials.json and the nodes' configs
for the routes. auth.conf, what nats-server checks the roles and users against, holds only
their bcrypt hashes (``hashed``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import bcrypt

from domain.subjects import (
    ADMIN,
    AGENT_RPC,
    API,
    EVENT_STREAM,
    EVENTS,
    EVENTS_ALL,
    HEARTBEAT,
    IMPORT_REPLY,
    INBOX,
    MANAGER_KINDS,
    PROGRESS,
    PROGRESS_STREAM,
    QUERY,
    agent_events,
    check_token,
    heartbeat,
    inbox_prefix,
)
from domain.user import check_name
from services.stack.natsserver import ClusterNode, RouteAuth, cluster_settings
from services.stack.natstls import route_tls
from transport.credentials import (
    CREDENTIALS_FILE,
    Credentials,
    HoistUser,
    agent_id_checked,
    check_role,
    read_json,
    user_name,
    users_of,
)

ROUTE_CREDENTIALS_FILE = "route-credentials.json"
REPO_CONFIG = Path(__file__).resolve().parents[2] / "nats.conf"

_JS = "$JS.API"
_INBOX = f"{INBOX}.>"
_FLOW_CONTROL = "$JS.FC.>"  # replies to an ordered consumer's flow-control messages
_STORE_DIR_LINE = re.compile(r"^(\s*store_dir\s*:\s*).*$", re.MULTILINE)
_SYNC_ALWAYS_LINE = re.compile(r"^\s*sync_interval\s*:\s*always\s*$", re.MULTILINE)
_SYNC_OPTED_OUT = "  # sync_interval: always left out (hoist up --no-sync-always): the default"


def generate_credentials(data_dir: Path, agent_ids: Iterable[str] = ()) -> Credentials:
    """The stack's credentials, from ``data_dir/credentials.json`` if it exists; missing users
    (new agents) get fresh random passwords. The file is (re)written with mode 0600."""
    path = Path(data_dir) / CREDENTIALS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    stored = read_json(path) if path.exists() else {}
    changed = not stored
    values: dict[str, str] = {}
    for role in ("manager", "client", "admin"):
        value = stored.get(role)
        if not isinstance(value, str) or not value:
            value = _new_password()
            changed = True
        values[role] = value
    agents = dict(stored.get("agents") or {})
    for agent_id in agent_ids:
        if agent_id not in agents:
            agents[check_token(agent_id, "agent id")] = _new_password()
            changed = True
    creds = Credentials(agents=agents, users=users_of(stored), **values)
    if changed:
        _write_private(path, json.dumps(_as_dict(creds), indent=2) + "\n")
    else:
        path.chmod(0o600)  # tighten a file someone loosened
    return creds


def route_credentials(data_dir: Path) -> RouteAuth:
    """The user and password of the stack's cluster routes, from
    ``data_dir/route-credentials.json``, generated (0600) when it holds none: a restarted
    cluster keeps its routes' credentials, as every node must give the same."""
    path = Path(data_dir) / ROUTE_CREDENTIALS_FILE
    stored = read_json(path) if path.exists() else {}
    user, password = stored.get("user"), stored.get("password")
    if isinstance(user, str) and user and isinstance(password, str) and password:
        path.chmod(0o600)  # tighten a file someone loosened
        return RouteAuth(user, password)
    auth = RouteAuth.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_private(path, json.dumps({"user": auth.user, "password": auth.password}) + "\n")
    return auth


def permissions(role: str, agent_id: str | None = None) -> dict[str, Any]:
    """The nats-server ``permissions`` block of one role user."""
    role = check_role(role)
    if role == "manager":
        return {
            "publish": {
                "allow": [
                    f"{_JS}.>",
                    "$JS.ACK.>",
                    _FLOW_CONTROL,
                    *(f"{EVENTS}.{kind}.>" for kind in MANAGER_KINDS),  # never an agent's facts
                    f"{PROGRESS}.>",
                    f"{AGENT_RPC}.>",
                    f"{API}.>",  # its own reactors may issue commands and queries
                    f"{QUERY}.>",
                    _INBOX,
                    f"{IMPORT_REPLY}.>",  # replies to requests from the readers' account
                ],
                # The log is only ever appended to: the manager creates the event stream when
                # it is absent and never changes it (an update to max_msgs: 1 erases it too).
                "deny": _NO_LOG_CHANGES,
            },
            "subscribe": {
                "allow": [
                    f"{API}.>",
                    f"{QUERY}.>",
                    f"{ADMIN}.>",
                    f"{HEARTBEAT}.>",
                    f"{PROGRESS}.>",
                    EVENTS_ALL,  # a following replay's "something new" signal
                    _own_inbox(role),
                ],
            },
            # No allow_responses: it would let the manager answer on any reply subject a
            # client names, past even its deny list (a query's reply aimed at
            # hoist.events.agent.X lands in the log as that agent's). Replies go to _INBOX.>.
        }
    if role == "agent":
        agent_id = agent_id_checked(agent_id)
        return {
            "publish": {
                "allow": [
                    agent_events(agent_id),
                    f"{PROGRESS}.{agent_id}.>",
                    heartbeat(agent_id),
                    f"{_JS}.DIRECT.GET.{EVENT_STREAM}",
                    f"{_JS}.DIRECT.GET.{EVENT_STREAM}.>",
                    # The manager's requests reach the agent through its account's export with
                    # `_R_.` reply subjects. allow_responses alone grants each reply per request
                    # and a config reload (a user added, certificates rotated) forgets the
                    # grants of requests in flight: their replies were refused. In this account
                    # an `_R_.` subject leads only back through the import that made it.
                    "_R_.>",
                ],
                "deny": _NO_STREAM_CHANGES,
            },
            "subscribe": {"allow": [f"{AGENT_RPC}.{agent_id}.>", _own_inbox(role, agent_id)]},
            "allow_responses": True,
        }
    # No JetStream API but direct gets: the readers' account has no JetStream, and nats-server
    # answered each API request there ("not enabled") at ~4x the cost of refusing it.
    publish = [f"{API}.>", f"{QUERY}.>", _FLOW_CONTROL]
    for stream in (EVENT_STREAM, PROGRESS_STREAM):
        publish += _stream_reader(stream)
    deny = [EVENTS_ALL, *_NO_STREAM_CHANGES]
    if role == "admin":
        publish.append(f"{ADMIN}.>")
    else:
        deny.append(f"{ADMIN}.>")
    return {
        "publish": {"allow": publish, "deny": deny},
        # Never the manager's or agents' request subjects: no one may impersonate a service.
        # Events: a following replay's "something new" signal (reading them is allowed anyway).
        "subscribe": {"allow": [f"{PROGRESS}.>", EVENTS_ALL, _own_inbox(role)]},
    }


def user_permissions(name: str, admin: bool = False) -> dict[str, Any]:
    """The ``permissions`` of Hoist user ``name``'s NATS user: publish only its own command and
    query subjects (``hoist.api.<name>.>``, ``hoist.query.<name>.>``: the manager takes the
    owner from that token, and serves only an enabled user) and read progress as a client does,
    but never the event log; subscribe only its own inbox (``_INBOX.<name>.>``) and progress.
    Never ``hoist.admin.>``; ``admin``: ``hoist.admin.<name>.>`` too."""
    name = check_name(name)
    # A user reads no log (every session's command and env are in it): the events of their own
    # sessions (an admin user's: any session's) come from the manager, hoist.query.<name>.history,
    # which checks the user is still enabled on every request; progress as a client reads it
    # (it names images and agents, no session).
    grants = permissions("client")
    allow = grants["publish"]["allow"]
    allow[: allow.index(f"{QUERY}.>") + 1] = [f"{API}.{name}.>", f"{QUERY}.{name}.>"]
    for subject in _stream_reader(EVENT_STREAM):
        allow.remove(subject)
    if admin:  # admin commands on its own subjects only: the manager records them as its own
        allow.append(f"{ADMIN}.{name}.>")
        grants["publish"]["deny"].remove(f"{ADMIN}.>")
    grants["subscribe"]["allow"] = [f"{PROGRESS}.>", f"{inbox_prefix(name)}.>"]
    return grants


def set_user(data_dir: Path, name: str, admin: bool = False) -> Credentials:
    """Give Hoist user ``name`` its NATS user (a new password; an existing one keeps its own
    and takes ``admin``) in credentials.json and auth.conf; reload nats-server to apply it."""
    return _change_users(data_dir, name, admin)


def remove_user(data_dir: Path, name: str) -> Credentials:
    """Take Hoist user ``name``'s NATS user out of credentials.json and auth.conf (nothing if
    it has none); reload nats-server to apply it."""
    return _change_users(data_dir, name, None)


@contextlib.contextmanager
def changing_credentials(data_dir: Path) -> Iterator[None]:
    """One writer of ``credentials.json`` and ``auth.conf`` at a time: each change reads them,
    changes them and writes them whole, and ``hoist user add`` run six at once lost users (a
    writer wrote over another's change; each still said "written")."""
    fd = os.open(Path(data_dir) / "credentials.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and with it the lock


def _change_users(data_dir: Path, name: str, admin: bool | None) -> Credentials:
    name = check_name(name)
    with changing_credentials(data_dir):
        return _changed_users(data_dir, name, admin)


def _changed_users(data_dir: Path, name: str, admin: bool | None) -> Credentials:
    creds = generate_credentials(data_dir)
    users = dict(creds.users)
    if admin is None:
        users.pop(name, None)
    else:
        old = users.get(name)
        users[name] = HoistUser(old.password if old else _new_password(), admin)
    creds = Credentials(creds.manager, creds.client, creds.admin, creds.agents, users)
    data_dir = Path(data_dir)
    _write_private(data_dir / CREDENTIALS_FILE, json.dumps(_as_dict(creds), indent=2) + "\n")
    write_auth_conf(data_dir, creds)
    return creds


def render_auth_conf(creds: Credentials) -> str:
    """auth.conf for nats-server: the accounts (``accounts(creds)``), every role user in its
    account with its permissions; no anonymous access."""
    return (
        "# Generated by hoist (services/natsauth.py): the accounts and their users. Secret, keep\n"
        "# it 0600.\n"
        f"accounts {json.dumps(accounts(creds), indent=1)}\n"
    )


def accounts(creds: Credentials) -> dict[str, Any]:
    """The nats-server ``accounts`` block: the log and its writers in ``HOIST``, the only account
    with JetStream; every reader in ``READERS`` and each agent in ``AGENT_<id>``, neither of
    which has JetStream, so no reply subject they name is a subject of the log.

    - ``HOIST``: the manager. It exports its request subjects and the direct gets of both
      streams (services: a request's reply subject is rewritten to one of HOIST's ``_R_.``
      subjects and its answers go back to the requester's account), the event and progress
      subjects (streams, as core messages), and to each agent account only that agent's own
      event, progress and heartbeat subjects (services: the agent appends with an ack).
    - ``READERS``: client, admin, every Hoist user (and so the web view). It imports what they
      may reach; their permissions say which of it each may use, as they did in one account.
    - ``AGENT_<id>``: agent ``<id>``. It imports its own subjects and the event stream's direct
      gets, and exports its RPC subjects to HOIST; a JetStream answer aimed at any event
      subject of another lands in this account, where nothing stores it.
    """
    # The client and admin roles may send any owner's commands on the unscoped subjects, but
    # never on a Hoist user's own: what the manager serves there it records as that user's.
    theirs = [
        f"{prefix}.{name}.>" for name in sorted(creds.users) for prefix in (API, QUERY, ADMIN)
    ]
    client, admin = _user("client", creds.client), _user("admin", creds.admin)
    for role in (client, admin):
        role["permissions"]["publish"]["deny"] += theirs
    readers = [
        client,
        admin,
        *(
            {
                "user": name,
                "password": hashed(u.password),
                "permissions": user_permissions(name, u.admin),
            }
            for name, u in sorted(creds.users.items())
        ),
    ]
    agent_ids = sorted(creds.agents)
    hoist: dict[str, Any] = {
        "jetstream": "enabled",
        "users": [_user("manager", creds.manager)],
        "exports": [
            *(_service(s, [READERS]) for s in (*_REQUESTS, *_direct_gets(PROGRESS_STREAM))),
            *(_service(s, [READERS, *map(agent_account, agent_ids)]) for s in _direct_gets()),
            *({"stream": s, "accounts": [READERS]} for s in (EVENTS_ALL, f"{PROGRESS}.>")),
            *(_service(s, [agent_account(a)]) for a in agent_ids for s in _agent_writes(a)),
        ],
        "imports": [
            *(
                {"service": {"account": agent_account(a), "subject": f"{AGENT_RPC}.{a}.>"}}
                for a in agent_ids
            ),
            # A stream import adds no header: a heartbeat counts only with its own one.
            *(
                {"stream": {"account": agent_account(a), "subject": heartbeat(a)}}
                for a in agent_ids
            ),
        ],
    }
    result = {
        HOIST_ACCOUNT: hoist,
        READERS: {
            "users": readers,
            "imports": [
                # share: nats-server names the requesting user to the manager (the
                # Nats-Request-Info header), which answers on a user's own subject only them.
                *({**_import_service(s), "share": True} for s in _REQUESTS),
                *(_import_service(s) for s in (*_direct_gets(), *_direct_gets(PROGRESS_STREAM))),
                *(
                    {"stream": {"account": HOIST_ACCOUNT, "subject": s}}
                    for s in (EVENTS_ALL, f"{PROGRESS}.>")
                ),
                *(
                    {"stream": {"account": agent_account(a), "subject": f"{PROGRESS}.{a}.>"}}
                    for a in agent_ids
                ),
            ],
        },
    }
    for agent_id, password in sorted(creds.agents.items()):
        result[agent_account(agent_id)] = {
            "users": [_user("agent", password, agent_id)],
            "exports": [
                _service(f"{AGENT_RPC}.{agent_id}.>", [HOIST_ACCOUNT]),
                # Progress reaches the readers from here: what comes into HOIST through an
                # import goes no further.
                {"stream": f"{PROGRESS}.{agent_id}.>", "accounts": [READERS]},
                {"stream": heartbeat(agent_id), "accounts": [HOIST_ACCOUNT]},
            ],
            "imports": [_import_service(s) for s in (*_agent_writes(agent_id), *_direct_gets())],
        }
    return result


HOIST_ACCOUNT = "HOIST"  # the log, its writers (the manager) and the only JetStream
READERS = "READERS"  # client, admin, every Hoist user: no JetStream


def agent_account(agent_id: str) -> str:
    """The account of agent ``agent_id``: no JetStream, its own subjects imported from HOIST."""
    return f"AGENT_{agent_id_checked(agent_id)}"


# The manager's request subjects, served to READERS (each reader's permissions say which).
_REQUESTS = (f"{API}.>", f"{QUERY}.>", f"{ADMIN}.>")


def _direct_gets(stream: str = EVENT_STREAM) -> tuple[str, str]:
    return f"{_JS}.DIRECT.GET.{stream}", f"{_JS}.DIRECT.GET.{stream}.>"


def _agent_writes(agent_id: str) -> tuple[str, ...]:
    # An agent's appends (with their acks) and its progress (the final one acked by the
    # progress stream): published into HOIST through its account's imports.
    return (agent_events(agent_id), f"{PROGRESS}.{agent_id}.>")


def _service(subject: str, to: list[str]) -> dict[str, Any]:
    # A direct get answers a batch with many messages: "stream" keeps the reply open for all.
    return {"service": subject, "accounts": to, "response_type": "stream"}


def _import_service(subject: str) -> dict[str, Any]:
    return {"service": {"account": HOIST_ACCOUNT, "subject": subject}}


def write_server_config(
    data_dir: Path,
    creds: Credentials,
    store_dir: Path,
    *,
    node: ClusterNode | None = None,
    nodes: list[ClusterNode] | None = None,
    sync_always: bool = True,
) -> Path:
    """Write ``nats.conf`` (the repo's, with ``store_dir`` absolute) and ``auth.conf`` into
    ``data_dir``, both 0600; return the nats.conf path. Start nats-server with ``-c`` on it and
    no ``-sd`` (the config already names the store dir).

    ``node`` of a cluster's ``nodes``: ``<node name>.conf`` instead, with the node's name and
    routes, over mutual TLS with the data dir's route CA (natstls.route_tls) and authorized by
    the data dir's route credentials (route_credentials); every node includes the one
    auth.conf, so all take the same users and a reload of each applies a change everywhere
    (and keeps the routes: the cluster block is unchanged).
    ``sync_always=False`` leaves out ``sync_interval: always`` (the server's default then:
    fsync every 2 minutes; faster, and an acknowledged write can be lost when the host loses
    power)."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    template = REPO_CONFIG.read_text()
    store = json.dumps(str(Path(store_dir).resolve()))
    config, found = _STORE_DIR_LINE.subn(lambda m: m.group(1) + store, template)
    if found != 1:
        raise RuntimeError(f"{REPO_CONFIG} must set jetstream store_dir exactly once")
    if not sync_always:
        config, found = _SYNC_ALWAYS_LINE.subn(_SYNC_OPTED_OUT, config)
        if found != 1:
            raise RuntimeError(f"{REPO_CONFIG} must set sync_interval: always exactly once")
    name = "nats.conf"
    if node is not None:
        config += "\n# This node of the stack's cluster (hoist up --nats-nodes).\n"
        config += cluster_settings(
            node, nodes or [node], route_credentials(data_dir), route_tls(data_dir)
        )
        name = f"{node.name}.conf"
    write_auth_conf(data_dir, creds)
    path = data_dir / name
    _write_private(path, config)
    return path


def write_auth_conf(data_dir: Path, creds: Credentials) -> None:
    """Write ``auth.conf`` (0600), which every node's config includes; reload them to apply."""
    _write_private(Path(data_dir) / "auth.conf", render_auth_conf(creds))


# What would erase or rewrite the event log. The stream name is the last token, so a publish
# to a wildcard form ($JS.API.STREAM.UPDATE.*) names no stream the API would act on.
_NO_LOG_CHANGES = [
    f"{_JS}.STREAM.UPDATE.{EVENT_STREAM}",
    f"{_JS}.STREAM.DELETE.{EVENT_STREAM}",
    f"{_JS}.STREAM.PURGE.{EVENT_STREAM}",
    f"{_JS}.STREAM.MSG.DELETE.{EVENT_STREAM}",
    f"{_JS}.STREAM.RESTORE.{EVENT_STREAM}",
    f"{_JS}.ACCOUNT.PURGE.>",  # every stream of the account at once
]

# Stream changes no role but the manager may make (deny beats allow; listed for clarity).
_NO_STREAM_CHANGES = [
    *_NO_LOG_CHANGES,
    f"{_JS}.STREAM.CREATE.>",
    f"{_JS}.STREAM.UPDATE.>",
    f"{_JS}.STREAM.DELETE.>",
    f"{_JS}.STREAM.PURGE.>",
    f"{_JS}.STREAM.MSG.DELETE.>",
    f"{_JS}.STREAM.RESTORE.>",
    f"{_JS}.CONSUMER.DELETE.>",
    f"{_JS}.CONSUMER.DURABLE.CREATE.>",
    f"{_JS}.CONSUMER.MSG.NEXT.>",
]


def _stream_reader(stream: str) -> list[str]:
    # Direct gets only, never a consumer: nats-server does not check a push consumer's deliver
    # subject against its creator's permissions (nats-server issue 8274), so a reader allowed
    # to create one could aim the whole stream at the manager's request subjects.
    return [
        f"{_JS}.DIRECT.GET.{stream}",
        f"{_JS}.DIRECT.GET.{stream}.>",
    ]


def _own_inbox(role: str, agent_id: str | None = None) -> str:
    # Replies to this user only (transport.client sets the prefix from the URL's
    # user): no role reads another's replies. The manager publishes to every inbox (_INBOX).
    return f"{inbox_prefix(user_name(role, agent_id))}.>"


def _user(role: str, password: str, agent_id: str | None = None) -> dict[str, Any]:
    return {
        "user": user_name(role, agent_id),
        "password": hashed(password),
        "permissions": permissions(role, agent_id),
    }


# The passwords are 192 random bits: no cost factor makes them easier or harder to guess, so the
# least bcrypt allows (a connection's check then takes well under a millisecond).
_BCRYPT_ROUNDS = 4


def hashed(password: str) -> str:
    """``password`` as the bcrypt hash nats-server checks it against (auth.conf holds no
    password; the clients keep theirs in credentials.json)."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=_BCRYPT_ROUNDS)).decode()


def _new_password() -> str:
    return secrets.token_urlsafe(24)  # 192 bits; URL-safe, so it goes into nats:// URLs as is


def _as_dict(creds: Credentials) -> dict[str, Any]:
    return {
        "manager": creds.manager,
        "client": creds.client,
        "admin": creds.admin,
        "agents": dict(sorted(creds.agents.items())),
        "users": {
            name: {"password": u.password, "admin": u.admin}
            for name, u in sorted(creds.users.items())
        },
    }


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable only by the user, replacing it atomically."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # a writer's own
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply to a tmp file left by a crash
    os.replace(tmp, path)
