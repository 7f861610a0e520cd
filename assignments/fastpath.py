"""Steady-state heartbeats without the group lock (PostgreSQL only).

A heartbeat of a STABLE member at the current assignment and metadata epochs, reporting no
revocations or drains and claiming only shards it is granted, changes nothing but liveness:
the core answers OK with its granted shards (R3, R4, R6 with nothing to do), or PAUSED while
the group is paused (§11; a pause is a locked write, so it raises state_version like any other
and every process's next steady answer sees it). Two ways to
answer it, both exact, both falling back to the locked path whenever a condition fails:

1. From this process's snapshot of the group (`assignments.snapshot_cache`), when one read of the
   group row shows that the snapshot is the committed state (same state_version, raised by
   every locked write; same metadata epochs). `coordination.steady.steady_answer` decides on
   the snapshot without changing it: the core's answer when the heartbeat changes nothing but
   the member's last-seen and last report, else None. Those are stamped in batches: one
   statement per process every `STAMP_PERIOD`
   (a background thread), so the database does one small read per heartbeat instead of a
   write. L1 allows for the batch period (`members.services.sweep_liveness`).
2. Otherwise by one SQL statement that checks the same conditions and stamps last-seen at
   once (`_SQL`); a snapshot found behind is then caught up if the group lock is free.

Anything that changes a member's ownership either changes its row (status, epoch) or raises
the group's assignmentEpoch, and every locked write raises state_version, so a matching row
proves the cached answer is still the core's answer. Statements run on the "liveness"
connection (synchronous_commit=off): a lost last-seen stamp in a crash is harmless, and
fsync stalls would otherwise gate every heartbeat. SQL is built from model metadata.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db import DatabaseError, connections
from django.db.models import Model
from prometheus_client import Gauge

from assignments import snapshot_cache
from assignments.answers import SteadyAnswer
from assignments.models import ShardAssignment, db_column
from assignments.rows import GENERATION_SQL
from coordination import engine
from coordination.model import HeartbeatRequest, HeartbeatResponse, MemberStatus
from coordination.steady import eligible as eligible  # services asks fastpath.eligible
from coordination.steady import steady_answer, steady_report
from coordinator_project import dbpool, waiting
from coordinator_project.process_state import PROCESS, ProcessCache
from dataplane.protocol import Status
from groups.models import Group, Shard, Stream
from members.models import Member as MemberRow

log = logging.getLogger(__name__)

# Seconds between two batched last-seen stamps of a process (RSC_STAMP_PERIOD_S), capped at
# STAMP_PERIOD_MAX_S on every node. L1 allows STAMP_ALLOWANCE_S, derived from the cap and not
# from the sweeper's own setting, so nodes with different settings cannot expire a member
# whose stamp is still on its way: a stamp lands within one period, or two when a batch failed
# once and is retried with the next (issue 23.4).
STAMP_PERIOD_MAX_S = 0.25
STAMP_ALLOWANCE_S = 2 * STAMP_PERIOD_MAX_S
STAMP_PERIOD = min(float(getattr(settings, "RSC_STAMP_PERIOD_S", 0.1)), STAMP_PERIOD_MAX_S)

STAMP_LAG = Gauge(
    "rsc_stamp_lag_seconds",
    "How late the last batch of last-seen stamps of a process reached the database (the age of"
    " its oldest stamp); the highest of the live processes. The session-timeout sweep (L1)"
    " allows STAMP_ALLOWANCE_S (0.5 s) of it.",
    multiprocess_mode="livemax",
)


def _t(model: type[Model]) -> str:
    return model._meta.db_table


def _c(model: type[Model], name: str) -> str:
    return db_column(model, name)


_G, _M, _A, _S, _ST = _t(Group), _t(MemberRow), _t(ShardAssignment), _t(Shard), _t(Stream)

# Plans that cannot go wrong without statistics (issue 11.5): right after a join storm the
# planner may still have the empty tables' statistics, and then a status index looks as good as
# any: `status = 'STABLE'` walked every STABLE member of the table, per heartbeat. So a member
# is found only by a unique key ((group, memberId) or the primary key), and its status is
# compared with IS NOT DISTINCT FROM, which no index serves (equal for the non-null values
# here). tests/integration/test_steady_plans.py EXPLAINs these statements in that state.
_SAME = "IS NOT DISTINCT FROM"

# The single-statement path. Placeholders, in order: memberId, group, status, memberEpoch,
# metadataEpoch, now, now, owned (json), status, memberEpoch, owned (text[]), owned (text[]).
_SQL = f"""
WITH me AS (
    SELECT m.{_c(MemberRow, "id")} AS id, g.{_c(Group, "assignment_epoch")} AS assignment_epoch,
           g.{_c(Group, "heartbeat_interval_ms")} AS heartbeat_interval_ms,
           g.{_c(Group, "metadata_epoch")} AS metadata_epoch,
           g.{_c(Group, "paused_at")} IS NOT NULL AS paused                          -- §11: PAUSED, not OK
      FROM {_G} AS g
      JOIN {_M} AS m ON m.{_c(MemberRow, "group")} = g.{_c(Group, "id")}
                    AND m.{_c(MemberRow, "member_id")} = %s                          -- R8: a member of this group
     WHERE g.{_c(Group, "name")} = %s
       AND m.{_c(MemberRow, "status")} {_SAME} %s                                   -- R8/R6: STABLE (nothing pending, revoking or removed)
       AND m.{_c(MemberRow, "member_epoch")} = %s                                   -- R3: the member's current epoch
       AND g.{_c(Group, "assignment_epoch")} = m.{_c(MemberRow, "member_epoch")}   -- R6: no epoch to advance to
       AND g.{_c(Group, "metadata_epoch")} = %s                                     -- R7: current metadata, else SYNC_METADATA
       AND (g.{_c(Group, "rebalance_due_at")} IS NULL OR g.{_c(Group, "rebalance_due_at")} > %s)  -- R1b: no recompute due
), granted AS (
    -- R6 answer: the shards granted to the member (owned, not revoking), in the core's order.
    -- A STABLE member at the assignment epoch holds exactly its target (R6 leaves it PENDING
    -- or REVOKING otherwise), so nothing is pending or revoking.
    SELECT COALESCE(array_agg(s.{_c(Shard, "shard_id")}::text
                              ORDER BY s.{_c(Shard, "version")}, s.{_c(Shard, "index")}), '{{}}') AS shards
      FROM me
      JOIN {_A} AS a ON a.{_c(ShardAssignment, "owner")} = me.id AND NOT a.{_c(ShardAssignment, "revoking")}
      JOIN {_S} AS s ON s.{_c(Shard, "id")} = a.{_c(ShardAssignment, "shard")}
), stamped AS (
    -- The heartbeat's only effect: last-seen (L1) and, when sent, the last report (R3).
    -- Re-checked on the row's newest version, so a concurrent sweep or fence wins.
    UPDATE {_M} AS m
       SET {_c(MemberRow, "last_heartbeat_at")} = %s,
           {_c(MemberRow, "last_reported_owned")} = COALESCE(%s::jsonb, m.{_c(MemberRow, "last_reported_owned")})
      FROM me, granted
     WHERE m.{_c(MemberRow, "id")} = me.id
       AND m.{_c(MemberRow, "status")} {_SAME} %s                                   -- R8/L1/L2: still STABLE
       AND m.{_c(MemberRow, "member_epoch")} = %s                                   -- R3: still that epoch
       AND (%s::text[] IS NULL OR %s::text[] <@ granted.shards)                      -- R4/C6: claims only granted shards
    RETURNING m.{_c(MemberRow, "id")}
)
-- No row: some clause failed, and the locked path decides (and answers any refusal).
SELECT me.assignment_epoch, me.heartbeat_interval_ms, me.metadata_epoch, granted.shards, me.paused
  FROM stamped, me, granted
