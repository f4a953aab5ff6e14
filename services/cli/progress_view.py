"""The live view of one session, like `docker pull` for a whole cluster: a line per kernel, a
bar per layer under each kernel that is pulling, and one bar for the session across all agents.

State comes from two JetStream streams, both replayed then followed, so a late watcher sees
where everything stands at once: the session's events (``hoist.events.session.<id>``) folded
into the domain's Session aggregate (its status rules, not a copy of them), and the pulls'
progress (stream HOIST_PROGRESS keeps the last message per pull, delivered LAST_PER_SUBJECT).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, TextIO

from nats.aio.msg import Msg
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from client import session_log
from client.connection import CliError, Connection
from domain import admission, rpc, subjects
from domain.events import Event
from domain.image_ref import familiar
from domain.session import Session
from domain.status import TERMINAL, Kernel, KernelStatus
from services.cli import output
from services.cli.output import human_bytes, human_duration
from transport import progress as progress_stream

S = KernelStatus
RATE_WINDOW_S = 3.0  # rates are averaged over this many seconds of samples
REFRESH_PER_S = 8
# The watch ends when the session reaches one of these.
SETTLED = frozenset({S.RUNNING, *TERMINAL})
FAILED = frozenset({S.ERROR, S.CANCELLED})
_STATUS_STYLE = {
    S.RUNNING: "bold green",
    S.PULLING: "cyan",
    S.ERROR: "bold red",
    S.CANCELLED: "red",
    S.TERMINATED: "dim",
    S.PENDING: "yellow",
}


def eta(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


log = logging.getLogger(__name__)


@dataclass
class Rate:
    """Bytes per second of a growing counter, over the last RATE_WINDOW_S of samples."""

    samples: deque[tuple[float, int]] = field(default_factory=deque)
    seen: float = 0.0  # when the last sample's value was last seen

    def add(self, now: float, value: int) -> None:
        if self.samples and self.samples[-1][1] == value:
            self.seen = now
            return  # a repeat says nothing new; the window keeps the time the value was reached
        if len(self.samples) == 1 and self.samples[0][1] == 0:
            # It waited at 0 (a layer queued behind others) until it moved: count from the
            # last 0 seen, or the wait reads as a slow start and the ETA as hours.
            self.samples[0] = (self.seen, 0)
        self.samples.append((now, value))
        self.seen = now
        while len(self.samples) > 2 and now - self.samples[0][0] > RATE_WINDOW_S:
            self.samples.popleft()

    def per_s(self, now: float) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, v0), (_, v1) = self.samples[0], self.samples[-1]
        # Measured up to now, not the last sample: a stalled pull shows its rate falling.
        return (v1 - v0) / max(now - t0, 1e-3)


@dataclass
class SessionState:
    """What is known of one session: its aggregate and the progress of its pulls."""

    session_id: str
    session: Session | None = None
    pulls: dict[tuple[str, str], rpc.PullProgress] = field(default_factory=dict)
    rates: dict[tuple[str, ...], Rate] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    # The widest cell each column of the view has drawn: columns never narrow between frames.
    widths: dict[tuple[str, int], int] = field(default_factory=dict)

    def apply_event(self, event: Event) -> None:
        subject = subjects.session_events(self.session_id)
        self.session = admission.fold(self.session, event, subject)

    def apply_progress(self, progress: rpc.PullProgress) -> None:
        key = (progress.agent_id, progress.task_id)
        self.pulls[key] = progress
        now = self.clock()
        self.rates.setdefault(key, Rate()).add(now, progress.current)
        for layer in progress.layers:
            self.rates.setdefault((*key, layer.id), Rate()).add(now, layer.current)
        self.rates.setdefault(("session",), Rate()).add(now, self.totals()[0])

    @property
    def status(self) -> KernelStatus | None:
        return self.session.status if self.session else None

    @property
    def status_info(self) -> str:
        return self.session.status_info if self.session else ""

    def pull_keys(self) -> list[tuple[str, str]]:
        """The session's pulls, one per (agent, task): kernels sharing a pull count it once."""
        keys: dict[tuple[str, str], None] = {}
        for kernel in self.session.kernels.values() if self.session else ():
            if kernel.agent_id and kernel.pull_task_id:
                keys[(kernel.agent_id, kernel.pull_task_id)] = None
        return list(keys)

    def totals(self) -> tuple[int, int, bool]:
        """(bytes done, bytes expected, every pull finished) across the session's pulls.

        A layer announced without a size yet (docker's "Pulling fs layer") counts as the mean
        of the sized layers of its pull, so the expected total does not jump when it starts.
        """
        current = total = 0
        finished = True
        for key in self.pull_keys():
            p = self.pulls.get(key)
            if p is None:
                finished = False
                continue
            sized = [layer.total for layer in p.layers if layer.total]
            unsized = len(p.layers) - len(sized)
            current += p.current
            total += max(p.total, sum(sized) + (unsized * sum(sized) // len(sized) if sized else 0))
            finished = finished and p.done
        return current, total, finished

    def failures(self) -> list[str]:
        """Why the session's failed pulls failed, one entry per failed pull."""
        done = (self.pulls.get(key) for key in self.pull_keys())
        return [p.error for p in done if p is not None and p.done and p.error]

    def fraction(self) -> float | None:
        """Of the session's pulls done; below 1 until every pull says done (a pull may reveal
        more layers after the known ones are complete) and below 1 for good once one failed."""
        current, total, finished = self.totals()
        if not self.pull_keys():
            return None
        if finished and not self.failures():
            return 1.0
        return min(current / total, 0.99) if total else 0.0


# --- following the streams -------------------------------------------------------------------


async def follow(
    conn: Connection, state: SessionState, changed: asyncio.Event, caught_up: asyncio.Event
) -> None:
    """Fold the session's events and its pulls' progress into ``state`` until cancelled;
    ``caught_up`` is set once the events stored when it started have been read."""
    last = await session_log.last_seq(conn, state.session_id)
    if last == 0:
        raise CliError(f"unknown session {state.session_id}: list sessions with `hoist sessions`")
    new_pulls = asyncio.Event()
    progress_task = asyncio.create_task(_follow_progress(conn, state, changed, new_pulls))
    try:
        async for rec in session_log.records(conn, state.session_id, follow=True):
            # The rule of every reader: what it refuses is skipped (hoist history shows it).
            try:
                state.apply_event(admission.admit(rec.subject, rec.headers, rec.data))
            except admission.Inadmissible:
                pass
            else:
                changed.set()
                new_pulls.set()
            if rec.seq >= last:
                caught_up.set()
    finally:
        progress_task.cancel()


async def _follow_progress(
    conn: Connection, state: SessionState, changed: asyncio.Event, new_pulls: asyncio.Event
) -> None:
    """Pull progress: live from core NATS (``hoist.progress.<agent>.<task>``), and for each of
    the session's pulls, once, the last message the progress stream kept (a direct get), so a
    late watcher draws where every pull stands.  No JetStream consumer: readers may not create
    one, since a consumer's deliver subject could aim the stream at the manager's request
    subjects."""
    js = conn.nc.jetstream()

    async def on_progress(msg: Msg) -> None:
        try:
            progress = rpc.decode(msg.data, rpc.PullProgress)
        except rpc.RequestError:
            return  # a malformed message is someone else's bug; the view goes on
        if msg.subject != f"{subjects.PROGRESS}.{progress.agent_id}.{progress.task_id}":
            return  # an agent publishes only its own pulls' subjects: this one is not it
        state.apply_progress(progress)
        changed.set()

    sub = await conn.nc.subscribe(f"{subjects.PROGRESS}.>", cb=on_progress)
    fetched: set[tuple[str, str]] = set()
    try:
        while True:
            await new_pulls.wait()
            new_pulls.clear()
            for key in state.pull_keys():
                if key in fetched:
                    continue
                fetched.add(key)
                try:
                    last = await progress_stream.latest(js, *key)
                except Exception as e:  # the live updates still come; only the snapshot is lost
                    log.warning("no last progress of pull %s/%s: %s", *key, e)
                    continue
                if last is not None and key not in state.pulls:  # live news beat it: keep those
                    state.apply_progress(last)
                    changed.set()
    finally:
        await sub.unsubscribe()


# --- rendering --------------------------------------------------------------------------------


# Each column's least width, wide enough for what its cells hold at their widest (a bar, a
# layer status such as "Verifying Checksum", "1023.9 MiB / 1023.9 MiB", a rate and its ETA),
# so growing numbers move nothing; longer texts (agent ids, reasons) widen a column for good.
_KERNEL_COLUMNS = (21, 18, 24, 23, 25, 0)
_SESSION_COLUMNS = (12, 40, 32, 25)
# A terminal narrower than the full layout gets the narrow one.
FULL_WIDTH = sum(_KERNEL_COLUMNS) + len(_KERNEL_COLUMNS) - 1
_FAILED = "red"


def _bar(fraction: float | None, width: int = 30, failed: bool = False) -> ProgressBar:
    if fraction is None:
        return ProgressBar(total=None, width=width, pulse=True)
    if failed:
        return ProgressBar(
            total=1.0, completed=fraction, width=width, complete_style=_FAILED,
            finished_style=_FAILED,
        )  # fmt: skip
    return ProgressBar(total=1.0, completed=fraction, width=width)


def _bytes(current: int, total: int, narrow: bool = False) -> str:
    if narrow:
        return f"{human_bytes(current):>10}/{human_bytes(total):<10}"
    return f"{human_bytes(current):>10} / {human_bytes(total):<10}"


def _width(cell: RenderableType) -> int:
    if isinstance(cell, str):
        return cell_len(cell)
    if isinstance(cell, Text):
        return cell.cell_len
    if isinstance(cell, ProgressBar):
        return cell.width or 0
    return 0


def _grid(
    state: SessionState, name: str, least: tuple[int, ...], rows: list[list[RenderableType]]
) -> Table:
    """A borderless table whose columns are as wide as the widest cell they ever held (this
    frame or an earlier one), at least ``least``: columns do not shift from frame to frame."""
    for row in rows:
        for i, cell in enumerate(row):
            key = (name, i)
            state.widths[key] = max(state.widths.get(key, least[i]), _width(cell))
    grid = Table.grid(padding=(0, 1))
    for i, floor in enumerate(least):
        grid.add_column(min_width=state.widths.get((name, i), floor))
    for row in rows:
        grid.add_row(*row)
    return grid


def _status_text(status: KernelStatus | None) -> Text:
    name = status.value if status else "?"
    return Text(name, style=_STATUS_STYLE.get(status, "bold") if status else "dim")


def render(state: SessionState, width: int | None = None) -> RenderableType:
    """The view, for a terminal ``width`` columns wide (None: as wide as it needs).  Narrower
    than the full layout, the bars shrink, then names shorten and the layer bars go: the byte
    counts, rates and ETAs stay (issue 38)."""
    session = state.session
    if session is None:
        return Text(f"session {state.session_id}: waiting for its first event...")
    narrow = width is not None and width < FULL_WIDTH
    items = _items(state, session)
    if narrow:
        assert width is not None
        rows = _narrow_rows(state, session, items, width)
    else:
        rows = _full_rows(state, session, items)
    return Group(*rows)


# What the view shows, in order, whatever the layout: a kernel, a layer of its pull, its image
# pulled, its pull not heard from yet.  Failed pulls are said under the table.
_Item = tuple[str, Kernel, "rpc.PullProgress | None", "rpc.LayerProgress | None"]


def _items(state: SessionState, session: Session) -> list[_Item]:
    items: list[_Item] = []
    for kernel in session.kernels.values():
        items.append(("kernel", kernel, None, None))
        if kernel.agent_id is None or kernel.pull_task_id is None:
            continue
        pull = state.pulls.get((kernel.agent_id, kernel.pull_task_id))
        if pull is not None and pull.done and pull.error:  # whatever the kernel's status now
            items.append(("failed", kernel, pull, None))
        elif kernel.status != S.PULLING:
            if pull is not None and pull.done:
                items.append(("pulled", kernel, pull, None))
        elif pull is None:
            items.append(("waiting", kernel, None, None))
        else:
            items.extend(("layer", kernel, pull, layer) for layer in pull.layers)
    return items


def _layer_rate(
    state: SessionState, pull: rpc.PullProgress, layer: rpc.LayerProgress
) -> float | None:
    if layer.current >= layer.total:
        return None
    return state.rates.get((pull.agent_id, pull.task_id, layer.id), Rate()).per_s(state.clock())


def _failure(kernel: Kernel, pull: rpc.PullProgress) -> Text:
    where = f"kernel {kernel.kernel_id[:12]} on {kernel.agent_id}"
    return Text(
        f"  pull failed ({where}, at {human_bytes(pull.current)}): {pull.error}",
        style=f"bold {_FAILED}",
    )


def _session_last(state: SessionState, fraction: float, narrow: bool) -> RenderableType:
    """After the session bar: why its pull failed, in red, else its rate and ETA."""
    failures = state.failures()
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        return Text(f"pull failed: {failures[0]}{more}", style=f"bold {_FAILED}")
    current, total, _ = state.totals()
    rate = state.rates.get(("session",), Rate()).per_s(state.clock())
    return _rate_text(rate, current, total, narrow) if fraction < 1 else ""


def _full_rows(state: SessionState, session: Session, items: list[_Item]) -> list[RenderableType]:
    head = Text.assemble(
        ("session ", "bold"),
        (state.session_id, "bold"),
        f"  {familiar(session.image)}  {len(session.kernels)} kernel(s)  ",
        _status_text(session.status),
        f"  {session.status_info}",
    )
    cells: list[list[RenderableType]] = []
    # Under the table, not in it: a reason as wide as its text would widen the kernel column
    # of every row.
    pull_failures: list[RenderableType] = []
    for kind, kernel, pull, layer in items:
        if kind == "kernel":
            cells.append(
                [
                    Text(f"  kernel {kernel.kernel_id[:12]}"),
                    Text(kernel.agent_id or "-", style="magenta"),
                    _status_text(kernel.status),
                    Text(kernel_info(kernel), style="dim"),
                    "",
                    "",
                ]
            )
        elif kind == "failed" and pull is not None:
            pull_failures.append(_failure(kernel, pull))
        elif kind == "pulled" and pull is not None:
            cells.append(["    image pulled", "", "", _bytes(pull.total, pull.total), "", ""])
        elif kind == "waiting":
            cells.append(["    waiting for progress", "", "", "", "", ""])
        elif pull is not None and layer is not None:
            fraction = layer.current / layer.total if layer.total else None
            rate = _layer_rate(state, pull, layer)
            cells.append(
                [
                    Text(f"    {layer.id[:12]}"),
                    Text(layer.status),
                    _bar(fraction, 24),
                    _bytes(layer.current, layer.total),
                    _rate_text(rate, layer.current, layer.total) if rate is not None else "",
                    "",
                ]
            )
    rows: list[RenderableType] = [
        head,
        _grid(state, "kernels", _KERNEL_COLUMNS, cells),
        *pull_failures,
    ]
    fraction = state.fraction()
    if fraction is not None:
        current, total, _ = state.totals()
        line: list[RenderableType] = [
            Text("  all agents", style="bold"),
            _bar(fraction, 40, failed=bool(state.failures())),
            f"{fraction * 100:5.1f} %  {_bytes(current, total)}",
            _session_last(state, fraction, narrow=False),
        ]
        rows.append(_grid(state, "session", _SESSION_COLUMNS, [line]))
    return rows


# The narrow layout's fixed columns: a layer's id (8 hex), its status, its bytes, its rate and
# ETA; the session's name, percent and bytes, rate and ETA.  A bar goes in what is left, if
# at least _MIN_BAR.
_NARROW_LAYER = (12, 13, 21, 24)
_NARROW_SESSION = (12, 29, 24)
_MIN_BAR = 8
_AGENT_MAX = 16


def _fixed_grid(widths: list[int], cells: list[RenderableType]) -> Table:
    """One row of columns of these exact widths (a cell too long ends in an ellipsis)."""
    grid = Table.grid(padding=(0, 1))
    for w in widths:
        grid.add_column(width=w, no_wrap=True, overflow="ellipsis")
    grid.add_row(*cells)
    return grid


def _with_bar(
    widths: tuple[int, ...], cells: list[RenderableType], at: int, width: int, bar: ProgressBar
) -> Table:
    """``cells`` in ``widths``, with ``bar`` put at column ``at`` when what is left of ``width``
    holds one (at most its own width), else without it."""
    room = width - sum(widths) - len(widths)  # each column and its padding
    if room >= _MIN_BAR:
        bar.width = min(room, bar.width or room)
        return _fixed_grid([*widths[:at], bar.width, *widths[at:]], [*cells[:at], bar, *cells[at:]])
    return _fixed_grid(list(widths), cells)


def _narrow_rows(
    state: SessionState, session: Session, items: list[_Item], width: int
) -> list[RenderableType]:
    image = familiar(session.image)
    head = Text.assemble(
        ("session ", "bold"),
        (state.session_id[:12], "bold"),
        "  ",
        _status_text(session.status),
        f"  {len(session.kernels)} kernel(s)  {session.status_info}  ",
        image,  # last: the reason matters more, a long reference is cut
        no_wrap=True,
        overflow="ellipsis",
    )
    head.truncate(width, overflow="ellipsis")
    agent_width = min(
        _AGENT_MAX, max((len(k.agent_id or "-") for k in session.kernels.values()), default=1)
    )
    rows: list[RenderableType] = [head]
    pull_failures: list[RenderableType] = []
    for kind, kernel, pull, layer in items:
        if kind == "kernel":
            agent = (kernel.agent_id or "-")[:agent_width]
            line = Text.assemble(
                f"  kernel {kernel.kernel_id[:8]} ",
                (agent.ljust(agent_width), "magenta"),
                " ",
                _status_text(kernel.status),
                " " * max(1, 12 - len(kernel.status.value)),  # TERMINATING is 11
                (kernel_info(kernel), "dim"),
                no_wrap=True,
                overflow="ellipsis",
            )
            line.truncate(width, overflow="ellipsis")
            rows.append(line)
        elif kind == "failed" and pull is not None:
            pull_failures.append(_failure(kernel, pull))
        elif kind == "pulled" and pull is not None:
            rows.append(Text(f"    image pulled  {_bytes(pull.total, pull.total, narrow=True)}"))
        elif kind == "waiting":
            rows.append(Text("    waiting for progress"))
        elif pull is not None and layer is not None:
            fraction = layer.current / layer.total if layer.total else None
            rate = _layer_rate(state, pull, layer)
            cells: list[RenderableType] = [
                Text(f"    {layer.id[:8]}"),
                Text(layer.status),
                _bytes(layer.current, layer.total, narrow=True),
                _rate_text(rate, layer.current, layer.total, narrow=True) if rate else "",
            ]
            rows.append(_with_bar(_NARROW_LAYER, cells, 2, width, _bar(fraction, 24)))
    rows += pull_failures
    fraction = state.fraction()
    if fraction is not None:
        current, total, _ = state.totals()
        bar = _bar(fraction, 40, failed=bool(state.failures()))
        cells = [
            Text("  all agents", style="bold"),
            f"{fraction * 100:5.1f} % {_bytes(current, total, narrow=True)}",
            _session_last(state, fraction, narrow=True),
        ]
        rows.append(_with_bar(_NARROW_SESSION, cells, 1, width, bar))
    return rows


def kernel_info(kernel: Kernel) -> str:
    """Its status_info, and how long its command ran once it ended: ``exited: code 3 (ran
    1.2s)``."""
    if kernel.ran_s is None:
        return kernel.status_info
    return f"{kernel.status_info} (ran {human_duration(kernel.ran_s)})"


def _rate_text(rate: float | None, current: int, total: int, narrow: bool = False) -> str:
    if rate is None:
        return ""
    remaining = (total - current) / rate if rate > 0 and total > current else None
    gap = " " if narrow else "  "
    return f"{human_bytes(rate)}/s{gap}ETA {eta(remaining)}"


class PlainPrinter:
    """Status lines for a pipe or a log: a line per kernel status change and per quarter of
    the session's pull, nothing that redraws."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.printed: dict[str, int] = {}  # kernel id -> its status changes printed
        self.quarter = -1

    def update(self, state: SessionState) -> None:
        if state.session is None:
            return
        stamp = datetime.now().strftime("%H:%M:%S")
        for kernel in state.session.kernels.values():
            # From its history, not its status now: changes made together (PREPARED and
            # CREATING in one batch) or between two updates each get their line.
            history = kernel.status_history
            for i in range(self.printed.get(kernel.kernel_id, 0), len(history)):
                change = history[i]
                agent = "-" if change.status is KernelStatus.PENDING else kernel.agent_id or "-"
                why = kernel_info(kernel) if i == len(history) - 1 else change.status_info
                at = change.at.astimezone().strftime("%H:%M:%S")
                line = f"{at} kernel {kernel.kernel_id[:12]} {agent} {change.status.value} {why}"
                print(line, file=self.out)
            self.printed[kernel.kernel_id] = len(history)
        fraction = state.fraction()
        current, total, _ = state.totals()
        if fraction is not None and total and int(fraction * 4) > self.quarter:
            self.quarter = int(fraction * 4)
            print(
                f"{stamp} pull {fraction * 100:.0f}% {human_bytes(current)} / {human_bytes(total)}"
                " across all agents",
                file=self.out,
            )
        self.out.flush()


@dataclass
class Outcome:
    status: KernelStatus | None
    status_info: str
    detached: bool = False
    timed_out: bool = False


async def watch(
    conn: Connection,
    session_id: str,
    console: Console,
    *,
    live: bool,
    max_wait: float = 0.0,
    detach: asyncio.Event | None = None,
) -> Outcome:
    """Show the session until it runs or ends, ``detach`` is set (Ctrl-C), or ``max_wait``
    seconds (0: no limit) pass; the session itself is never touched."""
    state = SessionState(session_id)
    changed, caught_up = asyncio.Event(), asyncio.Event()
    detach = detach or asyncio.Event()
    follower = asyncio.create_task(follow(conn, state, changed, caught_up))
    deadline = time.monotonic() + max_wait if max_wait > 0 else None
    try:
        # The state as stored when we came in, before anything is drawn: never an empty bar.
        await _until(caught_up, follower, detach)
        await asyncio.sleep(0.05)  # the progress snapshot arrives within milliseconds
        outcome = await _show(state, console, live, follower, detach, deadline)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    return outcome


async def _show(
    state: SessionState,
    console: Console,
    live: bool,
    follower: asyncio.Task[None],
    detach: asyncio.Event,
    deadline: float | None,
) -> Outcome:
    printer = None if live else PlainPrinter(console.file)
    view = (
        Live(render(state, console.width), console=console, auto_refresh=False, transient=False)
        if live
        else None
    )
    if view is not None:
        view.start()
    try:
        while True:
            if view is not None:
                view.update(render(state, console.width), refresh=True)
            elif printer is not None:
                printer.update(state)
            if state.status in SETTLED:
                return Outcome(state.status, state.status_info)
            if detach.is_set():
                return Outcome(state.status, state.status_info, detached=True)
            if deadline is not None and time.monotonic() > deadline:
                return Outcome(state.status, state.status_info, timed_out=True)
            if follower.done():
                follower.result()  # raises what stopped it
            await asyncio.sleep(1 / REFRESH_PER_S)
    finally:
        if view is not None:
            view.stop()


async def _until(event: asyncio.Event, follower: asyncio.Task[None], detach: asyncio.Event) -> None:
    waiters = {
        asyncio.ensure_future(event.wait()),
        asyncio.ensure_future(detach.wait()),
        follower,
    }
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            if w is not follower:
                w.cancel()
    if follower.done():
        follower.result()


async def watch_and_report(
    conn: Connection, session_id: str, *, max_wait: float, detach: asyncio.Event
) -> int:
    """Watch a session start (live where stdout is a terminal) and say how it ended; the
    exit code: 0 running or detached, 1 failed, 2 still waiting after ``max_wait``."""
    console = output.console()
    outcome = await watch(
        conn, session_id, console, live=console.is_terminal, max_wait=max_wait, detach=detach
    )
    return report(session_id, outcome, max_wait)


def report(session_id: str, outcome: Outcome, max_wait: float, file: TextIO | None = None) -> int:
    file = file or sys.stdout
    status = outcome.status.value if outcome.status else "UNKNOWN"
    if outcome.detached:
        print(
            f"detached from session {session_id} ({status}: {outcome.status_info}); it goes on."
            f" Re-attach with `hoist watch {session_id}`",
            file=file,
            flush=True,
        )
        return 0
    if outcome.timed_out:
        print(
            f"session {session_id} still {status} ({outcome.status_info}) after {max_wait:g}s;"
            f" re-attach with `hoist watch {session_id}`",
            file=file,
            flush=True,
        )
        return 2
    print(f"session {session_id} {status} {outcome.status_info}", file=file, flush=True)
    return 1 if outcome.status in FAILED else 0
