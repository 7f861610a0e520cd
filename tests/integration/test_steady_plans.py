"""Issue 11.5: the steady path's statements plan well without fresh statistics.

Right after a join storm the planner may still hold the statistics of the empty tables (an
ANALYZE before the rows were written; autovacuum late or off). Then any index looks as good
as another, and a status index walked every STABLE member of the table per heartbeat (and per
stamp of a batch). Here the member and slot tables are analyzed empty, 1,000 members and
4,096 slots written after, and each hot statement EXPLAINed as a custom and as a generic plan
(psycopg prepares them; PostgreSQL may switch a prepared statement to its generic plan).
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from assignments import fastpath
from assignments.models import ShardAssignment
from groups.models import Group
from members.models import Member
from tests.redis_keys import delete_stream_keys

from .conftest import make_group

pytestmark = pytest.mark.needs_postgres

MEMBERS, SHARDS = 1000, 4096


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _liveness_settings() -> list[tuple[str, str]]:
    """The `-c name=value` settings the steady path's connection is opened with."""
    return re.findall(r"-c\s*([\w.]+)=(\S+)", settings.DATABASES["liveness"]["OPTIONS"]["options"])


def _plans(name: str, sql: str, args: str) -> list[dict[str, Any]]:
    """EXPLAIN the statement prepared as psycopg prepares it, custom and generic, with the
    settings of the connection it runs on. `args` in placeholder order; a named placeholder
    counts where it first appears."""
    numbers = iter(range(1, 100))
    named: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return f"${next(numbers)}"
        return f"${named.setdefault(match.group(1), next(numbers))}"

    with connection.cursor() as cursor:
        for setting, value in _liveness_settings():
            cursor.execute(f"SET LOCAL {setting} = {value}")
        cursor.execute(f"PREPARE {name} AS " + re.sub(r"%(?:\((\w+)\))?s", number, sql))
        plans = []
        for mode in ("force_custom_plan", "force_generic_plan"):
            cursor.execute(f"SET LOCAL plan_cache_mode = {mode}")
            cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {name}{args}")
            raw = cursor.fetchone()[0]
            plans.append((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])
        cursor.execute(f"DEALLOCATE {name}")
    return plans


def _member_index_scans(plan: dict[str, Any]) -> set[str]:
    return {n["Index Name"] for n in _nodes(plan)
            if n.get("Relation Name") == Member._meta.db_table and "Index Name" in n}


@pytest.fixture
def storm_without_statistics(db: None) -> tuple[Group, Member]:
    tables = ", ".join(m._meta.db_table for m in (Member, ShardAssignment))
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {tables}")  # the statistics of (nearly) empty tables
    with override_settings(MAX_SHARDS_PER_STREAM=SHARDS):
        fx = make_group(stream="plans", group="plans-g", shards=SHARDS)
    delete_stream_keys("plans")  # these tests read the database only: no stream keys left behind
    group = Group.objects.get(name=fx.group)
    now = timezone.now()
    Member.objects.bulk_create(
        Member(group=group, member_id=f"m{i:04d}", status="STABLE", member_epoch=1, joined_at=now,
               last_heartbeat_at=now)
        for i in range(MEMBERS)
    )
    pks = list(Member.objects.filter(group=group).order_by("pk").values_list("pk", flat=True))
    with connection.cursor() as cursor:  # slots spread over the members, as a settled group's
        cursor.execute(
            f"UPDATE {ShardAssignment._meta.db_table} SET owner_id = (%s::bigint[])[1 + id %% %s]"
            " WHERE group_id = %s", [pks, len(pks), group.pk])
    Group.objects.filter(pk=group.pk).update(assignment_epoch=1)
    return group, Member.objects.get(group=group, member_id="m0007")


def _allowed_member_indexes() -> set[str]:
    """The primary key and the (group, memberId) unique index: one row per lookup."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [Member._meta.db_table])
        return {name for name, ddl in cursor.fetchall()
                if ddl.endswith("(id)") or ddl.endswith("(group_id, member_id)")}


def _status_indexes() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [Member._meta.db_table])
        return {name for name, ddl in cursor.fetchall() if "(status" in ddl}


def test_steady_statement_never_walks_the_status_index_or_the_table_without_statistics(
    storm_without_statistics,
):
    group, member = storm_without_statistics
    # Placeholders in _SQL's order: ..., metadata epoch, now (R1b: no recompute due), now (stamp), ...
    args = (f"('{member.member_id}', '{group.name}', 'STABLE', 1, {group.metadata_epoch}, now(), now(), NULL,"
            " 'STABLE', 1, NULL, NULL)")
    for plan in _plans("steady", fastpath._SQL, args):
        used = _member_index_scans(plan)
        # Not the status index (every STABLE member of every group, per heartbeat) and no scan
        # of the table. Still possible: a walk of this group's members by a (group, ...) index
        # instead of the (group, memberId) one — bounded by the group, not the table.
        assert used, used
        assert not used & _status_indexes(), used
        assert "members_member_pkey" in used  # the stamp: by primary key
        assert not any(n.get("Relation Name") == Member._meta.db_table and n["Node Type"] == "Seq Scan"
                       for n in _nodes(plan))


def test_stamp_batch_reaches_members_by_primary_key_without_statistics(storm_without_statistics):
    group, _member = storm_without_statistics
    allowed = _allowed_member_indexes()
    ids = list(Member.objects.filter(group=group).values_list("pk", flat=True)[:200])
    rows = ",".join(f'{{"id":{pk},"ts":"2026-01-01T00:00:00+00:00","epoch":1}}' for pk in ids)
    args = f"('{{{','.join(map(str, ids))}}}', 'STABLE', '[{rows}]')"  # ids, stable, rows
    for plan in _plans("stamps", fastpath._STAMP_SQL, args):
        # An index on the primary key, or at worst one scan of the table per batch: never a
        # status index walked once per stamp.
        assert _member_index_scans(plan) <= allowed, _member_index_scans(plan)


def test_stamp_now_reaches_its_member_by_primary_key_without_statistics(storm_without_statistics):
    """The one stamp a steady heartbeat with a new report writes before its answer (R3)."""
    _group, member = storm_without_statistics
    allowed = _allowed_member_indexes()
    rows = f'{{"id":{member.pk},"ts":"2026-01-01T00:00:00+00:00","epoch":1}}'
    args = f"('{{{member.pk}}}', 'STABLE', '[{rows}]')"  # ids, stable, rows
    plans = [*_plans("stamp_now", fastpath._STAMP_NOW_SQL, args), *_plans("stamps_now", fastpath._STAMPS_NOW_SQL, args)]
    for plan in plans:
        used = _member_index_scans(plan)
        assert used, used
        assert used <= allowed, used
        assert not any(n.get("Relation Name") == Member._meta.db_table and n["Node Type"] == "Seq Scan"
                       for n in _nodes(plan))


def test_version_read_is_one_indexed_row(storm_without_statistics):
    group, _ = storm_without_statistics
    for plan in _plans("version", fastpath._VERSION_SQL, f"('{group.name}')"):
        scans = [n for n in _nodes(plan) if n.get("Relation Name") == Group._meta.db_table]
        assert scans, scans
        assert all("Index Name" in n for n in scans), scans