"""

# What proves a snapshot current: one indexed read of the group and its stream row (after
# the id and state_version, the columns of snapshot_cache._shape, in its order).
_VERSION_SQL = f"""
SELECT g.{_c(Group, "id")}, g.{_c(Group, "state_version")}, g.{_c(Group, "created_at")},
       g.{_c(Group, "stream")}, g.{_c(Group, "metadata_epoch")}, st.{_c(Stream, "metadata_epoch")},
       g.{_c(Group, "deletion_epoch")}, {GENERATION_SQL}
  FROM {_G} AS g JOIN {_ST} AS st ON st.{_c(Stream, "id")} = g.{_c(Group, "stream")}
 WHERE g.{_c(Group, "name")} = %s
"""

# One batch of stamps. Placeholders: `rows`, one JSON array of {id, ts, owned, epoch} (owned
# absent or null: not reported); `ids`, the member ids as a bigint[] literal; `stable`.
# JSON, not one array per column: psycopg dumps array elements one by one in Python (~3 ms
# per batch of 100, a tenth of a steady heartbeat's cost beyond the DRF ceiling); the rows'
# JSON is a string join. Members are reached by primary key only (`= ANY(ids)`; the status
# compared with IS NOT DISTINCT FROM, see _SAME): with the empty tables' statistics the
# planner otherwise walked the status index once per stamp, comparing every STABLE member
# with it. The worst plan left is one scan of the table per batch.
# A stamp never moves last-seen back (a locked write may have stamped later; an equal time is
# written again, so a stamp at the time of a join still carries its report) and never
# touches a member that stopped being STABLE at that epoch (a sweep or fence won).
# The rows are locked first, in id order (`locked`): two workers' batches over the same members
# then never wait for each other in a cycle. The UPDATE alone locks them in whatever order its
# plan reaches them: past ~100 rows the planner hashes the batch and walks the members in their
# physical order, and two batches deadlocked (seen in the bench).
# The stamps' rows and the clause that keeps a stamp from moving last-seen back (both
# statements; their SET lists stay written out: tests/unit/test_one_writer.py reads them).
_NEVER_BACK = (f"(m.{_c(MemberRow, 'last_heartbeat_at')} IS NULL"
               f" OR m.{_c(MemberRow, 'last_heartbeat_at')} <= v.ts)")
_STAMP_ROWS = "jsonb_to_recordset(%(rows)s::jsonb) AS v(id bigint, ts timestamptz, owned jsonb, epoch integer)"

_STAMP_SQL = f"""
WITH locked AS (
    SELECT m.{_c(MemberRow, "id")} AS id FROM {_M} AS m
     WHERE m.{_c(MemberRow, "id")} = ANY(%(ids)s::bigint[])
       AND m.{_c(MemberRow, "status")} {_SAME} %(stable)s
     ORDER BY m.{_c(MemberRow, "id")}
       FOR NO KEY UPDATE
)
UPDATE {_M} AS m
   SET {_c(MemberRow, "last_heartbeat_at")} = v.ts,
       {_c(MemberRow, "last_reported_owned")} = COALESCE(v.owned, m.{_c(MemberRow, "last_reported_owned")})
  FROM {_STAMP_ROWS}, locked
 WHERE m.{_c(MemberRow, "id")} = v.id
   AND m.{_c(MemberRow, "id")} = locked.id
   AND m.{_c(MemberRow, "status")} {_SAME} %(stable)s
   AND m.{_c(MemberRow, "member_epoch")} = v.epoch
   AND {_NEVER_BACK}
