"""/metrics of a real `hoist up` stack's manager and agents, scraped after a run (pulls that
succeed and one that fails, sessions that start, one destroyed, an image unloaded), checked
against the event log: every count a metric gives, the log gives too."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter, defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from domain.subjects import SESSION_CREATE, SESSION_DESTROY
from tests.web.conftest import Web, ask
from transport.client import Client

CPU_MEM = {"cpu": 1, "mem": 256 * 1024**2}


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, labels) -> value."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **want: str
) -> float:
    return sum(
        v
        for (n, labels), v in samples.items()
        if n == name and all(dict(labels).get(k) == w for k, w in want.items())
    )


def log_events(web: Web) -> list[dict[str, Any]]:
    out = web.stack.hoist("events", "-o", "json")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


async def test_scraped_counts_match_the_log(web: Web, client: Client) -> None:
    images = [web.stack.next_image() for _ in range(3)]
    started = []
    for i, image in enumerate(images):
        reply = await ask(
            client,
            SESSION_CREATE,
            {"owner": "mo", "image": image, "resources": CPU_MEM, "cluster_size": 1 + (i == 0),
             "max_wait": 60},
        )  # fmt: skip
        assert reply["status"] == "RUNNING", reply
        started.append(reply["session_id"])
    failed = await ask(
        client,
        SESSION_CREATE,
        {"owner": "mo", "image": "test/nowhere:1", "resources": CPU_MEM, "max_wait": 30},
    )
    assert failed["status"] in ("CANCELLED", "ERROR"), failed  # the dummy registry lacks it
    await ask(client, SESSION_DESTROY, {"session_id": started[-1]})
    # An image preloaded (a pull no kernel asked for), then unloaded: one removal, "unload".
    spare = web.stack.next_image()
    preloaded = web.stack.hoist("image", "preload", spare, "--agent", "agent-1", env=_admin(web))
    assert preloaded.returncode == 0, preloaded.stdout + preloaded.stderr
    unloaded = web.stack.hoist("image", "unload", spare, "--agent", "agent-1", env=_admin(web))
    assert unloaded.returncode == 0, unloaded.stderr
    assert "removed" in unloaded.stdout, unloaded.stdout

    agents = [a for a in web.info["metrics"] if a != "manager"]
    deadline = time.monotonic() + 20
    while True:  # the destroy and the unload settle; the read models catch up
        manager = scrape(web.metrics_url("manager"))
        per_agent = {a: scrape(web.metrics_url(a)) for a in agents}
        events = log_events(web)
        sessions = _sessions(web)
        settled = (
            total(manager, "hoist_projection_lag_events") == 0
            and all(s["status"] != "TERMINATING" for s in sessions)
            and any(e["type"] == "ImageRemoved" for e in events)
        )
        if settled or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.3)

    kinds = Counter(e["type"] for e in events)
    # Agents: pulls by outcome, bytes, in flight, removals; each agent against its own events.
    for agent, samples in per_agent.items():
        mine = [e for e in events if e["aggregate"] == "agent" and e["id"] == agent]
        pulled = [e for e in mine if e["type"] == "ImagePulled"]
        failures = [
            e for e in mine if e["type"] == "ImagePullFailed" and not e["data"].get("cancelled")
        ]
        duration = "hoist_image_pull_duration_seconds_count"
        assert total(samples, duration, outcome="pulled") == len(pulled), agent
        assert total(samples, duration, outcome="failed") == len(failures), agent
        assert total(samples, "hoist_image_pulled_bytes_total") == sum(
            e["data"]["size_bytes"] for e in pulled
        )
        assert total(samples, "hoist_image_pulls_in_flight") == 0
        removed = [e for e in mine if e["type"] == "ImageRemoved"]
        assert total(samples, "hoist_image_garbage_collected_total", reason="unload") == len(
            removed
        )
        assert total(samples, "hoist_image_pull_stalls_total") == 0
        assert total(samples, "hoist_image_pull_timeouts_total") == 0
    assert (
        sum(total(s, "hoist_image_pull_duration_seconds_count") for s in per_agent.values())
        == kinds["ImagePulled"] + kinds["ImagePullFailed"]
    )
    assert kinds["ImagePulled"] >= 4 and kinds["ImageRemoved"] >= 1  # the run did happen

    # Manager: one start observed per session whose every kernel ran (from the log).
    created: defaultdict[str, set[str]] = defaultdict(set)
    size: dict[str, int] = {}
    for e in events:
        if e["type"] == "SessionEnqueued":
            size[e["id"]] = len(e["data"]["kernel_ids"])
        elif e["type"] == "KernelCreated":
            created[e["id"]].add(e["data"]["kernel_id"])
    ran = sum(1 for sid, n in size.items() if len(created[sid]) == n)
    assert ran == len(started)
    for name in ("total", "sli"):
        count = f"hoist_session_start_{name}_duration_seconds_count"
        assert total(manager, count) == ran
    # Every session pulled its image: the SLI (pulls excluded) is below the total.
    assert (
        0
        < total(manager, "hoist_session_start_sli_duration_seconds_sum")
        < total(manager, "hoist_session_start_total_duration_seconds_sum")
    )
    by_status = Counter(s["status"] for s in sessions)
    for (name, labels), value in manager.items():
        if name == "hoist_sessions":
            assert value == by_status.get(dict(labels)["status"], 0), (labels, by_status)
    assert sum(by_status.values()) == len(size)
    assert total(manager, "hoist_scheduler_pass_duration_seconds_count") >= len(size)
    assert total(manager, "hoist_quarantined_events_total") == 0
    assert total(manager, "hoist_event_append_conflicts_total") == 0


def _admin(web: Web) -> dict[str, str]:
    return {"HOIST_NATS_URL": web.stack.creds("admin")}


def _sessions(web: Web) -> list[dict[str, Any]]:
    out = web.stack.hoist("sessions", "-o", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    return rows if isinstance(rows, list) else rows["rows"]


def test_metrics_serve_only_metrics_on_localhost(web: Web) -> None:
    for process, url in web.info["metrics"].items():
        assert url.startswith("http://127.0.0.1:"), process
        try:
            urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=5)
        except urllib.error.HTTPError as e:
            assert e.code == 404
        else:
            raise AssertionError("only /metrics is served")
