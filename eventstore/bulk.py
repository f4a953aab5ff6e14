"""Reading a long stretch of the stream in a child process, so reading and folding use two cores.

A rebuild of the read models spends about half its time reading (nats-py parses every message
in Python) and half folding and writing; in one process the two take turns on one core.
``BulkReader.pages`` starts ``python -m eventstore.bulk``, which replays the stretch
with ``EventStore.replay_pages`` and writes each page to its stdout as one length-prefixed
msgpack frame; the parent yields the same pages ``replay_pages`` would. The pipe's buffer is
the only read-ahead: a parent that folds slowly makes the child wait.

The child gets the NATS URL (with its credentials) through the environment, not its command
line, so ``ps`` does not show the password. A frame of length 0 ends a complete read; a child
that ends without it failed, and its last line on stderr says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import queue
import struct
import sys
import threading
from collections.abc import AsyncGenerator, Sequence
from datetime import datetime

import msgspec

from domain import subjects
from eventstore.store import EventStore, Recorded, StoreError
from transport.client import connect

log = logging.getLogger(__name__)

URL_ENV = "HOIST_BULK_NATS_URL"
# The shortest stretch worth a child process: shorter ones are read in-process.
BULK_MIN = 50_000
_AHEAD = 16  # pages the child may read ahead of the parent
_PIPE_BYTES = 1 << 20
_LEN = struct.Struct(">I")
_Row = tuple[int, str, dict[str, str], bytes, datetime]
_decode_page = msgspec.msgpack.Decoder(list[_Row]).decode


class BulkReader:
    """Replays stretches of ``stream`` through a child process connected to ``url``."""

    def __init__(self, url: str, stream: str, subjects: Sequence[str]) -> None:
        self.url = url
        self.stream = stream
        self.subjects = list(subjects)

    async def pages_while_it_reads(
        self, from_seq: int, until_seq: int
    ) -> AsyncGenerator[list[Recorded], None]:
        """``pages``, but a child that fails (or does not start) ends them with a warning, not
        an error: the caller reads on in-process after the last page it got (slower, never
        stuck on the child)."""
        try:
            async with contextlib.aclosing(self.pages(from_seq, until_seq)) as pages:
                async for page in pages:
                    yield page
                    from_seq = page[-1].seq + 1
        except (StoreError, OSError) as e:  # OSError: the child did not start
            log.warning("%s; reading on in-process from %d", e, from_seq)

    async def pages(self, from_seq: int, until_seq: int) -> AsyncGenerator[list[Recorded], None]:
        """Pages of every message with from_seq <= seq <= until_seq, in stream order."""
        if until_seq < from_seq:
            return
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            __name__,
            self.stream,
            str(from_seq),
            str(until_seq),
            *self.subjects,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, URL_ENV: self.url},
        )
        assert proc.stdout is not None and proc.stderr is not None
        errors = asyncio.ensure_future(proc.stderr.read())
        try:
            while True:
                try:
                    (size,) = _LEN.unpack(await proc.stdout.readexactly(_LEN.size))
                    if size == 0:
                        break
                    rows = _decode_page(await proc.stdout.readexactly(size))
                except asyncio.IncompleteReadError:
                    await proc.wait()
                    why = (await errors).decode(errors="replace").strip().splitlines()
                    raise StoreError(
                        f"the bulk reader of stream {self.stream} stopped (exit code"
                        f" {proc.returncode}): {why[-1] if why else 'no message'}"
                    ) from None
                yield [Recorded(*row) for row in rows]
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
            errors.cancel()
            await asyncio.wait([errors])


async def _serve(url: str, stream: str, from_seq: int, until_seq: int, subjects: list[str]) -> None:
    # Two attempts, then the parent reports why (and its runner reads on in-process).
    errors: list[Exception] = []

    async def on_error(e: Exception) -> None:  # instead of nats-py's traceback per attempt
        errors.append(e)

    try:
        nc = await connect(
            url,
            name="hoist-bulk-reader",
            connect_timeout=5,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            error_cb=on_error,
        )
    except Exception as e:
        raise ConnectionError(f"cannot connect to NATS: {errors[-1] if errors else e}") from None
    frames: queue.Queue[bytes | None] = queue.Queue(_AHEAD)
    writer = threading.Thread(target=_write, args=(frames,), daemon=True)
    writer.start()
    encode = msgspec.msgpack.Encoder().encode
    try:
        store = EventStore(nc, stream, subjects)
        pages = store.replay_pages(from_seq=from_seq, until_seq=until_seq)
        async with contextlib.aclosing(pages):
            async for page in pages:
                # Blocks once _AHEAD pages wait for the parent: it is far behind then anyway.
                frames.put(encode([(r.seq, r.subject, r.headers, r.data, r.time) for r in page]))
        frames.put(None)
    finally:
        await nc.close()
    writer.join()


def _write(frames: queue.Queue[bytes | None]) -> None:
    """Write frames to stdout as the parent takes them, so reading goes on meanwhile."""
    out = sys.stdout.buffer
    with contextlib.suppress(OSError):  # a bigger pipe lets the parent take pages in bulk
        fcntl.fcntl(out.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    try:
        while (frame := frames.get()) is not None:
            out.write(_LEN.pack(len(frame)))
            out.write(frame)
        out.write(_LEN.pack(0))
        out.flush()
    except OSError:
        # The parent is gone or stopped reading: end now, or the reader would wait for ever
        # on a full queue. The server drops the connection.
        os._exit(1)


def main(argv: Sequence[str]) -> int:
    stream, from_seq, until_seq, *subjects = argv
    url = os.environ.get(URL_ENV)
    if not url:
        print(f"{URL_ENV} is not set: BulkReader passes the NATS URL there", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(url, stream, int(from_seq), int(until_seq), subjects))
    except BrokenPipeError:
        return 1  # the parent stopped reading: nothing to say
    except Exception as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def bulk_reader(url: str) -> BulkReader:
    """Long replays of Hoist's event stream in a child process connected to ``url``."""
    return BulkReader(url, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