"""

# Members' stamps written at once, with the same checks (steady heartbeats whose report may
# be new: R3 reads the last report from the row, on any host, with no batch in between); one
# statement for the heartbeats of a process that wait at the same time (`_ReportWrites`).
# Each row returns its member's epoch, when the member is STABLE: the member's stamp counts as
# written when that is the stamp's epoch (the caller compares), whether or not the stamp
# was written: a row holding a newer stamp (another request of the member, on this or
# another process, stamped it since this one arrived) needs nothing from this one, which a
# later heartbeat of the member would overwrite anyway. Sending that heartbeat to the locked
# path instead raised state_version for nothing and so emptied every process's snapshot and
# memo (issue 26.2: at 10,000 members ~40 such passes a second kept the steady path cold).
# The UPDATE is a data-modifying CTE: it runs to completion though the SELECT does not read it.
# `{skip}`: the shared statement (_STAMPS_NOW_SQL) skips rows another transaction holds (a
# locked pass writing those members, another process's stamps), in id order, so it never
# waits for a lock and the heartbeats that joined it never queue behind one (decision 0018:
# they did, and storms slowed); a member whose row was skipped is written alone
# (_STAMP_NOW_SQL, which waits for the row as a single heartbeat's statement always did).
_STAMP_NOW_TEMPLATE = f"""
WITH locked AS (
    SELECT m.{_c(MemberRow, "id")} AS id, m.{_c(MemberRow, "member_epoch")} AS member_epoch
      FROM {_M} AS m
     WHERE m.{_c(MemberRow, "id")} = ANY(%(ids)s::bigint[])
       AND m.{_c(MemberRow, "status")} {_SAME} %(stable)s                           -- R8/L1/L2: still STABLE
     {{order}}
       FOR NO KEY UPDATE{{skip}}
), v AS (
    SELECT * FROM {_STAMP_ROWS}
), stamped AS (
    -- L1's last-seen and R3's last report (when sent), as the batch writes them.
    UPDATE {_M} AS m
       SET {_c(MemberRow, "last_heartbeat_at")} = v.ts,
           {_c(MemberRow, "last_reported_owned")} = COALESCE(v.owned, m.{_c(MemberRow, "last_reported_owned")})
      FROM v, locked
     WHERE m.{_c(MemberRow, "id")} = v.id
       AND m.{_c(MemberRow, "id")} = locked.id
       AND m.{_c(MemberRow, "member_epoch")} = v.epoch                               -- R3: still that epoch
       AND {_NEVER_BACK}
)
SELECT locked.id, locked.member_epoch FROM locked JOIN v ON v.id = locked.id
"""
_STAMP_NOW_SQL = _STAMP_NOW_TEMPLATE.format(order="", skip="")
_STAMPS_NOW_SQL = _STAMP_NOW_TEMPLATE.format(order=f"ORDER BY m.{_c(MemberRow, 'id')}", skip=" SKIP LOCKED")

_refreshed: ProcessCache[int, float] = PROCESS.own(
    "snapshot refresh times", ProcessCache(),
    "key: group id -> when a steady heartbeat last caught this process's snapshot up"
    " (monotonic); bound: one per group this process served; invalidated: never (a rate limit:"
    " one catch-up a second); N hosts: only decides when to catch up.",
)


def available() -> bool:
    """PostgreSQL with the liveness connection, and not switched off (RSC_FAST_PATH=False
    forces every heartbeat through the locked core path, e.g. to compare the two)."""
    return "liveness" in connections.databases and getattr(settings, "RSC_FAST_PATH", True)


def _liveness_query(sql: str, params: Sequence[Any] | Mapping[str, Any], *, many: bool = False) -> Any:
    """The statement's first row (None: no row), or with `many` all its rows."""
    conn = connections["liveness"]
    # `pool`: PostgreSQL's wrapper has it (Django 5.1+; None unless DB_POOL), the only engine
    # with a liveness alias; django-stubs declares neither it nor the alias's engine.
    pool = conn.pool if not conn.in_atomic_block else None  # type: ignore[attr-defined]
    if pool is not None:  # gevent workers: a connection of the pool, given back at once
        return _pooled_query(pool, sql, params, many=many)
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if many else cursor.fetchone()
    except DatabaseError as exc:
        # No per-request health-check ping on this connection (a round trip per heartbeat),
        # and its statements are prepared (a migration can invalidate them): on any error
        # the connection is dropped and this heartbeat takes the locked path, which decides.
        log.warning("steady heartbeat path failed, using the locked path: %s", exc)
        conn.close()
        raise


