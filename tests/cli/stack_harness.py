"""A real `hoist up` stack (nats-server, manager, dummy agents) in a temp data dir, the `hoist`
command line against it, and a tmux terminal to see what a person sees.

`Stack.hoist` runs the command line in this process (``services.cli.main.main``: the same parser
and code, without a Python start and its imports per call, ~0.5 s of CPU each); a test that
checks the binary itself (its exit status in a pipeline, signals, a terminal, `hoist up`/`down`)
runs it as a process, `Stack.hoist_process` or `HOIST`."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar, cast

from client import session_log
from client.connection import Connection
from domain import subjects
from eventstore.store import event_store
from services.cli import main as cli
from services.stack.natsserver import free_port

T = TypeVar("T")
HOIST = str(Path(sys.executable).parent / "hoist")
MiB = 1024**2
# Images the test agents know, pulled at 80 MiB/s in 4 layers: a test image in ~0.3 s (for a
# session that only has to run); a medium one in ~3 s, for a test that watches a pull advance
# (bars, PULLING lines); a big one in ~10 s, for one that detaches or presses Ctrl-C mid-pull.
TEST_IMAGE_SIZE = 24 * MiB
MEDIUM_IMAGE_SIZE = 240 * MiB
BIG_IMAGE_SIZE = 800 * MiB
TEST_IMAGES = [f"test/image-{i}:1" for i in range(12)]
MEDIUM_IMAGES = [f"test/medium-{i}:1" for i in range(4)]
BIG_IMAGES = [f"test/big-{i}:1" for i in range(6)]
DUMMY_CONFIG = {
    "image_sizes": {
        **dict.fromkeys(TEST_IMAGES, TEST_IMAGE_SIZE),
        **dict.fromkeys(MEDIUM_IMAGES, MEDIUM_IMAGE_SIZE),
        **dict.fromkeys(BIG_IMAGES, BIG_IMAGE_SIZE),
    },
    "default_size": None,
    "layers": 4,
    "bandwidth_bps": 80 * MiB,
    "tick_s": 0.1,
    "create_delay_s": 0.2,
}

# Commands only a process runs: `up` runs a stack until a signal stops it (its children die with
# it), `down` stops one by signals, and `web`, `agent` and `manager` exec another program.
PROCESS_ONLY = frozenset({"up", "down", "web", *cli.PROCESSES})
# In-process commands take turns: os.environ and the working directory are the whole process's.
_IN_PROCESS = threading.Lock()
# A command that outlived its timeout: its thread goes on (a thread cannot be killed), with
# whatever os.environ and module globals it finds, so every later command runs as a process.
_LEFT_RUNNING: list[threading.Thread] = []


@dataclass
class _Call:
    """One in-process command's stdout and stderr."""

    out: io.TextIOWrapper
    err: io.TextIOWrapper


# The command whose thread (or task, or asyncio.to_thread worker: they copy its context) this is.
_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("hoist_call", default=None)


class _Routed:
    """sys.stdout or sys.stderr while a command runs here: the command's writes go to its own
    buffer, any other thread's to the stream that was there before (not into the command's)."""

    def __init__(self, name: str, others: TextIO) -> None:
        self._name, self._others = name, others

    def __getattr__(self, attr: str) -> Any:  # write, flush, buffer, isatty, ...
        call = _CALL.get()
        return getattr(getattr(call, self._name) if call else self._others, attr)


