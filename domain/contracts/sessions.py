"""Sessions: the client's commands and a superadmin's kernel cancel (services.manager.api).

Subjects (domain.subjects) and payloads (every failure is ``{"error": {"code", "message"}}`` and
changed nothing):

- ``hoist.api.session.create`` ``{owner, image, resources: {cpu, mem}, cluster_size=1,
  resource_group="default", max_wait=0, request_id?}`` -> the session and whether this request
  created it (``SessionCreated``: ``created`` false for a retry of a request_id that found the
  session the first try stored).
  ``max_wait`` > 0: the reply waits up to that many seconds for RUNNING or a final status and
  answers with the status at that moment (a client creates and waits in one request); PULLING
  kernels carry ``agent_id`` and ``pull_task_id`` so the client can watch
  ``hoist.progress.<agent_id>.<pull_task_id>``.
  ``request_id``: the session id is derived from (owner, request_id), so the same request twice
  creates one session (the append expects an empty subject); the same request_id with other
  parameters is refused (``conflict``).
  What the kernels run: ``command`` (argv; absent: the image's entrypoint and cmd), ``env``,
  ``workdir``, ``ports`` (container ports; the view gives each kernel's reachable
  ``host:host_port``), ``mounts`` (``[{volume, path, read_only}]``: named volumes, created on
  first use on the agent and kept after the session). ``session_type``: ``interactive`` (runs
  until destroyed) or ``batch`` (ends when its main kernel's command ends: TERMINATED
  ``succeeded`` on exit code 0, ``exited: code N`` otherwise). ``cluster_mode``:
  ``multi-node`` (kernels wherever there is room, each told the others' agents' addresses) or
  ``single-node`` (all on one agent, on a private network where each reaches the others by
  hostname ``main1``, ``sub1``, ...). ``resources`` is ``{cpu, mem, <slot>: amount}``: any other
  key is a resource slot agents advertise (``gpu``), scheduled like cpu.
- ``hoist.api.session.get`` ``{session_id}`` -> the session.
- ``hoist.api.session.destroy`` ``{session_id, forced=false}`` -> the session: kernels not yet
  running go CANCELLED ``user-requested``, running ones TERMINATING and then TERMINATED once
  their agent removed the container; ``forced`` records them TERMINATED at once
  (``force-terminated``) and removes the containers best effort.
- ``hoist.admin.kernel.cancel`` ``{kernel_id, reason?}`` -> the session: a superadmin forces a
  kernel that is not running yet (e.g. PULLING) to CANCELLED ``force-cancelled: <reason>``;
  its siblings follow. Only the ``admin`` NATS role may publish ``hoist.admin.>``.

- ``hoist.api.session.logs`` ``{session_id, kernel_id?, tail?, follow=false}`` -> ``StreamOpened``
  (read it with ``hoist.api.stream.read``): the kernel's output (default: the main kernel's).
- ``hoist.api.session.exec`` ``{session_id, kernel_id?, command, env?, workdir?, timeout=60}``
  -> ``StreamOpened``: the command's output; the last chunk carries its exit code.
- ``hoist.api.stream.read`` ``{agent_id, stream_id, cursor=0, wait=0, max_bytes?}`` -> a chunk
  (``domain.rpc.StreamChunk``: ``data`` base64, the next ``cursor``, ``dropped``, ``done``,
  ``exit_code``).
- ``hoist.api.volume.list`` ``{owner?}`` -> ``{volumes: [{agent_id, name, owner, used_by}]}``
  from every live agent; ``hoist.api.volume.remove`` ``{name, owner?, agent_id?}`` ->
  ``{removed: [agent ids], refused: {agent id: why}}`` (``owner`` is required: only that owner's
  volume is removed).

Error codes: ``invalid-request`` (the message names the field), ``forbidden`` (a create for a
resource group its owner may not use: the message names ``resource_group`` and the groups the
owner may use; domain.resource_group), ``not-found``, ``conflict``, ``illegal-transition``,
``unavailable`` (the event store did not take the write: retry).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Annotated, Any, cast

import msgspec

from domain.contracts.common import TypedReason
from domain.errors import InvalidField
from domain.events import (
    ClusterMode,
    KernelSpec,
    Mount,
    PublishedPort,
    Resources,
    SessionType,
)
from domain.limits import (
    MAX_EXEC_S,
    MAX_MOUNTS,
    MAX_PORTS,
    AbsPath,
    Argv,
    ClusterSize,
    Cpu,
    Env,
    ExitCode,
    Id,
    Image,
    Labels,
    Mem,
    Owner,
    Port,
    SessionName,
    SlotAmount,
    SlotName,
    kernel_floor,
)
from domain.resource_group import DEFAULT_GROUP
from domain.session import Session


class _Request(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


# ``{cpu, mem, <slot>: amount}`` per kernel: cpu in cores, mem in bytes (an integer), any other
# key a resource slot.  Each value is decoded by resources_from with its key's own bound, so an
# error names the key (``$.resources.mem``), which msgspec's path for a map value does not.
ResourceRequest = Annotated[dict[SlotName, msgspec.Raw], msgspec.Meta(min_length=1, max_length=64)]


class CreateSession(_Request, frozen=True, kw_only=True):
    owner: Owner
    image: Image
    resources: ResourceRequest  # per kernel
    cluster_size: ClusterSize = 1
    resource_group: Id = DEFAULT_GROUP
    max_wait: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 0.0  # seconds
    request_id: Id | None = None
    session_type: SessionType = "interactive"
    cluster_mode: ClusterMode = "multi-node"
    command: Argv | None = None
    env: Env = {}
    workdir: AbsPath | None = None
    ports: Annotated[list[Port], msgspec.Meta(max_length=MAX_PORTS)] = []
    mounts: Annotated[list[Mount], msgspec.Meta(max_length=MAX_MOUNTS)] = []
    name: SessionName | None = None  # unique among the owner's sessions that have not ended
    labels: Labels = {}

    def kernel_resources(self) -> Resources:
        """``resources`` as the domain holds them: cpu, mem (whole bytes), the rest slots."""
        return resources_from(self.resources)

    def spec(self) -> KernelSpec:
        return KernelSpec(
            command=self.command,
            env=self.env,
            workdir=self.workdir,
            ports=self.ports,
            mounts=self.mounts,
        )


_RESOURCE_TYPES: dict[str, object] = {"cpu": Cpu, "mem": Mem}


def resources_from(asked: Mapping[str, msgspec.Raw | float]) -> Resources:
    """``{cpu, mem, <slot>: amount}`` -> Resources, or InvalidField naming
    ``$.resources.<key>`` (also for less cpu or mem than a runtime enforces,
    domain.limits.kernel_floor); a slot asked with amount 0 is no slot."""
    values: dict[str, Any] = {}
    for key, value in asked.items():
        type_ = _RESOURCE_TYPES.get(key, SlotAmount)
        try:
            if isinstance(value, msgspec.Raw):
                values[key] = msgspec.json.decode(value, type=type_)
            else:
                values[key] = msgspec.convert(value, type_)
        except msgspec.DecodeError as e:
            raise InvalidField(f"$.resources.{key}", str(e).removesuffix(" - at `$`")) from None
    for key in ("cpu", "mem"):
        if key not in values:
            raise InvalidField(f"$.resources.{key}", "is required (cpu in cores, mem in bytes)")
    # What every runtime enforces at create, refused here instead of after a pull.
    if (floor := kernel_floor(values["cpu"], values["mem"])) is not None:
        raise InvalidField(f"$.resources.{floor[0]}", floor[1])
    if values.get("gpu", 0) != int(values.get("gpu", 0)):
        raise InvalidField("$.resources.gpu", f"is a number of whole GPUs, got {values['gpu']}")
    slots = {k: float(v) for k, v in values.items() if k not in ("cpu", "mem") and v > 0}
    return Resources(cpu=values["cpu"], mem=values["mem"], slots=slots)


class GetSession(_Request, frozen=True, kw_only=True):
    session_id: Id


class DestroySession(_Request, frozen=True, kw_only=True):
    session_id: Id
    forced: bool = False


class CancelKernel(_Request, frozen=True, kw_only=True):
    kernel_id: Id
    reason: TypedReason | None = None


class SessionLogs(_Request, frozen=True, kw_only=True):
    session_id: Id
    kernel_id: Id | None = None  # None: the main kernel
    tail: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] | None = None
    follow: bool = False


class SessionExec(_Request, frozen=True, kw_only=True):
    session_id: Id
    kernel_id: Id | None = None  # None: the main kernel
    command: Argv
    env: Env = {}
    workdir: AbsPath | None = None
    timeout: Annotated[float, msgspec.Meta(gt=0, le=MAX_EXEC_S)] = 60.0


class ReadStream(_Request, frozen=True, kw_only=True):
    agent_id: Id
    stream_id: Id
    cursor: Annotated[int, msgspec.Meta(ge=0)] = 0
    wait: Annotated[float, msgspec.Meta(ge=0, le=30)] = 0.0
    max_bytes: Annotated[int, msgspec.Meta(ge=1, le=512 * 1024)] = 256 * 1024


class StreamOpened(msgspec.Struct, frozen=True, kw_only=True):
    """Where to read a kernel's output or an exec's: ``hoist.api.stream.read``."""

    session_id: str
    kernel_id: str
    agent_id: str
    stream_id: str
    idle_s: float  # the agent drops the stream when nobody read it this long


class ListVolumes(_Request, frozen=True, kw_only=True):
    owner: Owner | None = None


class RemoveVolume(_Request, frozen=True, kw_only=True):
    name: Id
    owner: Owner  # whose volume: refused on an agent where it is another owner's
    agent_id: Id | None = None  # None: every live agent that holds it


class VolumeView(msgspec.Struct, frozen=True, kw_only=True):
    agent_id: str
    name: str
    owner: str
    used_by: list[str]


class VolumesView(msgspec.Struct, frozen=True, kw_only=True):
    volumes: list[VolumeView]
    unreachable: list[str] = []  # live agents that did not answer


class VolumeRemoval(msgspec.Struct, frozen=True, kw_only=True):
    removed: list[str]  # agents where it was removed
    refused: dict[str, str]  # agent -> why not (in use, another owner's, unreachable)


class KernelView(msgspec.Struct, frozen=True, kw_only=True):
    kernel_id: str
    hostname: str  # main1, sub1, ...: its role and index in the cluster
    status: str
    status_info: str
    agent_id: str | None
    pull_task_id: str | None
    container_id: str | None
    ports: list[PublishedPort] = []
    exit_code: ExitCode | None = None
    ran_s: float | None = None  # how long its command ran, once it ended


class SessionView(msgspec.Struct, frozen=True, kw_only=True):
    """The reply of every session command."""

    session_id: str
    owner: str
    image: str
    resources: Resources
    cluster_size: int
    resource_group: str
    request_id: str | None
    session_type: str
    cluster_mode: str
    spec: KernelSpec
    status: str
    status_info: str
    kernels: list[KernelView]
    name: str | None = None
    labels: dict[str, str] = {}


class SessionCreated(SessionView, frozen=True, kw_only=True):
    """The reply of a create: the session, and whether this request created it (false: the
    same request_id was asked before, and this retry found the session that try stored)."""

    created: bool


def created_view(session: Session, created: bool) -> SessionCreated:
    return SessionCreated(**msgspec.structs.asdict(session_view(session)), created=created)


def session_view(session: Session) -> SessionView:
    return SessionView(
        session_id=session.id,
        owner=session.owner,
        image=session.image,
        resources=session.resources,
        cluster_size=len(session.kernels),
        resource_group=session.resource_group,
        request_id=session.request_id,
        session_type=session.session_type,
        cluster_mode=session.cluster_mode,
        spec=session.spec,
        name=session.name,
        labels=session.labels,
        status=session.status.value,
        status_info=session.status_info,
        kernels=[
            KernelView(
                kernel_id=k.kernel_id,
                hostname=session.hostname(k.kernel_id),
                status=k.status.value,
                status_info=k.status_info,
                agent_id=k.agent_id,
                pull_task_id=k.pull_task_id,
                container_id=k.container_id,
                # Kernel.ports holds PublishedPorts (typed object there: domain.events imports it)
                ports=list(cast("tuple[PublishedPort, ...]", k.ports)),
                exit_code=k.exit_code,
                ran_s=k.ran_s,
            )
            for k in session.kernels.values()
        ],
    )


def session_id_for(owner: str, request_id: str) -> str:
    """The session a (owner, request_id) pair creates: retries land on the same subject."""
    return hashlib.sha256(f"{owner}\0{request_id}".encode()).hexdigest()[:32]