def _pooled_query(pool: Any, sql: str, params: Sequence[Any] | Mapping[str, Any], *, many: bool = False) -> Any:
    """`_liveness_query` on a connection of the alias's pool itself (gevent workers), without
    Django's wrapper: its per-request connect (checkout, connection setup, a signal) and
    cursor wrapping were ~40 % of a group read's CPU, and a steady heartbeat's one read is the
    largest of its costs beyond the DRF ceiling. The pool's connections are Django's own
    (opened with its parameters, type adapters and cursor class; autocommit)."""
    if pool.closed:
        pool.open()  # as Django's connect does for the pool's first use
    try:
        with pool.connection() as raw, raw.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if many else cursor.fetchone()
    except psycopg.Error as exc:  # the pool drops a broken connection when it is given back
        log.warning("steady heartbeat path failed, using the locked path: %s", exc)
        raise DatabaseError(str(exc)) from exc


class _Read:
    """One read of a group's row, shared by every heartbeat that joined it before it started."""

    __slots__ = ("done", "error", "joined", "row")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.row: tuple | None = None
        self.error: Exception | None = None
        self.joined = 1  # heartbeats using it (observability for tests)


# A read whose leader was dropped before it had the row: its joiners read again.
_ABANDONED = Exception("the read's leader was dropped")


class _GroupReads:
    """Coalesced reads of the group row, per process.

    Under gevent a worker serves many heartbeats of one group at once, and each would read the
    same row. A heartbeat joins the group's next read if that read has not started yet, else it
    waits for the running one to end and starts (or joins) the next. So every heartbeat uses a
    read that started after it arrived: it sees every write committed before it arrived,
    exactly as with a read of its own. With one request at a time (sync workers) every read is
    its own.
    """

    def __init__(self, fetch: Callable[[str], tuple | None], *, cooperative: bool = False) -> None:
        self._fetch = fetch
        self.cooperative = cooperative  # chosen at worker start (configure), never sniffed
        self._lock = threading.Lock()
        self._next: dict[str, _Read] = {}  # group -> the read not started yet (others join it)
        self._running: dict[str, _Read] = {}  # group -> the read in flight

    def configure(self, *, cooperative: bool) -> None:
        """At worker start (PROCESS.start): whether this worker runs on gevent's cooperative
        threads, where a leader lets the other ready requests join its read first."""
        self.cooperative = cooperative

    def reset(self) -> None:
        """Forget the reads not started and in flight (tests; a worker's start): their
        heartbeats keep the read they hold, later ones start new reads."""
        with self._lock:
            self._next.clear()
            self._running.clear()

    def read(self, group: str) -> tuple | None:
        while True:
            with self._lock:
                read = self._next.get(group)
                lead = read is None
                if read is None:
                    read = self._next[group] = _Read()
                else:
                    read.joined += 1
            if not lead:
                waiting.wait(read.done)
            else:
                self._lead(group, read)
            if read.error is _ABANDONED:
                continue  # its leader was dropped before the row came: read again
            if read.error is not None:
                raise read.error
            return read.row

    def _lead(self, group: str, read: _Read) -> None:
        # The leader's request may be dropped anywhere here (wsgi_guard raises its deadline, a
        # BaseException, into the greenlet): the read it leads must still end, or every later
        # heartbeat of the group in this process would join it and wait forever (a 10,000-member
        # storm stalled so, issue 26.2).
        try:
            with self._lock:
                running = self._running.get(group)
            if running is not None:
                waiting.wait(running.done)  # joiners keep arriving meanwhile; they share this read
            elif self.cooperative:
                # Let the worker's other ready requests reach this point first and share the
                # read (one pass through the ready greenlets). Measured at 2,000 heartbeats/s:
                # 1.4 → 6–15 heartbeats per read. Not with OS threads (sync workers, tests):
                # there it gives the core to another process, ~0.1 ms per read for nothing.
                seen = read.joined
                for _ in range(3):  # again while that brought more (they were ready meanwhile)
                    time.sleep(0)
                    if read.joined == seen:
                        break
                    seen = read.joined
        except BaseException:
            with self._lock:
                if self._next.get(group) is read:
                    del self._next[group]
            read.error = _ABANDONED
            read.done.set()
            raise
        with self._lock:
            if self._next.get(group) is read:  # (gone only if reset meanwhile)
                del self._next[group]  # started: a heartbeat arriving from now on waits for the next
            self._running[group] = read
        try:
            read.row = self._fetch(group)
        except Exception as exc:  # every heartbeat that shared the read sees its failure
            read.error = exc
        except BaseException:  # the leader was dropped mid-read: the others read again
            read.error = _ABANDONED
            raise
        finally:
            with self._lock:
                if self._running.get(group) is read:
                    del self._running[group]
            read.done.set()


_GROUP_READS: _GroupReads = PROCESS.own(
    "shared group reads", _GroupReads(lambda group: _liveness_query(_VERSION_SQL, (group,))),
    "key: group name -> the read of its row not started yet and the one in flight; bound: two"
    " per group; invalidated: each read is used once, by heartbeats that arrived before it"
    " started; N hosts: it is a fresh read of the database.",
    # The coalescer is chosen when the worker starts (gunicorn's gevent worker: cooperative).
    start=lambda process: _GROUP_READS.configure(cooperative=process.cooperative),
)


