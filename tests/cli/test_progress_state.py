"""The session view's arithmetic: a session's pulls, the bytes across agents, rates, ETA."""

from __future__ import annotations

import copy
import io
import re

import pytest
from rich.console import Console

from domain.rpc import LayerProgress, PullProgress
from domain.session import Session
from domain.status import KernelStatus
from services.cli.progress_view import PlainPrinter, Rate, SessionState, render

MiB = 1024**2


def pulling_session(agents: list[str], image: str = "img:1") -> SessionState:
    session = Session.enqueue(
        owner="ann",
        image=image,
        resources={"cpu": 1, "mem": MiB},
        resource_group="default",
        cluster_size=len(agents),
    )
    kernels = list(session.kernels)
    session.schedule(dict(zip(kernels, agents, strict=True)))
    for kernel, agent in zip(kernels, agents, strict=True):
        session.mark_pulling(kernel, task_id=f"task-{agent}")
    state = SessionState(session.id, clock=lambda: now[0])
    for event in session.collect_events():
        state.apply_event(event)  # type: ignore[arg-type]
    return state


now = [0.0]


def progress(agent: str, layers: list[tuple[int, int]], done: bool = False) -> PullProgress:
    return PullProgress(
        agent_id=agent,
        task_id=f"task-{agent}",
        image="img:1",
        layers=[
            LayerProgress(id=f"l{i}", status="Downloading", current=c, total=t)
            for i, (c, t) in enumerate(layers)
        ],
        current=sum(c for c, _ in layers),
        total=sum(t for _, t in layers),
        done=done,
    )


def test_a_pull_shared_by_two_kernels_on_one_agent_counts_once() -> None:
    state = pulling_session(["a1", "a1", "a2"])
    assert state.pull_keys() == [("a1", "task-a1"), ("a2", "task-a2")]
    state.apply_progress(progress("a1", [(50 * MiB, 100 * MiB)]))
    state.apply_progress(progress("a2", [(100 * MiB, 100 * MiB)], done=True))
    assert state.totals() == (150 * MiB, 200 * MiB, False)
    assert state.fraction() == 0.75
    assert state.status == KernelStatus.PULLING


def test_unsized_layers_count_as_the_mean_and_100_percent_waits_for_done() -> None:
    state = pulling_session(["a1"])
    # Two layers sized, one announced without a size yet: expected 300 MiB, not 200.
    state.apply_progress(progress("a1", [(100 * MiB, 100 * MiB), (100 * MiB, 100 * MiB), (0, 0)]))
    assert state.totals()[1] == 300 * MiB
    state.apply_progress(progress("a1", [(100 * MiB, 100 * MiB)]))
    assert state.fraction() == 0.99  # all known bytes are in, but the agent has not said done
    state.apply_progress(progress("a1", [(100 * MiB, 100 * MiB)], done=True))
    assert state.fraction() == 1.0


def test_rate_and_eta_over_the_last_seconds() -> None:
    state = pulling_session(["a1"])
    for second in range(5):
        now[0] = float(second)
        state.apply_progress(progress("a1", [(second * 10 * MiB, 100 * MiB)]))
    rate = state.rates[("a1", "task-a1", "l0")].per_s(4.0)
    assert rate is not None and abs(rate - 10 * MiB) < 1
    console = Console(width=140, record=True)
    console.print(render(state))
    text = console.export_text()
    assert "10.0 MiB/s  ETA 0:00:06" in text and "40.0 MiB / 100.0 MiB" in text


def _screen(state: SessionState, styles: bool = False) -> str:
    console = Console(width=160, record=True, force_terminal=True, color_system="standard")
    console.print(render(state))
    return console.export_text(styles=styles)


def _failed(agent: str, layers: list[tuple[int, int]], error: str) -> PullProgress:
    p = progress(agent, layers, done=True)
    return PullProgress(**{**{f: getattr(p, f) for f in p.__struct_fields__}, "error": error})


