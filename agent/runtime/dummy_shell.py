"""What a dummy kernel "runs": a tiny interpreter of the commands tests give kernels, and the
bounded output buffer its logs and execs are read from.

Understood: ``sleep N|infinity``, ``echo [-n] ...``, ``exit N``, ``true``, ``false``, ``:``,
``printenv NAME``, ``cat FILE...`` (of the kernel's simulated files: its dotfiles, in its
home, ``HOME`` or ``/root``; ``~/`` and relative paths are the home's), and ``sh -c 'a; b &&
c'`` (sequences of those joined by ``;`` or ``&&``, with ``$NAME``/``${NAME}`` from the
environment).  Anything else writes ``<cmd>: not found`` (with
what a dummy kernel runs, for a newcomer whose first ``python -c`` met it) and exits 127, as a
shell does.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
import shlex
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

Step = tuple[str, list[str]]  # (the operator before it: ";" or "&&", argv)
Write = Callable[[bytes], None]
# What a dummy kernel runs, said to a newcomer (its "not found", `hoist up`, `hoist status`).
UNDERSTOOD = "sleep, echo, exit, true, false, printenv, cat and sh -c of those"
NOT_FOUND_HINT = (
    f" (a dummy kernel runs only {UNDERSTOOD}; real commands need an agent with --runtime docker)"
)
# Everything the dummy runtime only pretends, in one line.
SIMULATES = (
    f"pulls, and kernels that run only {UNDERSTOOD} (anything else exits 127);"
    " published ports and volumes are simulated too: nothing listens on a port, no volume"
    " holds data"
)
_SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/sh", "/usr/bin/bash"}
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


DEFAULT_HOME = "/root"  # the home of a kernel whose environment sets no HOME (root's)


@dataclass(frozen=True)
class Files:
    """A dummy kernel's simulated filesystem: what the runtime wrote (its dotfiles)."""

    home: str = DEFAULT_HOME
    files: Mapping[str, bytes] = field(default_factory=dict)  # absolute path -> content

    def read(self, path: str) -> bytes | None:
        if path == "~" or path.startswith("~/"):
            path = self.home + path[1:]
        return self.files.get(posixpath.normpath(posixpath.join(self.home, path)))


class Output:
    """What a process wrote, the newest ``limit`` bytes of it, addressed by absolute offset."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.start = 0  # absolute offset of data[0]: bytes before it were dropped
        self.ended = False
        self._changed: asyncio.Event | None = None  # created when someone waits

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def write(self, chunk: bytes) -> None:
        if self.ended or not chunk:
            return
        self.data += chunk
        if (excess := len(self.data) - self.limit) > 0:
            del self.data[:excess]
            self.start += excess
        self._wake()

    def close(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    def tail_offset(self, lines: int | None) -> int:
        """Where the last ``lines`` lines start (None: everything kept)."""
        if lines is None:
            return self.start
        pos = len(self.data)
        if self.data.endswith(b"\n"):
            pos -= 1
        for _ in range(lines):
            found = self.data.rfind(b"\n", 0, pos)
            if found < 0:
                return self.start
            pos = found
        return self.start + (pos + 1 if lines else len(self.data))

    async def read(self, frm: int, follow: bool) -> AsyncIterator[bytes]:
        """From ``frm`` on (skipping what was dropped); with ``follow`` until it ends."""
        pos = frm
        while True:
            pos = max(pos, self.start)
            if pos < self.end:
                chunk = bytes(self.data[pos - self.start : pos - self.start + 64 * 1024])
                pos += len(chunk)
                yield chunk
                continue
            if not follow or self.ended:
                return
            await self.wait()


class Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def parse(argv: Sequence[str], env: Mapping[str, str]) -> list[Step]:
    """The steps of a command: ``sh -c SCRIPT`` splits SCRIPT, anything else is one step."""
    if len(argv) >= 3 and argv[0] in _SHELLS and argv[1] == "-c":
        return _split_script(argv[2], env)
    return [(";", list(argv))]


def _split_script(script: str, env: Mapping[str, str]) -> list[Step]:
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    steps: list[Step] = []
    op = ";"
    words: list[str] = []
    for token in lexer:
        if token in (";", "&&", "\n"):
            steps.append((op, words))
            op, words = (token if token == "&&" else ";"), []
        else:
            words.append(_VAR.sub(lambda m: env.get(m[1] or m[2], ""), token))
    steps.append((op, words))
    return [(o, w) for o, w in steps if w]


class Replay:
    """A process that has run ``ran_s`` seconds already (its agent restarted meanwhile), run
    again from its start: its sleeps pass at once until it is ``ran_s`` in, and what it wrote
    in its first ``quiet_s`` (the output kept) is not written twice.  ``t`` is the process's
    time: how long it has run, sleeps passed at once included."""

    def __init__(self, ran_s: float = 0.0, quiet_s: float = 0.0) -> None:
        self.ran_s = max(0.0, ran_s)
        self.quiet_s = min(max(0.0, quiet_s), self.ran_s)
        self.t = 0.0

    def sleep_for(self, seconds: float) -> float:
        """How long a sleep of ``seconds`` really waits."""
        passed = min(seconds, max(0.0, self.ran_s - self.t))
        self.t += seconds
        return seconds - passed

    def write(self, write: Write) -> Write:
        return lambda chunk: None if self.t < self.quiet_s else write(chunk)


async def run(
    steps: Sequence[Step],
    write: Write,
    env: Mapping[str, str],
    replay: Replay | None = None,
    files: Files | None = None,
) -> int:
    """Run ``steps``; their exit code (an ``exit N`` ends the whole sequence)."""
    replay = replay or Replay(0)
    files = files or Files()
    write = replay.write(write)
    code = 0
    try:
        for op, argv in steps:
            if op == "&&" and code != 0:
                continue
            code = await _step(argv, write, env, code, replay, files)
    except Exit as e:
        return e.code
    return code


async def _step(
    argv: list[str], write: Write, env: Mapping[str, str], last: int, replay: Replay, files: Files
) -> int:
    name, args = argv[0].rsplit("/", 1)[-1], argv[1:]
    if name == "sleep":
        if args == ["infinity"]:
            await asyncio.Event().wait()
        try:
            seconds = max(0.0, float(args[0].rstrip("s"))) if args else 0
        except ValueError:
            write(f"sleep: invalid time interval '{args[0]}'\n".encode())
            return 1
        await asyncio.sleep(replay.sleep_for(seconds))
        return 0
    if name == "echo":
        newline = "\n"
        if args[:1] == ["-n"]:
            newline, args = "", args[1:]
        write((" ".join(args) + newline).encode())
        return 0
    if name == "exit":
        try:
            raise Exit(int(args[0]) % 256 if args else last)
        except ValueError:
            raise Exit(2) from None
    if name in ("true", ":"):
        return 0
    if name == "false":
        return 1
    if name == "printenv" and args:
        if args[0] not in env:
            return 1
        write(f"{env[args[0]]}\n".encode())
        return 0
    if name == "cat" and args:
        code = 0
        for path in args:
            content = files.read(path)
            if content is None:
                write(f"cat: {path}: No such file or directory\n".encode())
                code = 1
            else:
                write(content)
        return code
    write(f"{argv[0]}: not found{NOT_FOUND_HINT}\n".encode())
    return 127