def steady_heartbeat(group: str, req: HeartbeatRequest, now: datetime) -> SteadyAnswer | None:
    """The core's answer to a steady heartbeat without the group lock, or None (locked path)."""
    try:
        if snapshot_cache.snapshots_enabled() and STAMP_PERIOD > 0:
            row = _GROUP_READS.read(group)
            if row is None:
                return None  # no such group: the locked path answers
            group_pk, version, shape = row[0], row[1], tuple(row[2:])
            PROCESS.observe_generation(row[-1])  # a restore: everything cached here is dropped
            snap = snapshot_cache.steady_snapshot(group_pk, version, shape)
            if snap is not None:
                return _from_snapshot(group_pk, version, snap, req, now)
            answer = _by_statement(group, req, now)
            # Catch up here at most once a second: while a group churns, its locked
            # heartbeats keep this process's snapshot current anyway.
            if time.monotonic() - _refreshed.get(group_pk, 0.0) > 1.0:
                _refreshed[group_pk] = time.monotonic()
                snapshot_cache.refresh_snapshot(group)
            return answer
        return _by_statement(group, req, now)
    except DatabaseError:
        return None


# Written stamps remembered per process (STAMPS.recent), then forgotten all at once.
_WRITTEN_MAX = 200_000


@dataclass(frozen=True)
class _Steady:
    """A steady answer from a snapshot, with what its last-seen stamp needs."""

    answer: SteadyAnswer
    member_pk: int
    member_epoch: int
    report: str | None  # the ownedShards report as the column stores it; None: not sent


def _from_snapshot(group_pk: int, version: int, snap: snapshot_cache.Snapshot, req: HeartbeatRequest,
                   now: datetime) -> SteadyAnswer | None:
    """`version`: the state_version this heartbeat's group read returned (the snapshot, given
    back after _decide, may already be another pass's)."""
    steady, fresh, seen, session_ms = _decide(group_pk, snap, req, now)
    if steady is None:
        return None
    if fresh and steady.report is not None and not HELD_REPORTS.holds(group_pk, version, steady):
        # The first answer to this report here since the member was last touched: the report
        # may be new (it changes once per grant change, which touches the member). It is
        # written before the answer goes out, so a locked heartbeat on any host at the
        # previous epoch with ownedShards omitted (R3) reads it; only last-seen waits for the
        # batch (issue 23.4). Not when the row is known to hold it already (HELD_REPORTS).
        return steady.answer if _stamp_now(steady, now) else None
    if not STAMPS.recent(steady.member_pk, seen, now, session_ms):
        # Neither the snapshot nor this process's written stamps show the member heard within
        # half a session: its last-seen in the database may be a session old (the first
        # heartbeat after a coordinator restart, or after a silence), and a sweep running
        # while a batched stamp is on its way would expire a member just answered OK, whose
        # own session then still runs (R9: two owners). So the stamp is written first; if
        # the row is no longer STABLE at that epoch (a sweep or fence won), the locked path
        # answers.
        return steady.answer if _stamp_now(steady, now) else None
    STAMPS.add(steady.member_pk, now, steady.report, steady.member_epoch)
    return steady.answer


def _decide(group_pk: int, snap: snapshot_cache.Snapshot, req: HeartbeatRequest,
            now: datetime) -> tuple[_Steady | None, bool, datetime | None, int]:
    """The steady answer from the checked-out snapshot (or None), whether it was computed here
    rather than taken from the memo, the member's last-seen as the snapshot holds it, and the
    group's session. Nothing here may yield to another greenlet (gevent workers): while this
    request holds the snapshot checked out, the worker's other heartbeats find none and take
    the slower statement path. So the stamp is written or queued only after the snapshot is
    back."""
    state = snap.state
    member = state.members.get(req.member_id)
    seen = None if member is None else member.last_heartbeat_at
    session_ms = state.session_timeout_ms
    try:
        # The same request on the same committed state gets the same answer: the decision is
        # a function of the two, and nothing in a steady answer depends on `now` but R1b's due
        # time, checked here each time. A locked pass on the snapshot drops the answers of the
        # members it touched, or all on a group-wide change (snapshot_cache.load_for_heartbeat);
        # a heartbeat's own effect, the member's last-seen, is what the stamp writes.
        key = (req.member_epoch, req.metadata_epoch, req.owned_shards)
        memo = snap.steady.get(req.member_id)
        steady = memo[1] if memo is not None and memo[0] == key else None
        if steady is not None:
            if state.rebalance_due_at is not None and now >= state.rebalance_due_at:
                return None, False, seen, session_ms  # R1b: a recompute is due: the locked path runs it
            return steady, False, seen, session_ms
        # The core's answer if the heartbeat changes nothing but liveness, decided without
        # changing the shared snapshot (coordination.steady); else the locked path decides.
        response = steady_answer(state, req, now)
        if response is None:
            return None, False, seen, session_ms
        report = steady_report(req)
        steady = _Steady(SteadyAnswer(response, state.metadata_epoch), snap.loaded.member_pk[req.member_id],
                         req.member_epoch, None if report is None else json.dumps(report))
        snap.steady[req.member_id] = (key, steady)  # one per member of the snapshot
        return steady, True, seen, session_ms
    finally:
        snapshot_cache.return_snapshot(group_pk, snap)


def _stamp_now(steady: _Steady, now: datetime) -> bool:
    """Write the member's stamp before answering (unless the row holds a newer one); False when
    the row is no longer STABLE at that epoch: the caller lets the locked path answer."""
    return _REPORT_WRITES.write(steady.member_pk, now, steady.report, steady.member_epoch)


class _Write:
    """One statement of stamps written at once, shared by the heartbeats that joined it before
    it started."""

    __slots__ = ("done", "epochs", "error", "rows")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.rows: dict[int, tuple[datetime, str | None, int]] = {}  # member row id -> stamp
        self.epochs: dict[int, int] = {}  # member row id -> its epoch, where the row is STABLE
        self.error: BaseException | None = None