def test_a_failed_pull_is_drawn_as_a_failure_not_a_full_bar() -> None:
    state = pulling_session(["a1", "a2"])
    state.apply_progress(progress("a2", [(100 * MiB, 100 * MiB)], done=True))
    state.apply_progress(_failed("a1", [(50 * MiB, 100 * MiB)], "manifest unknown"))
    assert state.fraction() == 0.75  # what arrived, not 100 %
    assert state.failures() == ["manifest unknown"]
    for kernel_cancelled in (False, True):
        if kernel_cancelled:  # and once the manager cancelled the kernel, the same
            session = copy.deepcopy(state.session)  # the manager's copy, not the view's
            assert session is not None
            session.pull_ended("a1", "image-pull-failed: manifest unknown")
            for event in session.collect_events():
                state.apply_event(event)  # type: ignore[arg-type]
        text = _screen(state)
        session_line = next(line for line in text.splitlines() if "all agents" in line)
        assert "75.0 %" in session_line and "100.0 %" not in text, text
        assert "pull failed: manifest unknown" in session_line, text
        # A kernel's row by its agent column: ids are random hex and may contain "a1" themselves.
        kernel_line = next(
            line for line in text.splitlines() if line.startswith("  kernel ") and " a1 " in line
        )
        assert ("CANCELLED" if kernel_cancelled else "PULLING") in kernel_line, text
        # The reason, under the table (a cell as wide as it would widen every kernel row).
        assert "pull failed (kernel " in text and "on a1, at 50.0 MiB): manifest unknown" in text
        assert kernel_line.index(" a1 ") < 30, kernel_line  # the kernel column stays narrow
        # In red: the session bar and the failure lines (ANSI 31), nothing of it green.
        styled = next(line for line in _screen(state, True).splitlines() if "all agents" in line)
        assert "\x1b[31m━" in styled or "\x1b[1;31m━" in styled, repr(styled)


def test_columns_keep_their_place_from_frame_to_frame() -> None:
    """Texts of every length pass through a pull (layer statuses, byte counts, rates, the
    ETA); the bars and the columns after them stay where they were."""
    state = pulling_session(["a1"])
    frames = []
    steps = [("Waiting", 0), ("Downloading", 5 * MiB), ("Downloading", 95 * MiB)]
    for second, (status, current) in enumerate(steps):
        now[0] = float(second)
        p = progress("a1", [(current, 100 * MiB), (0, 2 * 1024 * MiB)])
        layers = [LayerProgress(id=x.id, status=status, current=x.current, total=x.total)
                  for x in p.layers]  # fmt: skip
        state.apply_progress(PullProgress(**{**{f: getattr(p, f) for f in p.__struct_fields__},
                                             "layers": layers}))  # fmt: skip
        frames.append(_screen(state).splitlines())

    def places(lines: list[str]) -> tuple[int, ...]:
        layer = next(line for line in lines if line.lstrip().startswith("l0"))
        total = next(line for line in lines if "all agents" in line)
        return layer.index("━"), layer.index(" / "), total.index("━"), total.index(" / ")

    assert places(frames[0]) == places(frames[1]) == places(frames[2]), "\n".join(
        "\n".join(f) for f in frames
    )


def test_status_lines_print_every_change_even_those_made_together() -> None:
    """The scheduler records SCHEDULED, PREPARED and CREATING in one batch: a pipe still gets a
    line for each, once, with the agent from SCHEDULED on."""
    session = Session.enqueue(
        owner="ann", image="img:1", resources={"cpu": 1, "mem": MiB}, resource_group="default"
    )
    [kernel] = session.kernels
    state = SessionState(session.id)
    out = io.StringIO()
    printer = PlainPrinter(out)
    for event in session.collect_events():
        state.apply_event(event)  # type: ignore[arg-type]
    printer.update(state)
    session.schedule({kernel: "a1"})
    session.start_preparing(holding={"a1"})
    session.start_creating()
    for event in session.collect_events():
        state.apply_event(event)  # type: ignore[arg-type]
    printer.update(state)
    printer.update(state)  # nothing new: nothing printed
    lines = [line.split(" ", 2)[2] for line in out.getvalue().splitlines()]
    assert lines == [
        f"{kernel[:12]} - PENDING enqueued",
        f"{kernel[:12]} a1 SCHEDULED scheduled",
        f"{kernel[:12]} a1 PREPARED image-present: a1 holds it, by the event log",
        f"{kernel[:12]} a1 CREATING creating",
    ]