def run_hoist(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = 60,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`hoist ARGS` without a terminal: its exit code, stdout and stderr, as subprocess.run
    gives them (``env``: the whole environment, default this process's; ``timeout``: raises
    subprocess.TimeoutExpired).  In this process unless ``process`` or PROCESS_ONLY says."""
    argv = [str(a) for a in args]
    if process or _LEFT_RUNNING or _command_word(argv) in PROCESS_ONLY:
        return subprocess.run(
            [HOIST, *argv], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
        )
    return _in_process(argv, env, cwd, timeout)


def _command_word(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (after hoist's own options: --data-dir D, --user U)."""
    i = 0
    while i < len(argv):
        if argv[i] in ("--data-dir", "--user"):
            i += 2
        elif argv[i].startswith("-"):
            i += 1
        else:
            return argv[i]
    return None


def _in_process(
    argv: list[str], env: Mapping[str, str] | None, cwd: Path | None, timeout: float | None
) -> subprocess.CompletedProcess[str]:
    # A text stream over bytes: `hoist logs` and `run` write a kernel's output to stdout.buffer.
    # It never closes like a pipe, so main's BrokenPipeError path (silence_stdout, a dup2 over
    # fd 1, pytest's) is never taken here; the rich Consoles write to sys.stdout when they print.
    out = io.TextIOWrapper(io.BytesIO(), "utf-8", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), "utf-8", write_through=True)
    call = _Call(out, err)
    code: list[int] = []

    def command() -> None:
        _CALL.set(call)
        code.append(_exit_code(argv))

    # On a thread of its own: main's asyncio.run needs a thread with no loop running (an async
    # test has one), and the thread's end is the command's (the CLI skips signal handlers there).
    thread = threading.Thread(target=command, name="hoist-in-process", daemon=True)
    with _IN_PROCESS, _environment(env, cwd), _routed(), _logged_to(call):
        thread.start()
        thread.join(timeout)
    if thread.is_alive():  # its later output goes to the test process's streams, not a buffer
        _LEFT_RUNNING.append(thread)
        raise subprocess.TimeoutExpired([HOIST, *argv], timeout or 0, _text(out), _text(err))
    return subprocess.CompletedProcess([HOIST, *argv], code[0], _text(out), _text(err))


@contextlib.contextmanager
def _routed() -> Iterator[None]:
    """sys.stdout and sys.stderr routed by command (_Routed) meanwhile."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (
        cast(TextIO, _Routed("out", saved[0])),
        cast(TextIO, _Routed("err", saved[1])),
    )
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


@contextlib.contextmanager
def _logged_to(call: _Call) -> Iterator[None]:
    """The command's log records on its stderr meanwhile, as a `hoist` process prints them: it
    configures no logging, so Python's last resort writes WARNING and above, the bare message
    (and its traceback).  Here pytest's own handlers on the root logger stand in the way."""
    handler = logging.StreamHandler(call.err)
    handler.setLevel(logging.WARNING)
    handler.addFilter(lambda _: _CALL.get() is call)  # not another thread's records
    logging.root.addHandler(handler)
    try:
        yield
    finally:
        logging.root.removeHandler(handler)


def _exit_code(argv: list[str]) -> int:
    """main's return, or what the interpreter makes of an exception that ends a process."""
    try:
        return cli.main(argv)
    except SystemExit as e:  # argparse: 2 for a usage error, 0 after --help or --version
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except Exception:
        traceback.print_exc()
        return 1


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None, cwd: Path | None) -> Iterator[None]:
    """os.environ as ``env`` and the working directory ``cwd`` meanwhile (None: as they are)."""
    saved, here = dict(os.environ), os.getcwd()
    try:
        if env is not None:
            _set_environ(env)
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(here)
        _set_environ(saved)


def _set_environ(env: Mapping[str, str]) -> None:
    for name in set(os.environ) - set(env):
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _text(stream: io.TextIOWrapper) -> str:
    """What subprocess.run(text=True) reads: decoded, universal newlines."""
    data = stream.buffer.getvalue()  # type: ignore[attr-defined]
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


def on_own_thread(work: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60) -> T:
    """``work()`` run to its end by an event loop on a thread of its own (the test may be
    running one)."""
    result: list[T] = []
    failed: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(work()))
        except BaseException as e:  # raised again in the caller's thread
            failed.append(e)

    thread = threading.Thread(target=target, name="hoist-test-nats", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"not done within {timeout}s")
    if failed:
        raise failed[0]
    return result[0]


