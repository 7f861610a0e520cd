"""Issue 26.3: describe at 10,000 members × 16,384 shards answers one page of members and of
shards with the whole group's counts, from a fixed number of statements each bounded by the
page size; the API, `describe_group` and `list_members` page through the rest. The group is
built in bulk (bench.bigroup); the assertions are on queries and sizes, not wall time."""
from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from bench.bigroup import build_settled_group, drop_backlog, member_name
from groups import shardstats
from groups.describe import DEFAULT_PAGE_SIZE, describe_group
from groups.models import Group
from groups.services import create_api_key
from tests.redis_keys import delete_stream_keys

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]

MEMBERS, SHARDS = 10_000, 16_384
MOST_QUERIES = 12  # group, live shard ids, two page reads, members, slots, counts: not per member


_COPY = "rsc_test_copy_"  # prefix of the copies: not Django tables, so no flush empties them
_REFERENCE_TABLES = ("django_content_type", "auth_permission")  # kept by the flush (tests/conftest.py)


@pytest.fixture(scope="module")
def _big_copy(django_db_blocker: Any) -> Iterator[list[str]]:
    """The tables the big group filled, copied aside after its first build in this process
    (one xdist worker); dropped after the module."""
    copied: list[str] = []
    yield copied
    with django_db_blocker.unblock(), connection.cursor() as cur:
        for table in copied:
            cur.execute(f'DROP TABLE IF EXISTS "{_COPY}{table}"')
    delete_stream_keys("paged")  # its 16,384 shard streams, kept for the module's tests


@pytest.fixture
def big(_big_copy: list[str]) -> Iterator[Group]:
    """10,000 members over 16,384 shards. Building it takes ~5 s of CPU (objects, services,
    16,384 consumer groups in Redis) and these tests only read it: built once, then the same
    rows (ids included) are copied back in after each test's flush. Its Redis keys stay until
    the module ends."""
    shardstats.clear_cache()
    with connection.cursor() as cur:
        if not _big_copy:
            build_settled_group("paged", "big", MEMBERS, SHARDS)
            for table in connection.introspection.django_table_names(only_existing=True):
                cur.execute(f'SELECT EXISTS (SELECT 1 FROM "{table}")')
                if table not in _REFERENCE_TABLES and cur.fetchone()[0]:
                    cur.execute(f'CREATE TABLE "{_COPY}{table}" AS TABLE "{table}"')
                    _big_copy.append(table)
        else:
            with transaction.atomic():  # foreign keys are checked at COMMIT (deferred)
                for table in _big_copy:
                    cur.execute(f'INSERT INTO "{table}" SELECT * FROM "{_COPY}{table}"')
            names = ", ".join(f'"{table}"' for table in _big_copy)
            cur.execute(f"ANALYZE {names}")  # the planner's figures, as after the build
    yield Group.objects.get(name="big")
    shardstats.clear_cache()


@pytest.fixture
def mixed() -> Iterator[Group]:
    """A small group in every state: revoking, unowned, pending (target elsewhere), drained."""
    r = redis.Redis.from_url(settings.STREAM_REDIS_URL)
    shardstats.clear_cache()
    group = build_settled_group("mixed", "mixed", 23, 61)
    with connection.cursor() as cur:
        cur.execute("UPDATE assignments_shardassignment SET revoking = true WHERE group_id = %s AND id %% 7 = 0",
                    [group.pk])
        cur.execute("UPDATE assignments_shardassignment SET owner_id = NULL, revoking = false"
                    " WHERE group_id = %s AND id %% 11 = 0",
                    [group.pk])
        cur.execute("""UPDATE assignments_shardassignment SET target_id = (SELECT min(id) FROM members_member
                       WHERE group_id = %s) WHERE group_id = %s AND id %% 5 = 0""", [group.pk, group.pk])
        cur.execute("UPDATE members_member SET status = 'REVOKING' WHERE group_id = %s AND id %% 4 = 0", [group.pk])
        cur.execute("UPDATE members_member SET status = 'LEFT' WHERE group_id = %s AND id %% 9 = 0", [group.pk])
    yield group
    drop_backlog(r, "mixed")
    r.close()
    shardstats.clear_cache()


