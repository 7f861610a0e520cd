"""Prometheus metrics: GET /metrics.

Two kinds, so every gunicorn worker answers a scrape with the same numbers:

* Per-request counters and histograms (heartbeats by errorCode/status, heartbeat latency)
  live in each process. With several workers, prometheus_client's multiprocess mode
  (PROMETHEUS_MULTIPROC_DIR, set up by coordinator_project/gunicorn.conf.py) writes them to
  per-process files that the scrape sums.
* State (members and shards by state per group, pending shards, epochs, resharding state,
  sweep lag) is read from the database at scrape time by `StateCollector`, a handful of
  aggregate queries, so there are no process-local gauges to go stale or disagree.
* Backlog (lag, pending, DLQ length per group and shard, §10) comes from `groups.shardstats`
  at scrape time: its per-process cache (≤ 2 s) makes a scrape cost Redis at most one round
  trip per node and group per period. Where Redis cannot be read the series are left out
  and `rsc_shard_stats_up{group}` is 0, so an alert can tell "no lag" from "unknown".
"""
from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Q
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

from coordination.liveness import Liveness, liveness
from coordination.model import LIVE_STATUSES, MemberStatus, ShardState
from dataplane.protocol import ErrorCode
from groups.ratelimit import LogThrottle

log = logging.getLogger("coordinator.heartbeat")

