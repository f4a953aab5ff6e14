"""The session view's arithmetic: a session's pulls, the bytes across agents, rates, ETA."""

from __future__ import annotations

from rich.console import Console

from domain.rpc import LayerProgress, PullProgress
from domain.session import Session
from domain.status import KernelStatus
from services.cli.progress_view import SessionState, render

MiB = 1024**2


def pulling_session(agents: list[str]) -> SessionState:
    session = Session.enqueue(
        owner="ann",
        image="img:1",
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
