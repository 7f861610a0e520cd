"""Per-process limits: token buckets for joins and leaves, and a throttle for repetitive warning lines.

Both are per web worker (no shared state, no extra round trip); with W workers the
effective join limit is up to W times the configured one. Both are bounded in size.
"""
from __future__ import annotations

import math
import time
from collections.abc import Hashable

from django.conf import settings

from coordinator_project.process_state import PROCESS


class TokenBuckets:
    """One token bucket per key: `rate` tokens a second, at most `burst` saved up."""

    def __init__(self, max_keys: int = 10_000) -> None:
        self._buckets: dict[Hashable, tuple[float, float]] = {}  # key -> (tokens, at)
        self._max_keys = max_keys

    def take(self, key: Hashable, rate: float, burst: int, now: float | None = None) -> float:
        """Take one token: 0.0 if there was one, else the seconds until there will be."""
        if rate <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.get(key, (float(max(burst, 1)), now))
        tokens = min(float(max(burst, 1)), tokens + (now - at) * rate)
        if key not in self._buckets and len(self._buckets) >= self._max_keys:
            self._buckets.pop(next(iter(self._buckets)))  # the oldest key: bounded memory
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / rate

    def give_back(self, key: Hashable, burst: int) -> None:
        """Return a token taken for something that turned out not to count."""
        hit = self._buckets.get(key)
        if hit is not None:
            self._buckets[key] = (min(float(max(burst, 1)), hit[0] + 1.0), hit[1])

    def clear(self) -> None:
        self._buckets.clear()


_joins = PROCESS.own(
    "join and leave rate limits", TokenBuckets(),
    "key: ('JOIN' or 'LEAVE', 'key', API key id) or (.., 'ip', client address) -> (tokens, at);"
    " bound: 10,000 keys, oldest out; invalidated: refills with time; N hosts: per web worker by"
    " design (JOIN_RATE_* and LEAVE_RATE_* are per worker, documented).",
)


def join_retry_after(key_id: int, client_ip: str, now: float | None = None) -> int:
    """Seconds a join (memberEpoch 0) must wait under JOIN_RATE_PER_KEY / JOIN_RATE_PER_IP; 0: go."""
    return _retry_after("JOIN", key_id, client_ip, now)


def leave_retry_after(key_id: int, client_ip: str, now: float | None = None) -> int:
    """Seconds a leave (memberEpoch -1 or -2) must wait under LEAVE_RATE_PER_KEY /
    LEAVE_RATE_PER_IP; 0: go. Join/leave churn from one key is bounded both ways."""
    return _retry_after("LEAVE", key_id, client_ip, now)


def _retry_after(kind: str, key_id: int, client_ip: str, now: float | None) -> int:
    wait = _joins.take((kind, "key", key_id), float(getattr(settings, f"{kind}_RATE_PER_KEY", 50)),
                       int(getattr(settings, f"{kind}_BURST_PER_KEY", 1000)), now)
    if not wait and client_ip:
        wait = _joins.take((kind, "ip", client_ip), float(getattr(settings, f"{kind}_RATE_PER_IP", 0)),
                           int(getattr(settings, f"{kind}_BURST_PER_IP", 100)), now)
    return max(1, math.ceil(wait)) if wait else 0


# Issue 27.10: a key that no cache knows costs a database query; random unknown keys from one
# address (231 requests/s raised the heartbeat p99 to 873 ms) are bounded per address.
_auth_failures = PROCESS.own(
    "failed authentication limits", TokenBuckets(),
    "key: client address -> (tokens, at), one token per failed key lookup; bound: 10,000"
    " addresses, oldest out; invalidated: refills with time; N hosts: per web worker by design"
    " (AUTH_FAILURE_RATE_PER_IP is per worker, documented).",
)


def auth_lookup_retry_after(client_ip: str, now: float | None = None) -> int:
    """Seconds before this address may have another key looked up in the database; 0: go, and
    a token is taken for the lookup at once (concurrent lookups of one address cannot all pass
    on one token); note_auth_success gives it back when the key was found."""
    wait = _auth_failures.take(client_ip, float(settings.AUTH_FAILURE_RATE_PER_IP),
                               int(settings.AUTH_FAILURE_BURST_PER_IP), now)
    return max(1, math.ceil(wait)) if wait else 0


def note_auth_success(client_ip: str) -> None:
    """The key looked up was valid: its lookup does not count against the address."""
    _auth_failures.give_back(client_ip, int(settings.AUTH_FAILURE_BURST_PER_IP))
