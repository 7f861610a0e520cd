"""Prometheus metrics: GET /metrics.

Two kinds, so every gunicorn worker answers a scrape with the same numbers:

* Per-request counters and histograms (heartbeats by errorCode/status, heartbeat latency)
  live in each process. With several workers, prometheus_client's multiprocess mode
  (PROMETHEUS_MULTIPROC_DIR, set up by coordinator_project/gunicorn_conf.py) writes them to
  per-process files that the scrape sums.
* State (members and shards by state per group, pending shards, epochs, resharding state,
  sweep lag) is read from the database at scrape time by `StateCollector`, a handful of
  aggregate queries (the apps' selectors), so there are no process-local gauges to go stale
  or disagree.
* Backlog (lag, pending, DLQ length per group and shard, §10) comes from `groups.shardstats`
  at scrape time: its per-process cache (≤ 2 s) makes a scrape cost Redis at most one round
  trip per node and group per period. Where Redis cannot be read the series are left out
  and `rsc_shard_stats_up{group}` is 0, so an alert can tell "no lag" from "unknown".
"""
from __future__ import annotations

import atexit
import bisect
import collections
import hmac
import logging
import os
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from assignments import selectors as assignment_selectors
from coordination.liveness import LATE_AFTER_INTERVALS, Liveness
from coordination.model import MemberStatus, ShardState
from coordinator_project.compat.prometheus_client import add_observations
from coordinator_project.logging import LogThrottle
from coordinator_project.process_state import PROCESS
from dataplane.protocol import ErrorCode
from groups import selectors as group_selectors
from groups import shardstats
from groups.models import Group, StreamState, VersionState
from groups.namespace import observe_generation
from members import selectors as member_selectors

log = logging.getLogger("coordinator.heartbeat")

HEARTBEATS = Counter(
    "rsc_heartbeats",
    "Heartbeat requests answered, by errorCode, status (empty on errors) and path: fast (no"
    " group lock, assignments.fastpath), locked (the core under the group lock), or empty"
    " (refused before the service: authentication, validation).",
    ["error_code", "status", "path"],
)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
HEARTBEAT_LATENCY = Histogram(
    "rsc_heartbeat_latency_seconds",
    "Time to answer a heartbeat in the view (authentication, validation, core, database).",
    buckets=_LATENCY_BUCKETS,
)

# Seconds within which a process's heartbeats reach the shared counters (see _HeartbeatTally).
FOLD_PERIOD_S = 0.1


class _HeartbeatTally:
    """This process's heartbeat counts and latencies not yet in HEARTBEATS and
    HEARTBEAT_LATENCY.

    In multiprocess mode every inc() and observe() writes a memory-mapped file under a lock
    (under gevent, a cooperative one): one counter and one histogram per heartbeat were ~3 %
    of a steady heartbeat's CPU (py-spy). Heartbeats add to plain tallies here; a timer
    folds them in within FOLD_PERIOD_S (one inc per label set and bucket), a scrape answered
    by this process folds first, and so does the process's exit. A scrape answered by
    another worker sees this one's heartbeats at most FOLD_PERIOD_S late.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._reset()

    def _reset(self) -> None:
        self._counts: dict[tuple[str, str, str], int] = {}
        self._buckets = [0] * (len(_LATENCY_BUCKETS) + 1)  # the last: +Inf
        self._sum = 0.0
        self._armed = False

    def add(self, labels: tuple[str, str, str], seconds: float) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use in this (forked) process
                self._pid = os.getpid()
                self._reset()
                atexit.register(self.fold)
            self._counts[labels] = self._counts.get(labels, 0) + 1
            self._buckets[bisect.bisect_left(_LATENCY_BUCKETS, seconds)] += 1  # Histogram.observe's bucket
            self._sum += seconds
            if not self._armed:
                self._armed = True
                timer = threading.Timer(FOLD_PERIOD_S, self.fold)
                timer.daemon = True
                timer.start()

    def fold(self) -> None:
        with self._lock:
            counts, buckets, total = self._counts, self._buckets, self._sum
            self._reset()
        for labels, n in counts.items():
            HEARTBEATS.labels(*labels).inc(n)
        if any(buckets):
            # As observe() one by one would have added them (test_metrics checks the series).
            add_observations(HEARTBEAT_LATENCY, total, buckets)


_TALLY: _HeartbeatTally = PROCESS.own(
    "heartbeat tally", _HeartbeatTally(),
    "Heartbeat counts and latencies not yet in the metrics. key: (group, code, path) -> count,"
    " plus latency buckets; bound: one entry per label set, folded every FOLD_PERIOD_S;"
    " invalidated: folded (a scrape here folds first; exit folds); N hosts: each process"
    " reports its own, summed by the scraper.",
    reset=lambda: _TALLY.fold(), close=lambda: _TALLY.fold(),
)


def fold_heartbeat_tally() -> None:
    """Write this process's pending heartbeat counts to the metrics now (scrapes, tests)."""
    _TALLY.fold()