@dataclass
class Stack:
    data_dir: Path
    proc: subprocess.Popen[str]
    log: Path
    images: Iterator[str]
    medium_images: Iterator[str]
    big_images: Iterator[str]

    def hoist(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """`hoist --data-dir D ARGS` without a terminal, in this process (see run_hoist);
        ``env`` is added to this process's environment."""
        argv = ["--data-dir", str(self.data_dir), *args]
        return run_hoist(argv, env={**os.environ, **(env or {})}, timeout=timeout)

    def hoist_process(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """The same, as a `hoist` process: for a test of the binary itself."""
        argv = ["--data-dir", str(self.data_dir), *args]
        return run_hoist(argv, env={**os.environ, **(env or {})}, timeout=timeout, process=True)

    def in_read_model(self, session_id: str, timeout: float = 15) -> dict[str, Any]:
        """The sessions query's row of ``session_id`` once the read models reflect the session's
        last event so far (one query that waits: ``min_seq``), e.g. for prefixes to resolve."""

        url = self.creds("client")

        async def ask() -> dict[str, Any]:
            conn = await Connection.open(url)
            try:
                seq = await session_log.last_seq(conn, session_id)
                assert seq > 0, f"no event of session {session_id}"
                reply = await conn.request(
                    f"{subjects.QUERY}.sessions",
                    {"session_id": session_id, "min_seq": seq, "timeout": timeout},
                    wait_s=timeout + 5,
                )
            finally:
                await conn.close()
            (row,) = reply["rows"]
            return dict(row)

        return on_own_thread(ask, timeout + 15)

    def caught_up(self, timeout: float = 15) -> None:
        """Until the manager's read models reflect the whole log as it is now (one query that
        waits: ``min_seq``, the log's head): a query asked next sees every change made so far
        (they commit up to a second after an event, projections.runner.MAX_PAUSE_S)."""
        url = self.creds("client")

        async def ask() -> None:
            conn = await Connection.open(url)
            try:
                head = await event_store(conn.nc).head()
                await conn.request(
                    f"{subjects.QUERY}.agents",
                    {"min_seq": head, "timeout": timeout},
                    wait_s=timeout + 5,
                )
            finally:
                await conn.close()

        on_own_thread(ask, timeout + 15)

    def creds(self, role: str) -> str:
        return self.hoist("creds", role).stdout.strip()

    def next_image(self) -> str:
        """An image no agent holds yet: every run of it pulls."""
        return next(self.images)

    def next_medium_image(self) -> str:
        """One whose pull lasts a few seconds: a view of it advancing can be watched."""
        return next(self.medium_images)

    def next_big_image(self) -> str:
        """One whose pull lasts ~10 s: time to detach or press Ctrl-C in the middle."""
        return next(self.big_images)


def start_stack(data_dir: Path, *args: str, timeout: float = 60) -> Stack:
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir.parent / "dummy.json"
    config.write_text(json.dumps(DUMMY_CONFIG))
    log = data_dir.parent / f"up-{uuid.uuid4().hex[:6]}.log"
    out = open(log, "w")
    proc = subprocess.Popen(
        [
            HOIST,
            "--data-dir",
            str(data_dir),
            "up",
            "--runtime",
            "dummy",
            "--nats-port",
            str(free_port()),
            "--dummy-config",
            str(config),
            *args,
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out.close()
    wait_for(lambda: "Running; Ctrl-C" in log.read_text() or proc.poll() is not None, timeout)
    if proc.poll() is not None:
        raise RuntimeError(f"hoist up exited {proc.returncode}:\n{log.read_text()}")
    stack = Stack(data_dir, proc, log, iter(TEST_IMAGES), iter(MEDIUM_IMAGES), iter(BIG_IMAGES))
    # What `hoist up` did before its banner (a demo that runs, agents that joined) is in what
    # the first query reads: an in-process command comes too soon after it for the read models.
    stack.caught_up()
    return stack


def stop_stack(stack: Stack) -> int:
    if stack.proc.poll() is None:
        stack.proc.send_signal(signal.SIGTERM)
    return stack.proc.wait(60)


def wait_for(condition: Callable[[], object], timeout: float, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)


class Terminal:
    """A tmux session on its own server socket: type commands, read the screen."""

    def __init__(self, width: int = 160, height: int = 40) -> None:
        self.socket = f"hoist-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height))

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True
        ).stdout

    def type(self, line: str) -> None:
        self._tmux("send-keys", "-t", "t", line, "Enter")

    def ctrl_c(self) -> None:
        self._tmux("send-keys", "-t", "t", "C-c")

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "t")

    def clear(self) -> None:
        self._tmux("send-keys", "-t", "t", "clear", "Enter")
        # The shell clears when it gets to it: until then a reader still finds the old screen
        # (a loaded machine once read the last command's EXIT= as the next one's).
        wait_for(lambda: len(self.screen().strip().splitlines()) <= 1, 10, interval=0.05)
        self._tmux("clear-history", "-t", "t")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