HEARTBEATS = Counter(
    "rsc_heartbeats",
    "Heartbeat requests answered, by errorCode, status (empty on errors) and path: fast (no"
    " group lock, assignments.fastpath), locked (the core under the group lock), or empty"
    " (refused before the service: authentication, validation).",
    ["error_code", "status", "path"],
)
HEARTBEAT_LATENCY = Histogram(
    "rsc_heartbeat_latency_seconds",
    "Time to answer a heartbeat in the view (authentication, validation, core, database).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)


# Refusals an unauthenticated or misbehaving client can repeat at will: one line per 10 s each.
_THROTTLED_CODES = frozenset({ErrorCode.AUTHENTICATION_FAILED, ErrorCode.RATE_LIMITED})
REFUSAL_LOG_THROTTLE = LogThrottle(every=10.0)


def record_heartbeat(group: str, data: Any, body: Any, seconds: float, path: str = "") -> None:
    """Count one answered heartbeat; log it when refused. Cheap: no I/O besides the log line."""
    body = body if isinstance(body, dict) else {}
    code = str(body.get("errorCode") or ErrorCode.NONE)
    HEARTBEATS.labels(code, str(body.get("status") or ""), path).inc()
    HEARTBEAT_LATENCY.observe(seconds)
    if code != ErrorCode.NONE:
        held = 0
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
        # Imported here: the collector is built per scrape, after Django is set up.
        from assignments.models import ShardAssignment
        from groups.models import Group, ShardVersion, Stream, StreamState, SweepRun, VersionState
        from members.models import Member

        now = timezone.now()
        groups = list(Group.objects.select_related("stream").order_by("name"))

        members = GaugeMetricFamily("rsc_group_members", "Members of a group by state.", labels=["group", "state"])
        counts = {
            (r["group__name"], r["status"]): r["n"]
            for r in Member.objects.values("group__name", "status").annotate(n=Count("id"))
        }
        for g in groups:
            for s in MemberStatus:
                members.add_metric([g.name, s.value], counts.get((g.name, s.value), 0))
        yield members

        live = ShardAssignment.objects.exclude(shard__version__state=VersionState.RETIRED)
        per_group = {
            r["group__name"]: r
            for r in live.values("group__name").annotate(
                n_drained=Count("id", filter=Q(drained_at__isnull=False)),
                n_revoking=Count("id", filter=Q(drained_at__isnull=True, revoking=True)),
                n_granted=Count("id", filter=Q(drained_at__isnull=True, revoking=False, owner__isnull=False)),
                n_unowned=Count("id", filter=Q(drained_at__isnull=True, owner__isnull=True)),
                # (n_ names: an annotation named like a field would shadow it in FILTER.)
                # Pending as the core answers it: in a member's target, not granted to it.
                n_pending=Count("id", filter=Q(target__isnull=False) & (
                    Q(owner__isnull=True) | ~Q(owner=F("target")) | Q(revoking=True)
                )),
            )
        }
        shards = GaugeMetricFamily(
            "rsc_group_shards", "Live shards of a group by state (granted, revoking, unowned, drained).",
            labels=["group", "state"],
        )
        pending = GaugeMetricFamily(
            "rsc_group_pending_shards", "Shards in some member's target not yet granted to it.", labels=["group"]
        )
        for g in groups:
            row = per_group.get(g.name, {})
            for s in _SHARD_STATES:
                shards.add_metric([g.name, s], row.get(f"n_{s}", 0))
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

        streams = list(Stream.objects.order_by("name"))
        resharding = GaugeMetricFamily(
            "rsc_stream_resharding_state", "1 for the stream's current resharding state.", labels=["stream", "state"]
        )
        write_version = GaugeMetricFamily("rsc_stream_write_version", "Write version of a stream.", labels=["stream"])
        for s in streams:
            for state in StreamState:
                resharding.add_metric([s.name, state.value], 1 if s.state == state else 0)
            write_version.add_metric([s.name], s.write_version)
        yield resharding
        yield write_version

        versions = GaugeMetricFamily(
            "rsc_stream_versions", "Shard versions of a stream by state.", labels=["stream", "state"]
        )
        vcounts = {
            (r["stream__name"], r["state"]): r["n"]
            for r in ShardVersion.objects.values("stream__name", "state").annotate(n=Count("id"))
        }
        for s in streams:
            for state in VersionState:
                versions.add_metric([s.name, state.value], vcounts.get((s.name, state.value), 0))
        yield versions

        undrained = GaugeMetricFamily(
            "rsc_group_undrained_sealed_shards",
            "Shards of sealed versions a group has not drained yet (resharding progress).", labels=["group"],
        )
        sealed_left = dict(
            ShardAssignment.objects.filter(shard__version__state=VersionState.SEALED, drained_at__isnull=True)
            .values("group__name").annotate(n=Count("id")).values_list("group__name", "n")
        )
        for g in groups:
            undrained.add_metric([g.name], sealed_left.get(g.name, 0))
        yield undrained

        yield from _liveness_families(groups, now)
        yield from _backlog_families(groups)

        lag = GaugeMetricFamily(
            "rsc_sweep_lag_seconds", "Seconds since each periodic sweep last finished.", labels=["sweep"]
        )
        for run in SweepRun.objects.order_by("name"):
            if run.last_finished_at is not None:
                lag.add_metric([run.name], max(0.0, (now - run.last_finished_at).total_seconds()))
        yield lag


def _liveness_families(groups: list[Any], now: datetime) -> Iterator[GaugeMetricFamily]:
    """Live members by liveness (alive / late / expired / unknown), the admin's classifier."""
    from members.models import Member

    fam = GaugeMetricFamily(
        "rsc_group_members_liveness",
        "Live members by liveness: late = silent > 2 heartbeat intervals, expired = beyond the session timeout.",
        labels=["group", "liveness"],
    )
    by_pk = {g.pk: g for g in groups}
    counts: dict[tuple[int, Liveness], int] = {}
    rows = Member.objects.filter(status__in=[s.value for s in LIVE_STATUSES]).values_list("group_id", "last_heartbeat_at")
    for group_id, last in rows:
        g = by_pk.get(group_id)
        if g is not None:
            _, alive = liveness(last, now, g.heartbeat_interval_ms, g.session_timeout_ms)
            counts[(group_id, alive)] = counts.get((group_id, alive), 0) + 1
    for g in groups:
        for state in Liveness:
            fam.add_metric([g.name, state.value], counts.get((g.pk, state), 0))
    yield fam


def _backlog_families(groups: list[Any]) -> Iterator[GaugeMetricFamily]:
    """Lag, pending and DLQ length per group and shard (§10), from the cached shard statistics."""
    from groups import shardstats

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
    shard_ids: dict[int, list[str]] = {}
    for g in groups:
        ids = shard_ids.get(g.stream_id)
        if ids is None:
            ids = shard_ids[g.stream_id] = shardstats.live_shard_ids(g.stream_id)
        stats = shardstats.shard_stats(g.name, g.stream.key_prefix, ids)
        up.add_metric([g.name], 1 if stats.ok else 0)
        if not stats.ok:
            continue
        stream = g.stream.name
        group_lag.add_metric([g.name, stream], stats.lag or 0)
        group_pending.add_metric([g.name, stream], stats.pending or 0)
        dlq.add_metric([g.name, stream], stats.dlq or 0)
        for sid in ids:
            fig = stats.shard(sid)
            if fig.lag is not None:
                shard_lag.add_metric([g.name, stream, sid], fig.lag)
            if fig.pending is not None:
                shard_pending.add_metric([g.name, stream, sid], fig.pending)
    yield from (up, group_lag, group_pending, dlq, shard_lag, shard_pending)


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
        if not hmac.compare_digest(sent, token):
            return HttpResponse("metrics token required\n", status=401, content_type="text/plain")
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)
