"""The pull-progress stream: the latest state of every pull, for watchers who come late.

One message kept per subject (``hoist.progress.<agent id>.<task id>``), so the stream holds
where each pull stands, not its history; progress is disposable, so memory storage and a short
max_age by default.  Whoever starts the stack ensures it (agents may not create streams).
"""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from domain.rpc import PullProgress, decode
from domain.subjects import PROGRESS, PROGRESS_STREAM, agent_progress
from transport.client import cluster_replicas

DEFAULT_MAX_AGE_S = 3600.0  # a pull longer than this has its progress forgotten: fine, it's a view


def stream_config(
    *,
    storage: StorageType = StorageType.MEMORY,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    replicas: int = 1,
) -> StreamConfig:
    if max_age_s <= 0:
        raise ValueError(f"max_age_s must be > 0 seconds, got {max_age_s}")
    return StreamConfig(
        name=PROGRESS_STREAM,
        num_replicas=replicas,
        subjects=[f"{PROGRESS}.>"],
        storage=storage,
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        max_msgs_per_subject=1,
        max_age=max_age_s,
        allow_direct=True,
    )


async def ensure(
    js: JetStreamContext,
    *,
    storage: StorageType = StorageType.MEMORY,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    replicas: int | None = None,
) -> None:
    """Create the progress stream, or update it to these settings (storage cannot change: a
    stream with another storage is deleted and recreated, losing only progress).  It keeps
    ``replicas`` copies (default: 3 on a cluster of three or more, as the event stream), so a
    pull's progress survives a node's loss too."""
    replicas = replicas or cluster_replicas(js._nc)
    want = stream_config(storage=storage, max_age_s=max_age_s, replicas=replicas)
    try:
        info = await js.stream_info(PROGRESS_STREAM)
    except NotFoundError:
        await js.add_stream(want)
        return
    if info.config.storage != storage:
        await js.delete_stream(PROGRESS_STREAM)
        await js.add_stream(want)
    elif (
        info.config.max_msgs_per_subject != 1
        or info.config.max_age != max_age_s
        or sorted(info.config.subjects or []) != want.subjects
        or not info.config.allow_direct
        or (info.config.num_replicas or 1) != replicas
    ):
        await js.update_stream(want)


async def latest(js: JetStreamContext, agent_id: str, task_id: str) -> PullProgress | None:
    """The last progress published for a pull, None if none (or it expired)."""
    try:
        # A direct get: what every reader role may do (no STREAM.MSG.GET for clients).
        msg = await js.get_last_msg(PROGRESS_STREAM, agent_progress(agent_id, task_id), direct=True)
    except NotFoundError:
        return None
    return decode(msg.data or b"", PullProgress)
