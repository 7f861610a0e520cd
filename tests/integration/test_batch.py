"""assignments.batch: a locked pass's statements in one round trip, merged whole or statement by
statement on PostgreSQL (past psycopg's parse cache), with the same rows either way."""
from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction

from assignments import batch
from assignments.batch import Batch

pytestmark = [pytest.mark.django_db, pytest.mark.needs_postgres]

# Values whose quoting differs: quotes, a percent sign, a placeholder's text, a backslash,
# NULL, an aware datetime, a bool, a JSON document (as the writer passes it), an array.
AWKWARD = ["it's 100% %s \\ done", None, datetime(2026, 12, 7, 4, 0, 1, 123456, tzinfo=UTC), True,
           {"a": "b's", "n": [1, 2]}, ["x", "y'z"]]


def _fill(rows: int) -> list[tuple]:
    from psycopg.types.json import Jsonb

    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE batch_probe (n int, t text, ts timestamptz, b bool, j jsonb, a text[])"
                       " ON COMMIT DROP")
    writes = Batch()
    text, none, ts, flag, doc, arr = AWKWARD
    for n in range(rows):
        writes.add("INSERT INTO batch_probe VALUES (%s, %s, %s, %s, %s, %s::text[])",
                   [n, text if n % 2 else none, ts, flag, Jsonb(doc), arr])
    seen: list[list[tuple]] = []
    writes.add("SELECT count(*) FROM batch_probe", [], seen.append)
    writes.run()
    with connection.cursor() as cursor:
        cursor.execute("SELECT n, t, ts, b, j, a FROM batch_probe ORDER BY n")
        got = cursor.fetchall()
    assert seen == [[(rows,)]]  # the last statement's rows reach its callback
    return got


@pytest.mark.parametrize("rows", [2, 60])  # 60 statements: past 50 values
def test_a_batch_past_psycopgs_parse_cache_writes_what_a_short_one_writes(rows: int):
    assert (6 * rows > batch.CACHED_SQL_VALUES) == (rows == 60)  # six values a row
    with transaction.atomic():
        got = _fill(rows)
    text, _, ts, flag, doc, arr = AWKWARD
    # Django's connection reads jsonb as text (JSONField parses it).
    assert [(*row[:4], json.loads(row[4]), row[5]) for row in got] == [
        (n, text if n % 2 else None, ts, flag, doc, arr) for n in range(rows)]


def test_a_long_batch_is_sent_statement_by_statement_merged_and_a_short_one_whole(monkeypatch: pytest.MonkeyPatch):
    merged: list[str] = []
    real = connection.cursor

    def spying_cursor(*args, **kwargs):
        wrapper = real(*args, **kwargs)
        mogrify = wrapper.cursor.mogrify
        wrapper.cursor.mogrify = lambda sql, params=None: merged.append(sql) or mogrify(sql, params)
        return wrapper

    monkeypatch.setattr(connection, "cursor", spying_cursor)
    with transaction.atomic():
        _fill(2)
        assert merged == []
        transaction.set_rollback(True)
    with transaction.atomic():
        _fill(60)
        assert len(merged) == 61
        transaction.set_rollback(True)


def _literal(value: object) -> str:
    """The value as the batch's client-side cursor sends it."""
    with connection.cursor() as cursor:
        return cursor.cursor.mogrify("%s", [value])


def test_the_writers_values_are_the_orms_for_every_kind_it_writes():
    """assignments.writer._prep hands on ints, strs, bools, None and (on PostgreSQL) aware
    datetimes as they are, and sends the rest through the field: each value is what the
    ORM's own preparation makes of it."""
    from datetime import timedelta, timezone

    from assignments.models import concrete_field
    from assignments.writer import _prep
    from coordination.model import MemberStatus
    from groups.models import Event
    from members.models import Member

    aware = datetime(2026, 12, 7, 4, 0, 1, tzinfo=UTC)
    member = dict(status=MemberStatus.STABLE.value, member_epoch=7, previous_member_epoch=0, client_id="h/1",
                  rebalance_timeout_ms=None, last_heartbeat_at=aware,
                  revocation_deadline=aware.astimezone(timezone(timedelta(hours=9))),
                  fenced_reason="", fenced_by=None, instance_id=None, joined_at=None, library_version="x/1",
                  last_reported_owned=["s:0:1"], group=3, member_id="m", state_version=9)
    event = dict(created_at=aware, kind="joined", group=3, stream=4, member_id="m", group_epoch=2,
                 member_epoch=None, actor="a", detail={"assignmentEpoch": 2, "why": "it's"})
    for model, values in ((Member, member), (Event, event)):
        columns, params = _prep(model, values)
        fields = [concrete_field(model, name) for name in values]
        assert columns == [f.column for f in fields]
        orm = [f.get_db_prep_save(values[f.name], connection) for f in fields]
        assert [(name, ours, theirs) for name, ours, theirs in zip(values, params, orm, strict=True)
                if _literal(ours) != _literal(theirs)] == []
