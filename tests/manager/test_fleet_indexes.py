"""The fleet's incremental indexes agree with a full recomputation after any sequence of
changes (hypothesis drives the sequences; no nats-server: records are folded directly)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from domain import events as ev
from domain.agent import Agent
from domain.codec import ACTOR_HEADER, encode
from domain.liveness import AgentLiveness
from domain.placement_index import AgentIndex
from domain.scheduling import Policy, never_holds
from domain.session import Session
from domain.status import KernelStatus as S
from eventstore.store import Recorded
from services.manager.fleet import Fleet
from tests.domain.histories import only_kernel, session_at
from tests.domain.test_placement_index import index_state

GiB = 1024**3
AGENTS = ("a1", "a2", "a3", "a4")
GROUPS = ("default", "gpu")


class Log:
    """Records folded into a fresh fleet, in stream order."""

    def __init__(self) -> None:
        self.fleet = Fleet(None, None)  # type: ignore[arg-type]  # folding needs neither
        self.fleet.caught_up.set()
        self.seq = 0
        self.agents: dict[str, Agent] = {}
        self.liveness: dict[str, AgentLiveness] = {}

    def append(self, subject: str, aggregate: Any, actor: str) -> None:
        for event in aggregate.collect_events():
            self.seq += 1
            data, headers = encode(event)
            headers[ACTOR_HEADER] = actor
            self.fleet.fold(Recorded(self.seq, subject, headers, data, datetime.now(UTC)))

    def register(self, agent_id: str, group: str, cpu: int, mem_gib: int, gpu: int) -> None:
        capacity = {"cpu": cpu, "mem": mem_gib * GiB, "disk": 100 * GiB}
        if gpu:
            capacity["slots"] = {"gpu": gpu}
        agent = self.agents.get(agent_id)
        if agent is None:
            agent = self.agents[agent_id] = Agent.register(
                agent_id=agent_id, resource_group=group, capacity=capacity, runtime="dummy"
            )
        else:
            agent.reregister(resource_group=group, capacity=capacity, runtime="dummy")
        self.append(f"hoist.events.agent.{agent_id}", agent, f"agent:{agent_id}")

    def lose(self, agent_id: str) -> None:
        if agent_id not in self.agents:
            return
        liveness = AgentLiveness.mark_lost(self.liveness.get(agent_id), agent_id, "gone")
        self.liveness[agent_id] = liveness
        self.append(f"hoist.events.liveness.{agent_id}", liveness, "manager")


registrations = st.tuples(
    st.just("register"),
    st.sampled_from(AGENTS),
    st.sampled_from(GROUPS),
    st.integers(1, 8),
    st.integers(1, 8),
    st.integers(0, 2),
)
losses = st.tuples(st.just("lose"), st.sampled_from(AGENTS))
asks = st.tuples(
    st.just("ask"),
    st.sampled_from(GROUPS),
    st.integers(1, 10),  # cpu
    st.integers(1, 10),  # mem GiB
    st.integers(0, 3),  # gpu
    st.integers(1, 4),  # cluster size
    st.sampled_from(("single-node", "multi-node")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(registrations, losses, asks), max_size=40))
def test_never_holds_of_the_fleet_matches_a_recomputation(steps: list[tuple[Any, ...]]) -> None:
    log = Log()
    for step in steps:
        if step[0] == "register":
            log.register(*step[1:])
        elif step[0] == "lose":
            log.lose(step[1])
        else:
            _, group, cpu, mem, gpu, size, mode = step
            resources = ev.Resources(cpu=cpu, mem=mem * GiB, slots={"gpu": gpu} if gpu else {})
            expected = never_holds(resources, size, mode, group, log.fleet.agent_views())
            assert log.fleet.never_holds(resources, size, mode, group) == expected


places = st.tuples(st.just("place"), st.sampled_from(AGENTS), st.integers(1, 4), st.integers(0, 2))
ends = st.tuples(st.just("end"), st.integers(0, 100))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(registrations, losses, places, ends, st.just(("views",)), st.just(("index",))),
        max_size=50,
    )
)
def test_the_kept_agent_views_match_views_built_afresh(steps: list[tuple[Any, ...]]) -> None:
    """And so does the scheduler's kept index of them, once it was asked for."""
    log = Log()
    fleet = log.fleet
    placed: list[Session] = []
    policy = Policy(strategy="concentrated")
    indexed = False
    for step in steps:
        if step[0] == "register":
            log.register(*step[1:])
        elif step[0] == "lose":
            log.lose(step[1])
        elif step[0] == "place" and step[1] in fleet.agents:
            _, agent_id, cpu, gpu = step
            session = Session.enqueue(
                owner="ann",
                image="img:1",
                resources={"cpu": cpu, "mem": GiB, "slots": {"gpu": gpu} if gpu else {}},
                resource_group="default",
            )
            fleet.reindex(session)
            session.schedule({k: agent_id for k in session.kernels})
            fleet.reindex(session)  # what a commit does once the change is stored
            placed.append(session)
        elif step[0] == "end" and placed:
            session = placed.pop(step[1] % len(placed))
            session.destroy()
            fleet.reindex(session)
        elif step[0] == "views":
            fleet.agent_views()  # builds the kept views; later steps must keep them right
        elif step[0] == "index":
            indexed = True
        fresh = [fleet.view_of(agent_id) for agent_id in fleet.agents]
        if indexed:  # before agent_views, which refreshes it too
            assert index_state(fleet.agent_index(policy)) == index_state(AgentIndex(policy, fresh))
        assert fleet.agent_views() == fresh


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("run", "end")), st.integers(0, 30)), max_size=40))
def test_the_running_order_is_the_running_sessions_sorted(steps: list[tuple[str, int]]) -> None:
    """The lifetime loop walks ``running_order`` instead of sorting every RUNNING session."""
    fleet = Log().fleet
    sessions: dict[int, Session] = {}
    for op, n in steps:
        if op == "run" and n not in sessions:
            session, kernel_id = session_at(S.CREATING)
            fleet.reindex(session)
            session.mark_created(kernel_id, "container-1")
            fleet.reindex(session)
            sessions[n] = session
        elif op == "end" and n in sessions:
            session = sessions.pop(n)
            session.mark_terminating(only_kernel(session), "user-requested")
            fleet.reindex(session)
        expected = sorted((since, sid) for sid, since in fleet.running_since.items())
        assert fleet.running_order == expected
        assert set(fleet.running_since) == {s.id for s in sessions.values()}
