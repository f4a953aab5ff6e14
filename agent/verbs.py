"""The agent's verbs (domain.rpc.REQUESTS), each to its handler, and how a request is answered."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.msg import Msg

from agent.heartbeats import Heartbeats
from agent.image_gc import ImageGc
from agent.image_verbs import ImageVerbs
from agent.kernel_io import KernelIo
from agent.kernels import Kernels
from agent.strays import Strays
from domain import rpc
from domain.image_ref import canonical_or_same
from transport.responder import Responder

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[object]]

# Verbs answered per image: keyed by canonical references inside, by the caller's own spelling
# on the wire (a caller that asked for "python" finds its answer under "python").
_IMAGE_KEYED = frozenset({rpc.CHECK_AND_PULL, rpc.PRELOAD, rpc.UNLOAD})


def verb_handlers(
    images: ImageVerbs,
    kernels: Kernels,
    strays: Strays,
    io: KernelIo,
    heartbeats: Heartbeats,
    image_gc: ImageGc,
) -> dict[str, Handler]:
    """One handler per verb of rpc.REQUESTS (tests/agent check that none is missing)."""
    return {
        rpc.CHECK_AND_PULL: images.check_and_pull,
        rpc.PRELOAD: images.preload,
        rpc.UNLOAD: images.unload,
        rpc.PULL_STATUS: images.pull_status,
        rpc.PULL_CANCEL: images.pull_cancel,
        rpc.PIN_IMAGES: image_gc.pin,
        rpc.IMAGE_GC: image_gc.run,
        rpc.CREATE_KERNEL: kernels.create,
        rpc.DESTROY_KERNEL: kernels.destroy_kernel,
        rpc.SYNC_KERNELS: strays.sync,
        rpc.LOGS: io.logs,
        rpc.EXEC: io.exec,
        rpc.STREAM_READ: io.stream_read,
        rpc.VOLUMES: io.volumes,
        rpc.VOLUME_REMOVE: io.volume_remove,
        rpc.BEATS_ACKED: heartbeats.acked,
        rpc.BEAT_PACE: heartbeats.pace,
    }


# The one responder (transport.responder); its internal replies say what failed, since the
# manager, the only requester, shows them in the kernel's status_info.
_RESPONDER = Responder("agent", log, "agent", detail=True)


async def answer(handlers: dict[str, Handler], msg: Msg) -> None:
    """Decode the request, run its verb's handler, reply (errors as rpc.ErrorReply)."""
    if not _RESPONDER.answerable(msg):
        return  # a reply subject is the requester's to choose: only inboxes are answered
    verb = msg.subject.rsplit(".", 1)[-1]

    async def handle() -> object:
        request = rpc.decode_request(verb, msg.data)  # refuses a verb not in rpc.REQUESTS
        reply = await handlers[verb](request)
        if isinstance(reply, dict) and verb in _IMAGE_KEYED:
            return _as_asked(reply, msg.data)
        return reply

    await _RESPONDER.reply(msg, handle)


def _as_asked(reply: dict[str, Any], data: bytes) -> dict[str, Any]:
    asked = msgspec.json.decode(data).get("images") or []
    return {image: reply[canonical_or_same(image)] for image in asked}
