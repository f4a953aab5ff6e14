"""An agent's Prometheus metrics (``/metrics`` with ``--metrics-port``), named after kubelet's
with a ``hoist_`` prefix:

- ``hoist_image_pull_duration_seconds{outcome, size}``: from the request to the outcome, time
  in the queue for a pull slot included, as kubelet's ``image_pull_duration_seconds``; outcome
  ``pulled``, ``failed`` or ``cancelled``; ``size`` a bucket of the image's bytes
  (transport.metrics.size_bucket).
- ``hoist_image_pulled_bytes_total``: bytes of the images pulled to the end.
- ``hoist_image_pulls_in_flight``: pulls queued or running (read at scrape time).
- ``hoist_image_pull_stalls_total`` / ``hoist_image_pull_timeouts_total``: pulls given up for
  no progress within the stall timeout / not done within the pull timeout.
- ``hoist_image_garbage_collected_total{reason}``: images removed by image GC (``space``: the
  disk above its high watermark, kubelet's reason) or by an admin's unload (``unload``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram

from transport.metrics import DURATION_BUCKETS, PREFIX, Gauges, size_bucket


class AgentMetrics:
    def __init__(self, in_flight: Callable[[], int]) -> None:
        self.registry = registry = CollectorRegistry()
        self.pull_duration = Histogram(
            f"{PREFIX}image_pull_duration_seconds",
            "Image pulls from request to outcome, time queued for a pull slot included",
            ["outcome", "size"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.pulled_bytes = Counter(
            f"{PREFIX}image_pulled_bytes", "Bytes of images pulled to the end", registry=registry
        )
        self.stalls = Counter(
            f"{PREFIX}image_pull_stalls",
            "Pulls given up: no progress within the stall timeout",
            registry=registry,
        )
        self.timeouts = Counter(
            f"{PREFIX}image_pull_timeouts",
            "Pulls given up: not done within the pull timeout",
            registry=registry,
        )
        self.gc_removals = Counter(
            f"{PREFIX}image_garbage_collected",
            "Images removed, by reason (space: image GC over its high watermark; unload)",
            ["reason"],
            registry=registry,
        )
        for reason in ("space", "unload"):
            self.gc_removals.labels(reason)  # scraped as 0 before the first removal
        registry.register(
            Gauges(
                [
                    (
                        f"{PREFIX}image_pulls_in_flight",
                        "Image pulls queued or running",
                        "gauge",
                        in_flight,
                    )
                ]
            )
        )

    def pull_ended(self, requested_at: float, outcome: str, size: int, reason: str = "") -> None:
        """One pull's outcome; ``requested_at``: its task's creation (time.monotonic)."""
        bucket = size_bucket(size)
        self.pull_duration.labels(outcome, bucket).observe(time.monotonic() - requested_at)
        if outcome == "pulled":
            self.pulled_bytes.inc(size)
        elif reason.startswith("stalled"):
            self.stalls.inc()
        elif reason.startswith("timeout"):
            self.timeouts.inc()