def test_the_view_fits_80_columns_with_every_rate_and_eta() -> None:
    """Issue 38, item 7: in an 80-column terminal the bars go and names shorten first; every
    downloading layer and the session keep their bytes, rate and ETA on one line each."""
    agents = ["agent-with-a-long-name-1", "agent-2"]
    state = pulling_session(agents, image="tensorflow/tensorflow:2.16.1-gpu")
    for second in range(3):
        now[0] = float(second)
        for agent in agents:
            p = progress(agent, [(second * 300 * MiB, 1023 * MiB), (second * MiB, 2 * 1024 * MiB)])
            layers = [LayerProgress(id=f"{x.id}ae38a0dc9508", status="Verifying Checksum",
                                    current=x.current, total=x.total)
                      for x in p.layers]  # fmt: skip
            state.apply_progress(PullProgress(**{**{f: getattr(p, f) for f in p.__struct_fields__},
                                                 "layers": layers}))  # fmt: skip
    for width in (80, 100):
        console = Console(width=width, record=True, force_terminal=True, color_system="standard")
        console.print(render(state, width))
        lines = console.export_text().splitlines()
        assert all(len(line.rstrip()) <= width for line in lines), "\n".join(lines)
        layer_lines = [line for line in lines if "/2.0 GiB" in line or "/1023.0 MiB" in line]
        assert len(layer_lines) == 4, "\n".join(lines)  # two layers on each of two agents
        for line in layer_lines:
            assert re.search(r"MiB/s ETA \d:\d\d:\d\d", line), "\n".join(lines)
        session_line = next(line for line in lines if "all agents" in line)
        assert re.search(r"% .*MiB/s ETA \d:\d\d:\d\d", session_line), "\n".join(lines)
        assert "agent-2" in "\n".join(lines) and "PULLING" in lines[0]
        # The reason before the image, which is cut first; a status apart from its reason.
        assert lines[0].index(" pulling ") < lines[0].index("tensorflow"), lines[0]
        assert all(re.search(r"PULLING +\S", line) for line in lines if "  kernel " in line)
        # The bar goes first: none on the layers at 80, back in the room 100 leaves.
        assert any("━" in line for line in layer_lines) == (width == 100), "\n".join(lines)
    # As wide as the full layout: the full layout, names whole.
    full = Console(width=160, record=True)
    full.print(render(state, 160))
    text = full.export_text()
    assert state.session_id in text and "agent-with-a-long-name-1" in text
    assert "l0ae38a0dc95 " in text


def test_a_layer_that_waited_at_zero_is_rated_from_when_it_moved() -> None:
    """A layer queued behind others sits at 0 bytes, then downloads: its rate counts from its
    last 0, not its first (a newcomer saw 1.7 MiB/s and an 8-minute ETA for a 10 s pull)."""
    rate = Rate()
    for t in range(11):
        rate.add(float(t), 0)  # queued for 10 s
    rate.add(11.0, 10 * MiB)
    assert rate.per_s(11.0) == pytest.approx(10 * MiB)
    stalled = Rate()  # a counter that moved, then stalls, still shows its rate falling
    stalled.add(0.0, 0)
    stalled.add(1.0, MiB)
    assert stalled.per_s(5.0) == pytest.approx(MiB / 5)