# Refusals an unauthenticated or misbehaving client can repeat at will: one line per 10 s each.
_THROTTLED_CODES = frozenset({ErrorCode.AUTHENTICATION_FAILED, ErrorCode.RATE_LIMITED})
REFUSAL_LOG_THROTTLE = PROCESS.own(
    "heartbeat refusal log throttle", LogThrottle(every=10.0),
    "One warning line per refusal kind per 10 s."
    " key: a refusal's kind -> when its last line was logged, lines held since; bound: 1,000 kinds, then emptied; invalidated: every 10 s per kind; N hosts: per process by design (each logs its own lines).",
)


def record_heartbeat(group: str, data: Any, body: Any, seconds: float, path: str = "") -> None:
    """Count one answered heartbeat; log it when refused. Cheap: no I/O besides the log line."""
    body = body if isinstance(body, dict) else {}
    code = str(body.get("errorCode") or ErrorCode.NONE)
    _TALLY.add((code, str(body.get("status") or ""), path), seconds)
    if code != ErrorCode.NONE:
        held: int | None = 0
        if code in _THROTTLED_CODES:  # a flood of bad keys or joins must not flood the log
            held = REFUSAL_LOG_THROTTLE.allow(code)
            if held is None:
                return
        req = data if isinstance(data, dict) else {}
        member = body.get("memberId") or req.get("memberId")
        log.warning(
            "heartbeat rejected %s group=%s member=%s memberEpoch=%s: %s%s",
            code, group, member, req.get("memberEpoch"), body.get("errorMessage"),
            f" ({held} more not logged in the last {REFUSAL_LOG_THROTTLE.every:g} s)" if held else "",
            extra={
                "event": "heartbeat_rejected", "group": group, "memberId": member,
                "memberEpoch": req.get("memberEpoch"), "errorCode": code,
            },
        )


# --- state read at scrape time --------------------------------------------------------------
_SHARD_STATES = tuple(s.value for s in ShardState)


class StateCollector(Collector):
    """Per-group and per-stream state, read from the database on every scrape."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        observe_generation()  # after a restore, no cached shard set or figure of the old history
        now = timezone.now()
        groups = group_selectors.groups_with_streams()

        members = GaugeMetricFamily("rsc_group_members", "Members of a group by state.", labels=["group", "state"])
        counts = member_selectors.status_counts()
        for g in groups:
            for status in MemberStatus:
                members.add_metric([g.name, status.value], counts.get((g.name, status.value), 0))
        yield members

        per_group = assignment_selectors.shard_counts_by_group()
        shards = GaugeMetricFamily(
            "rsc_group_shards", "Live shards of a group by state (granted, revoking, unowned, drained).",
            labels=["group", "state"],
        )
        pending = GaugeMetricFamily(
            "rsc_group_pending_shards", "Shards in some member's target not yet granted to it.", labels=["group"]
        )
        for g in groups:
            row = per_group.get(g.name, {})
            for shard_state in _SHARD_STATES:
                shards.add_metric([g.name, shard_state], row.get(f"n_{shard_state}", 0))
            pending.add_metric([g.name], row.get("n_pending", 0))
        yield shards
        yield pending

        for name, attr, help_text in (
            ("rsc_group_epoch", "group_epoch", "groupEpoch of a group."),
            ("rsc_group_assignment_epoch", "assignment_epoch", "assignmentEpoch of a group."),
            ("rsc_group_metadata_epoch", "metadata_epoch", "metadataEpoch of a group."),
        ):
            fam = GaugeMetricFamily(name, help_text, labels=["group"])
            for g in groups:
                fam.add_metric([g.name], getattr(g, attr))
            yield fam

        streams = group_selectors.streams()
        resharding = GaugeMetricFamily(
            "rsc_stream_resharding_state", "1 for the stream's current resharding state.", labels=["stream", "state"]
        )
        write_version = GaugeMetricFamily("rsc_stream_write_version", "Write version of a stream.", labels=["stream"])
        for stream in streams:
            for state in StreamState:
                resharding.add_metric([stream.name, state.value], 1 if stream.state == state else 0)
            write_version.add_metric([stream.name], stream.write_version)
        yield resharding
        yield write_version

        versions = GaugeMetricFamily(
            "rsc_stream_versions", "Shard versions of a stream by state.", labels=["stream", "state"]
        )
        vcounts = group_selectors.version_counts()
        for stream in streams:
            for version_state in VersionState:
                versions.add_metric([stream.name, version_state.value], vcounts.get((stream.name, version_state.value), 0))
        yield versions

        undrained = GaugeMetricFamily(
            "rsc_group_undrained_sealed_shards",
            "Shards of sealed versions a group has not drained yet (resharding progress).", labels=["group"],
        )
        sealed_left = assignment_selectors.undrained_sealed_by_group()
        for g in groups:
            undrained.add_metric([g.name], sealed_left.get(g.name, 0))
        yield undrained

        yield from _liveness_families(groups, now)
        yield from _backlog_families(groups)

        lag = GaugeMetricFamily(
            "rsc_sweep_lag_seconds", "Seconds since each periodic sweep last finished.", labels=["sweep"]
        )
        for run in group_selectors.sweep_runs():
            if run.last_finished_at is not None:
                lag.add_metric([run.name], max(0.0, (now - run.last_finished_at).total_seconds()))
        yield lag


def _liveness_families(groups: list[Group], now: datetime) -> Iterator[GaugeMetricFamily]:
    """Live members by liveness (alive / late / expired / unknown), the admin's classifier."""
    fam = GaugeMetricFamily(
        "rsc_group_members_liveness",
        f"Live members by liveness: late = silent > {LATE_AFTER_INTERVALS} heartbeat intervals,"
        " expired = beyond the session timeout.",
        labels=["group", "liveness"],
    )
    counts = member_selectors.liveness_by_group(now)
    for g in groups:
        mine: collections.Counter[Liveness] = counts.get(g.pk, collections.Counter())
        for state in Liveness:
            fam.add_metric([g.name, state.value], mine.get(state, 0))
    yield fam


