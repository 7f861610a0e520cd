"""Admin pages of issue 10: the index dashboard, lag/pending/DLQ on the group page and the
matrix (filters, colour scale), the reshard button and panel, the reset-position action with
confirmation, labels that cannot be confused, booleans that are not red crosses."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from groups.models import Event, Group, Stream
from groups.sweeps import run_all_sweeps

from .conftest import GroupFixture, Hb, group_on_fresh_stream
from .test_admin import Beat, converge, messages_of

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


@pytest.fixture
def root() -> Client:
    c = Client()
    c.force_login(User.objects.create_superuser("root", password=None))
    return c


@pytest.fixture
def fx() -> Iterator[GroupFixture]:
    with group_on_fresh_stream("op", "g-{stream}") as fixture:
        yield fixture


def _backlog(fx: GroupFixture) -> None:
    """Shard 0: 12 entries, 2 delivered (pending); 1 DLQ entry. Shard 2: 3, never read."""
    r = redis.Redis.from_url(settings.STREAM_REDIS_URL, decode_responses=True)
    k0, k2 = fx.keys(f"{fx.stream}:1:0"), fx.keys(f"{fx.stream}:1:2")
    for i in range(12):
        r.xadd(k0.stream, {"key": f"k{i}"})
    for i in range(3):
        r.xadd(k2.stream, {"key": f"j{i}"})
    fx.drop_consumer_groups(r)  # shards nobody read have none
    r.xgroup_create(k0.stream, fx.group, id="0")
    r.xreadgroup(fx.group, "c", {k0.stream: ">"}, count=2)
    r.xadd(k0.dlq(fx.group), {"dlq:error": "ValueError: poison", "dlq:deliveries": "5", "dlq:id": "1-0",
                              "dlq:shard": f"{fx.stream}:1:0", "dlq:group": fx.group, "key": "bad-key", "n": "7"})
    r.close()


def test_index_dashboard_shows_streams_groups_backlog_and_sweeps(api: Any, fx: GroupFixture, root: Client):
    converge(Beat(Hb(api, fx), "a"))
    _backlog(fx)
    run_all_sweeps()
    page = root.get("/admin/").content.decode()
    assert 'id="rsc-dashboard"' in page
    assert "Consumer groups" in page
    streams = page.split('id="dashboard-streams"')[1].split("</table>")[0]
    assert fx.stream in streams
    assert "STABLE" in streams
    assert "v1 (4, ACTIVE)" in streams
    groups = page.split('id="dashboard-groups"')[1].split("</table>")[0]
    row = groups.split(f">{fx.group}</a>")[1].split("</tr>")[0]
    cells = [c.split(">")[-1] for c in row.split("</td>")[:-1]]
    assert cells[1:6] == [fx.stream, "1", "0", "13", "2"]
    assert "1" in cells[6]
    sweeps = page.split('id="dashboard-sweeps"')[1].split("</table>")[0]
    assert "s ago" in sweeps
    assert "UTC" in sweeps
    # Two "Groups" no more: auth's groups and consumer groups have different labels.
    assert "Streams and consumer groups" in page
    assert ">Consumer groups<" in page
    # i24.8: Django's permission groups are hidden, and no "View site" link leads to a 404.
    assert "/admin/auth/group/" not in page
    assert "View site" not in page


def test_group_page_shows_backlog_member_summary_dlq_entries_and_stream_events(
    api: Any, fx: GroupFixture, root: Client,
):
    converge(Beat(Hb(api, fx), "a", "host-a/pid-1"))
    _backlog(fx)
    g = Group.objects.get(name=fx.group)
    page = root.get(f"/admin/groups/group/{g.pk}/change/").content.decode()
    assert '<strong id="total-lag">13</strong>' in page
    assert '<strong id="total-pending">2</strong>' in page
    assert '<strong id="total-dlq">1</strong>' in page
    summary = page.split('id="summary-a"')[1].split("</tr>")[0]
    assert "host-a/pid-1" in summary
    assert "v1: 0-3" in summary
    assert ">13<" in summary
    dlq = page.split('id="dlq-entries"')[1].split("</table>")[0]
    assert "ValueError: poison" in dlq
    assert "bad-key" in dlq
    assert "n=7" in dlq
    assert "joined" in page.split('id="recent-events"')[1]


def test_matrix_filters_shards_by_member_state_and_lag_with_a_colour_scale(api: Any, fx: GroupFixture, root: Client):
    a, b = Beat(Hb(api, fx), "a"), Beat(Hb(api, fx), "b")
    converge(a, b)
    _backlog(fx)
    g = Group.objects.get(name=fx.group)
    url = f"/admin/groups/group/{g.pk}/matrix/"
    page = root.get(url).content.decode()
    assert page.count('<a class="t ') == 4
    assert 'class="t h1 ' in page
    lagging = root.get(url + "?lagging=1").content.decode()
    assert lagging.count('<tr id="shard-') == 2  # shards 0 and 2 have lag
    owner0 = next(c for c in page.split('<tr id="shard-')[1:] if c.startswith(f"{fx.stream}:1:0"))
    member = "a" if "?member=a" in owner0 else "b"
    mine = root.get(url + f"?member={member}").content.decode()
    assert mine.count('<tr id="shard-') == 2
    assert root.get(url + "?state=unowned").content.decode().count('<tr id="shard-') == 0
    assert root.get(url + "?mq=b").content.decode().count('<tr id="summary-') == 1


def test_reshard_button_on_the_stream_page_and_the_matrix_says_what_it_waits_for(
    api: Any, fx: GroupFixture, root: Client,
):
    a = Beat(Hb(api, fx), "a")
    converge(a)
    stream = Stream.objects.get(name=fx.stream)
    page = root.get(f"/admin/groups/stream/{stream.pk}/change/").content.decode()
    assert 'id="reshard-button"' in page
    form = root.get(f"/admin/groups/stream/{stream.pk}/reshard/").content.decode()
    assert "New shard count" in form
    r = root.post(f"/admin/groups/stream/{stream.pk}/reshard/", {"shards": 8}, follow=True)
    assert any("version 2 with 8 shards" in m for m in messages_of(r))
    g = Group.objects.get(name=fx.group)
    matrix = root.get(f"/admin/groups/group/{g.pk}/matrix/").content.decode()
    panel = matrix.split('id="reshard-status"')[1].split("</div>")[0]
    assert "PREPARING" in panel
    assert "seal markers" in panel
    run_all_sweeps()  # seals v1: the group must drain it
    a()
    a()
    matrix = root.get(f"/admin/groups/group/{g.pk}/matrix/").content.decode()
    panel = matrix.split('id="reshard-status"')[1].split("</div>")[0]
    assert "v1: 4 of 4 sealed shards still to drain (held by a)" in panel
    assert "v2: 8 shards wait for their parents to drain" in panel
    assert 'data-version="2"' in matrix  # the new version's shards are on the grid
    events = root.get(f"/admin/groups/group/{g.pk}/change/").content.decode().split('id="recent-events"')[1]
    assert "reshard_started" in events
    assert "version_sealed" in events
    # Draining all four: one "drained" event for the version, not four.
    a(drained=tuple(f"{fx.stream}:1:{i}" for i in range(4)))
    assert Event.objects.filter(group=g, kind="drained").count() == 1


def test_reset_position_action_shows_the_plan_then_applies_and_is_refused_while_live(
    api: Any, fx: GroupFixture, root: Client,
):
    g = Group.objects.get(name=fx.group)
    base = {"action": "reset_position_action", "_selected_action": [g.pk]}
    page = root.post("/admin/groups/group/", base).content.decode()
    assert 'id="reset-plan-submit"' in page
    page = root.post("/admin/groups/group/", {**base, "to": "latest"}).content.decode()
    assert "would reset group" in page
    assert f"{fx.stream}:1:0: 0-0 → $" in page  # the coordinator made it at 0 with the group
    r = redis.Redis.from_url(settings.STREAM_REDIS_URL, decode_responses=True)
    assert r.xinfo_groups(fx.keys(f"{fx.stream}:1:0").stream)[0]["last-delivered-id"] == "0-0"  # a plan changes nothing
    resp = root.post("/admin/groups/group/", {**base, "to": "latest", "confirm": "yes"}, follow=True)
    assert any(m.startswith(f"reset group {fx.group} to latest on 4 shard(s)") for m in messages_of(resp))
    assert r.xinfo_groups(fx.keys(f"{fx.stream}:1:0").stream)[0]["name"] == fx.group
    assert Event.objects.get(kind="position_reset").actor == "root"
    converge(Beat(Hb(api, fx), "a"))
    resp = root.post("/admin/groups/group/", {**base, "to": "earliest", "confirm": "yes"}, follow=True)
    assert any("refused" in m and "live members" in m for m in messages_of(resp))
    assert Event.objects.filter(kind="position_reset").count() == 1
    r.close()


def test_not_revoking_is_not_a_red_cross(api: Any, fx: GroupFixture, root: Client):
    converge(Beat(Hb(api, fx), "a"))
    page = root.get("/admin/assignments/shardassignment/").content.decode()
    assert "icon-no.svg" not in page
    assert "icon-yes.svg" not in page
