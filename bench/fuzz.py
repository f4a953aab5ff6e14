"""Fuzz the door: 10,000 generated bad and odd requests over every documented command, query and
admin subject of a real `hoist up` stack (nats-server with the roles, the manager, two dummy
agents) as the client and admin roles, one at a time.

Prints replies/s, errors by code, events appended (must be 0) and the worst reply time; exits 1
if any reply was ``internal``, missing, not an error, or an event was appended.  The payloads and
checks are tests/hardening/fuzzing.py's, which tests/hardening/test_fuzz.py runs in CI with
fewer examples.

    python bench/fuzz.py [--examples 10000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.hardening.fuzzing import FuzzStack, bad_requests, check_bad


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=10_000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="hoist-fuzz-") as tmp:
        with FuzzStack(Path(tmp) / "hoist") as fuzz:
            before = fuzz.events()
            # The stream is checked once around the whole run: per request it would halve the
            # rate measured; tests/hardening/test_fuzz.py checks it around every request.
            run = settings(
                max_examples=args.examples,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )(given(request=bad_requests())(check_bad(fuzz, check_stream=False)))
            failure = None
            try:
                run()
            except Exception as e:  # report the figures, then the failure
                failure = e
            appended = fuzz.events() - before
    s = fuzz.stats
    print(f"requests: {s.replies} replies to {args.examples} generated bad requests")
    print(f"replies/s: {s.replies / s.elapsed_s:.0f} (one at a time, time in requests only)")
    print("errors by code: " + ", ".join(f"{c} {n}" for c, n in s.codes.most_common()))
    print(f"events appended: {appended} (must be 0)")
    print(f"worst reply: {s.worst_s * 1000:.1f} ms ({s.worst})")
    if failure is not None:
        print(f"FAILED: {failure}")
    return 1 if failure is not None or appended or "internal" in s.codes else 0


if __name__ == "__main__":
    sys.exit(main())