class _ReportWrites:
    """Stamps that must reach the database before their answers go out, one statement per
    batch of heartbeats waiting at the same time (a group commit; `_GroupReads`' shape).

    Right after a join storm every member's first report of its grant is new, and each was a
    statement of its own: at 10,000 members about half of the first seconds' heartbeats
    (issue 26). A heartbeat joins the next statement if it has not started, else waits for the
    running one and then starts or joins the next; each answer still waits for the commit of a
    statement that holds its stamp, so R3 reads it on any host once the answer is out."""

    def __init__(self, execute: Callable[[dict[int, tuple[datetime, str | None, int]], bool], dict[int, int]],
                 *, cooperative: bool = False) -> None:
        self._execute = execute  # (rows, shared) -> member row id -> epoch, for the STABLE ones
        self.cooperative = cooperative  # chosen at worker start (configure), never sniffed
        self._lock = threading.Lock()
        self._next: _Write | None = None  # the statement not started yet (others join it)
        self._running: _Write | None = None
        self.statements = 0  # observability for tests

    def configure(self, *, cooperative: bool) -> None:
        self.cooperative = cooperative

    def reset(self) -> None:
        with self._lock:
            self._next = self._running = None

    def write(self, member_pk: int, now: datetime, report: str | None, epoch: int) -> bool:
        while True:
            with self._lock:
                write = self._next
                lead = write is None
                if write is None:
                    write = self._next = _Write()
                prev = write.rows.get(member_pk)
                if prev is None or prev[0] <= now:  # two of one member: the newer stamp stands
                    write.rows[member_pk] = (now, report, epoch)
            if lead:
                self._lead(write)
            else:
                waiting.wait(write.done)
            if write.error is _ABANDONED:
                continue  # its leader was dropped before writing: write again
            if write.error is not None:  # logged by the query; the batch writes it instead
                STAMPS.add(member_pk, now, report, epoch)
                return True
            held = write.epochs.get(member_pk)
            if held is None and len(write.rows) > 1:
                # Skipped (its row was locked) or not STABLE: written alone, waiting for the row.
                try:
                    held = self._execute({member_pk: (now, report, epoch)}, False).get(member_pk)
                except DatabaseError:  # logged by the query; the batch writes it instead
                    STAMPS.add(member_pk, now, report, epoch)
                    return True
                self.statements += 1
            if held != epoch:
                return False
            STAMPS.written(member_pk, now)
            return True

    def _lead(self, write: _Write) -> None:
        # As _GroupReads._lead: a dropped leader must still end its statement's wait.
        try:
            with self._lock:
                running = self._running
            if running is not None:
                waiting.wait(running.done)  # joiners keep arriving meanwhile
            elif self.cooperative:
                time.sleep(0)  # one pass through the worker's ready requests: they join
        except BaseException:
            with self._lock:
                if self._next is write:
                    self._next = None
            write.error = _ABANDONED
            write.done.set()
            raise
        with self._lock:
            if self._next is write:
                self._next = None  # started: later heartbeats wait for the next one
            self._running = write
        try:
            write.epochs = self._execute(write.rows, len(write.rows) > 1)
            self.statements += 1
        except DatabaseError as exc:
            write.error = exc
        except BaseException:
            write.error = _ABANDONED
            raise
        finally:
            with self._lock:
                if self._running is write:
                    self._running = None
            write.done.set()


def _write_now(rows: dict[int, tuple[datetime, str | None, int]], shared: bool) -> dict[int, int]:
    """`shared`: the statement of several heartbeats (locked rows skipped), else one's own."""
    params = {"rows": _stamp_rows(rows), "ids": "{" + ",".join(map(str, rows)) + "}",
              "stable": MemberStatus.STABLE.value}
    return dict(_liveness_query(_STAMPS_NOW_SQL if shared else _STAMP_NOW_SQL, params, many=True))


_REPORT_WRITES: _ReportWrites = PROCESS.own(
    "stamps written at once", _ReportWrites(_write_now),
    "key: none (one per process) -> the statement of stamps not started yet and the one in"
    " flight; bound: two; invalidated: each is written once, for the heartbeats that joined"
    " it; N hosts: a write to the database, answered after its commit.",
    start=lambda process: _REPORT_WRITES.configure(cooperative=process.cooperative),
)


def _by_statement(group: str, req: HeartbeatRequest, now: datetime) -> SteadyAnswer | None:
    owned = list(req.owned_shards) if req.owned_shards is not None else None
    owned_json = json.dumps(sorted(owned)) if owned is not None else None
    stable = MemberStatus.STABLE.value
    # Positional, in the order the placeholders appear in _SQL (cheaper than named ones).
    params = (
        req.member_id, group, stable, req.member_epoch, req.metadata_epoch,
        now, now, owned_json, stable, req.member_epoch, owned, owned,
    )
    row = _liveness_query(_SQL, params)
    if row is None:
        return None
    return SteadyAnswer(
        HeartbeatResponse(
            error_code=engine.ErrorCode.NONE,
            status=Status.PAUSED if row[4] else Status.OK,  # §11
            member_id=req.member_id,
            member_epoch=req.member_epoch,
            assignment_epoch=row[0],
            heartbeat_interval_ms=row[1],
            assignment=engine.Assignment(assigned=tuple(row[3])),
        ),
        row[2],
    )