def _backlog_families(groups: list[Group]) -> Iterator[GaugeMetricFamily]:
    """Lag, pending and DLQ length per group and shard (§10), from the cached shard statistics."""
    labels = ["group", "stream"]
    up = GaugeMetricFamily("rsc_shard_stats_up", "1 when the group's shard statistics could be read from Redis.",
                           labels=["group"])
    group_lag = GaugeMetricFamily("rsc_group_lag", "Entries not yet delivered to the group, all live shards.", labels=labels)
    group_pending = GaugeMetricFamily("rsc_group_pending", "Entries delivered to the group and not ACKed.", labels=labels)
    dlq = GaugeMetricFamily("rsc_dlq_length", "Entries in the group's dead-letter streams, all live shards.", labels=labels)
    shard_lag = GaugeMetricFamily("rsc_shard_lag", "Entries of a shard not yet delivered to the group.",
                                  labels=[*labels, "shard"])
    shard_pending = GaugeMetricFamily("rsc_shard_pending", "Entries of a shard delivered to the group, not ACKed.",
                                      labels=[*labels, "shard"])
    series_omitted = GaugeMetricFamily(
        "rsc_shard_series_omitted",
        "1 when the group's per-shard series are left out: more live shards than METRICS_SHARD_SERIES_MAX_SHARDS.",
        labels=["group"])
    most = int(getattr(settings, "METRICS_SHARD_SERIES_MAX_SHARDS", 4096))
    shard_ids: dict[int, tuple[str, ...]] = {}
    for g in groups:
        ids = shard_ids.get(g.stream_id)
        if ids is None:
            ids = shard_ids[g.stream_id] = group_selectors.live_shard_ids(g.stream_id, g.stream.metadata_epoch)
        stats = shardstats.shard_stats(g.name, g.stream.key_prefix, ids)
        up.add_metric([g.name], 1 if stats.ok else 0)
        if not stats.ok:
            continue
        stream = g.stream.name
        group_lag.add_metric([g.name, stream], stats.lag or 0)
        group_pending.add_metric([g.name, stream], stats.pending or 0)
        dlq.add_metric([g.name, stream], stats.dlq or 0)
        omitted = 0 < most < len(ids)
        series_omitted.add_metric([g.name], 1 if omitted else 0)
        for sid in () if omitted else ids:
            fig = stats.shard(sid)
            if fig.lag is not None:
                shard_lag.add_metric([g.name, stream, sid], fig.lag)
            if fig.pending is not None:
                shard_pending.add_metric([g.name, stream, sid], fig.pending)
    yield from (up, group_lag, group_pending, dlq, shard_lag, shard_pending, series_omitted)


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_ProcessLocal())
    registry.register(StateCollector())
    return registry


class _ProcessLocal(Collector):
    """Single-process mode (runserver, tests): this process's counters from the default registry."""

    def collect(self) -> Iterator[Any]:
        yield from REGISTRY.collect()


def metrics_view(request: HttpRequest) -> HttpResponse:
    token = getattr(settings, "METRICS_TOKEN", "")
    if token:  # optional: scrapers send Authorization: Bearer <METRICS_TOKEN>
        sent = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        # Compared as bytes: compare_digest refuses a str with non-ASCII characters (a 500).
        if not hmac.compare_digest(sent.encode("utf-8", "surrogateescape"), token.encode()):
            return HttpResponse("metrics token required\n", status=401, content_type="text/plain")
    fold_heartbeat_tally()  # this process's latest heartbeats; other workers' within FOLD_PERIOD_S
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)
