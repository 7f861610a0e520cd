"""A member's steady heartbeats as a latency probe, for the tests that attack a real gunicorn
(connection exhaustion, admin login floods) and check that members stay answered."""
from __future__ import annotations

import statistics
import time

from dataplane.transport import CoordinatorUnavailable, Transport


def probe_heartbeats(transport: Transport, group: str, epoch: int, seconds: float, failures: list[object],
                     at_least: int = 0, deadline_s: float = 120.0) -> list[float]:
    """Steady heartbeats of member "probe" for `seconds`, and on until `at_least` were sent
    (`deadline_s` at most): each one's latency in s. Non-200 answers and unavailability go to
    `failures`."""
    latencies: list[float] = []
    started = time.monotonic()
    end, deadline = started + seconds, started + max(seconds, deadline_s)
    while (time.monotonic() < end or len(latencies) < at_least) and time.monotonic() < deadline:
        t0 = time.perf_counter()
        try:
            status, body = transport.heartbeat(group, {"memberId": "probe", "memberEpoch": epoch})
            if status != 200:
                failures.append(status)
            else:
                epoch = body["memberEpoch"]
        except CoordinatorUnavailable as exc:
            failures.append(repr(exc))
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.02)  # a member's heartbeat interval, compressed
    return latencies


def p50_p99_ms(latencies: list[float]) -> tuple[float, float]:
    return statistics.median(latencies) * 1000, statistics.quantiles(latencies, n=100)[98] * 1000