# --- reports the member rows hold already ----------------------------------------------------
# Each member's first answer here after a locked pass touched it writes its report at once
# (above), though another process has often written that same report: after a join storm every
# member's grant report is written by the process that first answered it, then again by each
# other one (issue 26: ~10,000 redundant writes at 10,000 members, the first seconds after the
# storm at 0.55-0.75x the steady rate). One read of the group's reports replaces them.
_HELD_SQL = f"""
SELECT m.{_c(MemberRow, "id")}, m.{_c(MemberRow, "member_epoch")}, m.{_c(MemberRow, "last_reported_owned")}::text
  FROM {_M} AS m
 WHERE m.{_c(MemberRow, "group")} = %s
   AND m.{_c(MemberRow, "status")} {_SAME} %s
"""
HELD_MISSES = 64  # first answers of one version that wrote at once before a read is worth it
HELD_SETTLED_S = 1.0  # how long a version has been current here before its reports are read
HELD_READ_EVERY_S = 2.0  # at most one read per group this often


@dataclass
class _Held:
    version: int  # the group's state_version this knowledge belongs to
    since: float  # when this process first saw that version (monotonic)
    rows: dict[int, tuple[int, str]]  # member row id -> (member epoch, report as the writer dumps it)
    misses: int = 0  # first answers of this version that found no matching row here
    read_at: float = float("-inf")
    reading: bool = False


class _HeldReports:
    """What each STABLE member's row held as its last report at this process's last read of the
    group, trusted only while the group's state_version is the one current here then.

    Between two locked writes (each raises state_version) a member's report changes only by a
    stamp of its own next heartbeat; a member reports a grant change once (the memo's own
    assumption, Snapshot.steady). So when the row held this member's report at this epoch, the
    row holds its latest report (R3 reads it) and writing it again changes nothing."""

    def __init__(self, fetch: Callable[[int], list[tuple[int, int, str | None]]]) -> None:
        self._fetch = fetch
        self._lock = threading.Lock()
        self._groups: dict[int, _Held] = {}
        self.reads = 0  # observability for tests

    def reset(self) -> None:
        with self._lock:
            self._groups.clear()

    def holds(self, group_pk: int, version: int, steady: _Steady) -> bool:
        """Whether the member's row is known to hold `steady`'s report at its epoch. A miss may
        read the group's reports (in this request) once a version has settled here."""
        held = self._current(group_pk, version)
        if held.rows.get(steady.member_pk) == (steady.member_epoch, steady.report):
            return True
        now = time.monotonic()
        with self._lock:
            held.misses += 1
            if (held.reading or held.misses < HELD_MISSES or now - held.since < HELD_SETTLED_S
                    or now - held.read_at < HELD_READ_EVERY_S):
                return False
            held.reading, held.read_at, held.misses = True, now, 0
        try:
            rows = self._fetch(group_pk)
            # PostgreSQL's text of the stored report: equal to the writer's JSON only if the
            # value is equal (another spelling of an equal value is a miss: written again).
            held.rows = {pk: (epoch, owned) for pk, epoch, owned in rows if owned is not None}
            self.reads += 1
        except DatabaseError:  # logged by the query; the writes go on as before
            return False
        finally:
            held.reading = False
        return held.rows.get(steady.member_pk) == (steady.member_epoch, steady.report)

    def _current(self, group_pk: int, version: int) -> _Held:
        held = self._groups.get(group_pk)
        if held is not None and held.version == version:
            return held
        with self._lock:
            held = self._groups.get(group_pk)
            if held is not None and version < held.version:
                return _Held(version, time.monotonic(), {})  # a slower read's older version: no knowledge
            if held is None or held.version != version:
                held = self._groups[group_pk] = _Held(version, time.monotonic(), {})  # what was read is dropped
            return held


HELD_REPORTS: _HeldReports = PROCESS.own(
    "reports the rows hold", _HeldReports(
        lambda group_pk: _liveness_query(_HELD_SQL, (group_pk, MemberStatus.STABLE.value), many=True)),
    "key: group id -> its state_version, and each STABLE member row's epoch and last report as"
    " last read; bound: one group's members per group served, read at most every"
    " HELD_READ_EVERY_S once HELD_MISSES first answers wrote at once; invalidated: another"
    " state_version seen here drops it (every locked write on any host raises it); N hosts: a"
    " read of the database, trusted for that version only.",
)


