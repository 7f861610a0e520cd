"""The flush that ends each transactional test (tests/conftest.py, `_flush_nonempty_sql`)
empties every table that holds a row: the small ones by DELETE, the big ones by TRUNCATE."""
from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.utils import timezone

from groups.models import Group
from members.models import Member
from tests.conftest import _REFERENCE_TABLES, FLUSH_DELETE_MAX_ROWS, _flush_nonempty_sql

from .conftest import make_group

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True)]


def _file_of(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relfilenode FROM pg_class WHERE oid = %s::regclass", [table])
        return cursor.fetchone()[0]


def _rows(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
        return cursor.fetchone()[0]


def test_the_flush_deletes_small_tables_truncates_big_ones_and_leaves_every_table_empty():
    fx = make_group(stream="flush", group="flush-g", shards=4)
    group = Group.objects.get(name=fx.group)
    now = timezone.now()
    Member.objects.bulk_create(
        Member(group=group, member_id=f"m{i}", status="STABLE", member_epoch=1, joined_at=now, last_heartbeat_at=now)
        for i in range(FLUSH_DELETE_MAX_ROWS + 1))
    tables = [t for t in connection.introspection.django_table_names(only_existing=True, include_views=False)
              if t not in _REFERENCE_TABLES]  # as the flush is called
    filled = [t for t in tables if _rows(t)]
    assert {"groups_group", "groups_stream", "groups_apikey", "members_member"} <= set(filled)
    before = {t: _file_of(t) for t in filled}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_flush_nonempty_sql(tables))
    assert {t: n for t in tables if (n := _rows(t))} == {}
    # members_member (1,001 rows) and what references it (the shard assignments) got new files;
    # the small tables kept theirs: their rows were deleted.
    renewed = {t for t in filled if _file_of(t) != before[t]}
    assert "members_member" in renewed
    assert {"groups_group", "groups_stream", "groups_apikey"}.isdisjoint(renewed)