def test_i26_3_describe_pages_add_up_to_the_whole_document(mixed: Group):
    """Every page's members and shards, in order, are the full document's, with the same
    entries (owners, targets, pending, revoking, unowned), and every page carries the whole
    group's counts and phase."""
    now = timezone.now()  # sinceLastHeartbeatMs is relative to it
    full = describe_group("mixed", now, page_size=None)
    assert full is not None
    members, shards = [], []
    page = 1
    while True:
        doc = describe_group("mixed", now, page=page, page_size=7)
        assert doc is not None
        assert (doc["state"], doc["memberCounts"], doc["shardCounts"]) == (
            full["state"], full["memberCounts"], full["shardCounts"])
        assert doc["paging"] == {"page": page, "pageSize": 7, "members": len(full["members"]),
                                 "shards": len(full["shards"]), "lastPage": -(-61 // 7)}
        members += doc["members"]
        shards += doc["shards"]
        if page == doc["paging"]["lastPage"]:
            break
        page += 1
    assert members == full["members"]
    assert shards == full["shards"]
    assert set(full["shardCounts"]) == {"granted", "revoking", "unowned", "drained"}
    assert full["shardCounts"]["revoking"]
    assert full["shardCounts"]["unowned"]
    assert full["memberCounts"]["REVOKING"]
    assert full["state"] == "RECONCILING"


def test_i26_3_describe_at_10000_members_16384_shards_reads_a_page_not_the_group(big: Group):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key(group='big')}")
    api.get("/api/v1/groups/big")  # per-process caches (shard catalogue, live shard ids)
    with CaptureQueriesContext(connection) as queries:
        response = api.get("/api/v1/groups/big")
    assert response.status_code == 200
    doc = response.json()
    assert len(queries) <= MOST_QUERIES, [q["sql"][:120] for q in queries]
    assert len(response.content) < 1_000_000, len(response.content)  # the whole group was 7.3 MB
    assert doc["memberCounts"]["STABLE"] == MEMBERS
    assert doc["shardCounts"] == {"granted": SHARDS, "revoking": 0, "unowned": 0, "drained": 0}
    assert doc["paging"] == {"page": 1, "pageSize": DEFAULT_PAGE_SIZE, "members": MEMBERS, "shards": SHARDS,
                             "lastPage": 17}
    assert [m["memberId"] for m in doc["members"]] == [member_name(i) for i in range(DEFAULT_PAGE_SIZE)]
    assert [s["shardId"] for s in doc["shards"][:2]] == ["paged:1:0", "paged:1:1"]
    assert doc["state"] == "STABLE"
    # Each member's shards are complete on its page (m-0007 holds 7, 10007 of 16,384).
    assert doc["members"][7]["assignedShards"] == ["paged:1:7", "paged:1:10007"]
    # The last page: the shards beyond the members, no member left.
    with CaptureQueriesContext(connection) as queries:
        last = api.get("/api/v1/groups/big?page=17&pageSize=1000").json()
    assert len(queries) <= MOST_QUERIES
    assert last["members"] == []
    assert [s["shardId"] for s in last["shards"]] == [f"paged:1:{i}" for i in range(16_000, SHARDS)]
    assert last["shards"][0]["owner"] == member_name(16_000 % MEMBERS)
    for bad in ("page=0", "page=x", "pageSize=5001", "pageSize=-1", "page=١"):  # noqa: RUF001
        refused = api.get(f"/api/v1/groups/big?{bad}")
        assert refused.status_code == 400, bad
        assert refused.json()["errorCode"] == "INVALID_REQUEST"


def test_i26_3_describe_group_command_prints_counts_and_one_page_list_members_every_member(big: Group):
    out = StringIO()
    with CaptureQueriesContext(connection) as queries:
        call_command("describe_group", "big", "--page-size", "50", "--page", "2", stdout=out)
    assert len(queries) <= MOST_QUERIES
    text = out.getvalue()
    assert f"COUNTS  members {MEMBERS} (STABLE {MEMBERS})  shards {SHARDS} (granted {SHARDS})" in text
    assert "PAGE 2 of 328 (50 members and shards a page; --page 3 for the next)" in text
    assert len(text.splitlines()) < 120  # 50 shards and 50 members, not 26,000 lines
    assert member_name(50) in text
    assert member_name(100) not in text
    doc = json.loads(_run("describe_group", "big", "--json"))
    assert len(doc["members"]) == DEFAULT_PAGE_SIZE
    listed = json.loads(_run("list_members", "big", "--json"))
    assert [m["memberId"] for m in listed] == [member_name(i) for i in range(MEMBERS)]


def _run(*argv: str) -> str:
    out = StringIO()
    call_command(*argv, stdout=out)
    return out.getvalue()


def test_i26_3_admin_group_page_and_matrix_at_10000_members_read_a_page_of_members(big: Group):
    """Above PAGED_ABOVE_MEMBERS the group page and the matrix read the shards in one statement
    and the members a page at a time (filters in SQL): a bounded number of queries and of bytes,
    the counts still the group's."""
    from django.contrib.auth.models import User
    from django.test import Client

    admin = Client()
    admin.force_login(User.objects.create_superuser("root", password=None))
    pages = {
        "group": f"/admin/groups/group/{big.pk}/change/",
        "group, filtered": f"/admin/groups/group/{big.pk}/change/?mq=m-00",
        "group, none expired": f"/admin/groups/group/{big.pk}/change/?liveness=expired",
        "matrix": f"/admin/groups/group/{big.pk}/matrix/",
        "matrix, one member": f"/admin/groups/group/{big.pk}/matrix/?member=m-0007",
    }
    html = {}
    for label, url in pages.items():
        admin.get(url)  # per-process caches
        with CaptureQueriesContext(connection) as queries:
            response = admin.get(url)
        assert response.status_code == 200, label
        assert len(queries) <= 25, (label, [q["sql"][:100] for q in queries])
        assert len(response.content) < 400_000, (label, len(response.content))
        html[label] = response.content.decode()
    group = html["group"]
    assert f"Members ({MEMBERS})" in group
    assert group.count('<tr id="summary-') == 100
    assert "members page 1 of 100" in group
    assert 'id="summary-m-0007"' in group
    assert "v1: 7, 10007" in group  # its shards as ranges, from the page's slots
    filtered = html["group, filtered"]
    assert f"Members (100 of {MEMBERS})" in filtered  # m-0000 … m-0099, filtered in SQL
    assert filtered.count('<tr id="summary-m-00') == 100
    assert f"Members (0 of {MEMBERS})" in html["group, none expired"]  # the session is an hour
    matrix = html["matrix"]
    assert matrix.count('<tr id="shard-') == 100
    assert "shards page 1 of 164" in matrix
    assert matrix.count('<a class="t ') == 100  # 16,384 shards: the grid shows a page's tiles
    assert 'id="shard-grid-paged"' in matrix
    one = html["matrix, one member"]
    assert one.count('<tr id="shard-') == 2
    assert one.count('<a class="t ') == 2