# --- batched last-seen stamps ---------------------------------------------------------------
class _Stamps:
    """Last-seen stamps waiting for the next batch, one per member (the newest wins)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[datetime, str | None, int]] = {}
        self._pid = 0
        self._thread: threading.Thread | None = None
        self._running = False  # the thread is started and has not ended (it clears this itself)
        self._stop = threading.Event()
        # Member row id -> the newest last-seen this process wrote for it (a lower bound of the
        # column: a stamp never moves it back, nor does any other write). Read by `recent`.
        self._written: dict[int, datetime] = {}

    def written(self, member_pk: int, at: datetime) -> None:
        """Note a stamp of this process that reached the database."""
        if len(self._written) >= _WRITTEN_MAX:
            self._written.clear()
        prev = self._written.get(member_pk)
        if prev is None or prev < at:
            self._written[member_pk] = at

    def recent(self, member_pk: int, seen: datetime | None, now: datetime, session_ms: int) -> bool:
        """Whether the member's last-seen in the database is known to be within half a session
        of `now` (`seen`: the snapshot's, also a lower bound): then a batched stamp, at most
        STAMP_ALLOWANCE_S late, cannot let a sweep expire a member just answered OK."""
        horizon = now - timedelta(milliseconds=session_ms / 2)
        if seen is not None and seen >= horizon:
            return True
        at = self._written.get(member_pk)
        return at is not None and at >= horizon

    def reset(self) -> None:
        """Tests: write what is pending, forget what was written."""
        self.flush()
        self._written.clear()

    def add(self, member_pk: int, now: datetime, report: str | None, epoch: int) -> None:
        """`report`: the member's ownedShards as the column stores them (JSON, in the core's
        order), or None when the heartbeat did not send them."""
        with self._lock:
            if self._pid != os.getpid():  # first use in this (forked) process
                self._pid = os.getpid()
                self._pending = {}
                self._thread = None
                self._running = False
                atexit.register(self.stop)
            # A flag the thread keeps, not Thread.is_alive(): under gevent's monkey-patching
            # is_alive() of a running thread yields to other greenlets on every call.
            if not self._running:
                self._running = True
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="rsc-stamps", daemon=True)
                self._thread.start()
            prev = self._pending.get(member_pk)
            if report is None and prev is not None and prev[2] == epoch:
                report = prev[1]  # ownedShards omitted: the earlier report still stands
            self._pending[member_pk] = (now, report, epoch)

    def stop(self) -> None:
        """Flush, close the thread's connection and end it (process exit, test teardown)."""
        thread = self._thread
        self._stop.set()
        if thread is not None and thread.is_alive():
            thread.join(5)
        self.flush()

    def drop(self) -> None:
        """Forget what is pending (a database rewind: the rows they name may be others now)."""
        self._take()
        self._written.clear()

    def _take(self) -> dict[int, tuple[datetime, str | None, int]]:
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending

    def _merge_back(self, rows: dict[int, tuple[datetime, str | None, int]]) -> None:
        with self._lock:
            for pk, stamp in rows.items():
                if pk not in self._pending or self._pending[pk][0] < stamp[0]:
                    self._pending[pk] = stamp

    def flush(self) -> None:
        """Write what is pending now, on this thread's liveness connection."""
        rows = self._take()
        if not rows:
            return
        params = {"rows": _stamp_rows(rows), "ids": "{" + ",".join(map(str, rows)) + "}",
                  "stable": MemberStatus.STABLE.value}
        conn = connections["liveness"]
        try:
            with conn.cursor() as cursor:
                cursor.execute(_STAMP_SQL, params)
        except DatabaseError as exc:
            log.warning("last-seen stamps not written, retrying with the next batch: %s", exc)
            conn.close()
            self._merge_back(rows)
            return
        except BaseException:
            # A request that flushes before its locked pass was dropped (the request deadline,
            # issue 27.4): the other members' stamps it took go with the next batch, not lost.
            self._merge_back(rows)
            raise
        # A row the batch did not change is not STABLE at that epoch any more (a locked write,
        # which raises state_version: no snapshot answer follows for it) or holds a newer stamp.
        for pk, (ts, _, _) in rows.items():
            self.written(pk, ts)
        oldest = min(ts for ts, _, _ in rows.values())
        STAMP_LAG.set(max(0.0, time.time() - oldest.timestamp()))

    def _run(self) -> None:
        idle = 0
        try:
            while not self._stop.wait(STAMP_PERIOD):
                try:
                    self.flush()
                except Exception:  # never let the stamping thread die
                    log.exception("last-seen stamp batch failed")
                with self._lock:
                    idle = 0 if self._pending else idle + 1
                if idle == 10:  # quiet for a second: give the connection back
                    connections["liveness"].close()
            self.flush()
        finally:
            with self._lock:
                self._running = False
            connections["liveness"].close()


def _stamp_rows(rows: dict[int, tuple[datetime, str | None, int]]) -> str:
    """_STAMP_SQL's rows as JSON text: every value is an int, an ISO time or a report that
    is JSON already, so a join of formatted strings is exact (and far cheaper than dumping).
    In any order: the statement locks the rows in id order itself (its `locked`)."""
    return "[" + ",".join(
        f'{{"id":{pk},"ts":"{ts.isoformat()}","owned":{owned or "null"},"epoch":{epoch}}}'
        for pk, (ts, owned, epoch) in rows.items()
    ) + "]"


STAMPS: _Stamps = PROCESS.own(
    "pending stamps", _Stamps(),
    "Last-seen stamps of steady heartbeats not yet written. key: member row id -> (last-seen,"
    " report, epoch); bound: one per member heartbeating here, written every RSC_STAMP_PERIOD_S"
    " and before each locked pass; invalidated: written (compare-and-set: never back, only"
    " STABLE at that epoch); N hosts: L1 allows one stamp period. With them, the newest stamp"
    " written per member (200,000, then emptied; a lower bound of the column, which nothing"
    " moves back): a steady answer batches its stamp only while that or the snapshot shows the"
    " member heard within half a session, else writes it first.",
    reset=lambda: STAMPS.reset(), close=lambda: STAMPS.stop(), rewind=lambda: STAMPS.drop(),
)


def flush_stamps() -> None:
    """Before a locked pass: this process's pending stamps are written, so it reads them. The
    pooled liveness connection goes back at once: the locked pass may queue for a while."""
    STAMPS.flush()
    dbpool.release("liveness")
