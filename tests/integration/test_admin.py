"""Django admin on PostgreSQL: every page, every action, permissions, read-only epochs.

Members are driven through the real heartbeat endpoint; the admin's writes must go through
the services (update_group_config, fence_member, remove_member, start_reshard), which the
assertions check by their effects: epochs, events, and the next heartbeat's answer.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from assignments import services as hb_services
from assignments.matrix import CellKind, Liveness, build_matrix, liveness
from assignments.models import ShardAssignment
from coordination.model import HeartbeatRequest
from groups.models import Event, Group, ShardVersion, Stream, StreamState, SweepRun
from groups.services import ServiceError, update_group_config
from members.models import Member
from tests.redis_keys import delete_keys

from .conftest import GroupFixture, Hb, make_group

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


# --- users -----------------------------------------------------------------------------------
def _user(name: str, *, staff: bool = True, superuser: bool = False, perms: tuple[str, ...] = ()) -> User:
    # No password: the tests log in with force_login, and hashing one costs ~0.25 s of CPU.
    user = User.objects.create_user(name, password=None, is_staff=staff, is_superuser=superuser)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return user


VIEW_PERMS = (
    "groups.view_stream", "groups.view_group", "groups.view_event", "groups.view_sweeprun",
    "members.view_member", "assignments.view_shardassignment",
)


def _client(user: User) -> Client:
    c = Client()
    c.force_login(user)
    return c


@pytest.fixture
def root() -> Client:
    return _client(_user("root", superuser=True))


@pytest.fixture
def viewer() -> Client:
    """Staff who may look at everything but fence nobody and reshard nothing."""
    return _client(_user("viewer", perms=VIEW_PERMS))


@pytest.fixture
def operator() -> Client:
    return _client(_user("operator", perms=(*VIEW_PERMS, "members.fence_member")))


# --- members over HTTP -----------------------------------------------------------------------
class Beat:
    """A well-behaved member (C1–C5) over the heartbeat endpoint."""

    def __init__(self, hb: Hb, member_id: str, client_id: str = "") -> None:
        self.hb, self.member_id, self.client_id = hb, member_id, client_id
        self.epoch, self.metadata_epoch = 0, 1
        self.owned: list[str] = []
        self.to_revoke: list[str] = []

    def __call__(self, revoke: bool = True, drained: tuple[str, ...] = ()) -> dict[str, Any]:
        body: dict[str, Any] = {"memberId": self.member_id, "memberEpoch": self.epoch}
        if self.epoch == 0:
            body["clientId"] = self.client_id
        else:
            body.update(metadataEpoch=self.metadata_epoch, ownedShards=self.owned,
                        drainedShards=list(drained))
            if revoke:
                body["revokingShards"] = [{"shard": s, "state": "REVOKED"} for s in self.to_revoke]
        status, out = self.hb(body)
        assert status == 200, out
        self.epoch, self.metadata_epoch = out["memberEpoch"], out["metadata"]["metadataEpoch"]
        a = out["assignment"]
        self.to_revoke = [] if revoke else self.to_revoke
        self.to_revoke = sorted(set(self.to_revoke) | set(a["revokingShards"]))
        self.owned = [s for s in self.owned if s in a["assignedShards"]]
        if out["status"] == "OK":
            self.owned = sorted(set(self.owned) | set(a["assignedShards"]))
        return out


def converge(*members: Beat, rounds: int = 4) -> None:
    for _ in range(rounds):
        for m in members:
            m()


def inline_management(group: Group) -> dict[str, Any]:
    """The view-only member inline's management form, as the browser posts it."""
    live = list(Member.objects.filter(group=group, status__in=["STABLE", "PENDING", "REVOKING"]).order_by("member_id"))
    data: dict[str, Any] = {
        "members-TOTAL_FORMS": len(live), "members-INITIAL_FORMS": len(live),
        "members-MIN_NUM_FORMS": 0, "members-MAX_NUM_FORMS": 0,
    }
    for i, m in enumerate(live):
        data[f"members-{i}-id"] = m.pk
        data[f"members-{i}-group"] = group.pk
    return data


def group_form(group: Group, **changes: Any) -> dict[str, Any]:
    data = {
        "heartbeat_interval_ms": group.heartbeat_interval_ms,
        "session_timeout_ms": group.session_timeout_ms,
        "rebalance_timeout_ms": group.rebalance_timeout_ms,
        "max_members": group.max_members,
        "start_position": group.start_position,
        **inline_management(group),
        **changes,
    }
    return data


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def admin_urls(fx: GroupFixture) -> list[str]:
    group = Group.objects.get(name=fx.group)
    stream = Stream.objects.get(name=fx.stream)
    member = Member.objects.filter(group=group).first()
    slot = ShardAssignment.objects.filter(group=group).first()
    event = Event.objects.first()
    urls = [
        "/admin/",
        "/admin/groups/stream/", f"/admin/groups/stream/{stream.pk}/change/",
        "/admin/groups/group/", f"/admin/groups/group/{group.pk}/change/", "/admin/groups/group/add/",
        f"/admin/groups/group/{group.pk}/matrix/",
        "/admin/groups/event/", "/admin/groups/sweeprun/",
        "/admin/members/member/", "/admin/assignments/shardassignment/",
        f"/admin/assignments/shardassignment/{slot.pk}/change/",
    ]
    if member is not None:
        urls.append(f"/admin/members/member/{member.pk}/change/")
    if event is not None:
        urls.append(f"/admin/groups/event/{event.pk}/change/")
    return urls


# --- access ----------------------------------------------------------------------------------
def test_anonymous_and_non_staff_are_refused_on_every_page(hb: Hb, orders: GroupFixture):
    Beat(hb, "a")()
    outsider = _client(_user("outsider", staff=False))
    for url in admin_urls(orders):
        for client in (Client(), outsider):
            r = client.get(url)
            assert r.status_code == 302, url
            assert "/admin/login/" in r["Location"], url


def test_every_page_renders_for_staff(hb: Hb, orders: GroupFixture, root: Client, viewer: Client):
    a, b = Beat(hb, "a", "host-1/pid-1"), Beat(hb, "b", "host-2/pid-2")
    converge(a, b)
    for client in (root, viewer):
        for url in admin_urls(orders):
            if client is viewer and url.endswith("/add/"):
                continue
            r = client.get(url)
            assert r.status_code == 200, (url, r.status_code)
    # Filters and search on the members page.
    g = Group.objects.get(name="g1")
    for query in (f"?group__id__exact={g.pk}", "?status__exact=STABLE", "?liveness=alive", "?liveness=late",
                  "?liveness=expired", "?q=host-2", "?q=a"):
        r = root.get("/admin/members/member/" + query)
        assert r.status_code == 200, query
    assert "host-2/pid-2" in root.get("/admin/members/member/?q=host-2").content.decode()
    assert ">a<" not in root.get("/admin/members/member/?q=host-2").content.decode()
    for query in ("?kind__exact=joined", f"?group__id__exact={g.pk}", "?q=a"):
        assert root.get("/admin/groups/event/" + query).status_code == 200


def test_staff_without_view_permission_is_forbidden(hb: Hb, orders: GroupFixture):
    bare = _client(_user("bare"))
    g = Group.objects.get(name="g1")
    assert bare.get("/admin/groups/group/").status_code == 403
    assert bare.get(f"/admin/groups/group/{g.pk}/matrix/").status_code == 403
    assert bare.get("/admin/members/member/").status_code == 403


def test_service_written_models_cannot_be_added_changed_or_deleted(hb: Hb, orders: GroupFixture, root: Client):
    Beat(hb, "a")()
    member = Member.objects.get(member_id="a")
    slot = ShardAssignment.objects.filter(owner=member).first()
    event = Event.objects.first()
    stream = Stream.objects.get(name="orders")
    for model in ("groups/stream", "groups/event", "groups/sweeprun", "members/member", "assignments/shardassignment"):
        assert root.get(f"/admin/{model}/add/").status_code == 403, model
    for url in (f"/admin/members/member/{member.pk}/change/", f"/admin/groups/event/{event.pk}/change/",
                f"/admin/assignments/shardassignment/{slot.pk}/change/", f"/admin/groups/stream/{stream.pk}/change/"):
        r = root.post(url, {"status": "FENCED", "grant_epoch": 99, "owner": "", "member_epoch": 42, "state": "SEALING"})
        assert r.status_code == 403, url
        assert "<input type=\"submit\"" not in root.get(url).content.decode()
    for url in (f"/admin/members/member/{member.pk}/delete/", f"/admin/groups/group/{member.group_id}/delete/"):
        assert root.get(url).status_code == 403
    slot.refresh_from_db()
    member.refresh_from_db()
    assert (slot.owner_id, member.status, member.member_epoch) == (member.pk, "STABLE", 2)
    # No bulk delete on any of them.
    for model in ("members/member", "groups/event", "assignments/shardassignment", "groups/group"):
        assert "delete_selected" not in root.get(f"/admin/{model}/").content.decode()


# --- groups: configuration ---------------------------------------------------------------------
def test_group_config_edit_goes_through_the_service(hb: Hb, orders: GroupFixture, root: Client):
    a = Beat(hb, "a")
    converge(a)
    g = Group.objects.get(name="g1")
    page = root.get(f"/admin/groups/group/{g.pk}/change/").content.decode()
    for epoch in ("group_epoch", "assignment_epoch", "metadata_epoch"):
        assert f'name="{epoch}"' not in page  # read-only: shown, never an input
    assert 'name="heartbeat_interval_ms"' in page
    assert "Assignment matrix" in page
    # The member summary: live members, view-only, with their liveness.
    assert 'id="summary-a"' in page
    assert "s ago · alive" in page
    assert 'name="members-0-member_id"' not in page

    before = (g.group_epoch, g.assignment_epoch, g.metadata_epoch)
    r = root.post(f"/admin/groups/group/{g.pk}/change/",
                  group_form(g, heartbeat_interval_ms=2000, group_epoch=99, metadata_epoch=99, name="evil"))
    assert r.status_code == 302, r.content.decode()[:2000]
    g.refresh_from_db()
    assert g.heartbeat_interval_ms == 2000
    assert g.name == "g1"
    assert (g.group_epoch, g.assignment_epoch, g.metadata_epoch) == (before[0], before[1], before[2] + 1)
    ev = Event.objects.get(kind="config_changed")
    assert ev.actor == "root"
    assert ev.group == g
    assert ev.detail == {"heartbeat_interval_ms": {"from": 3000, "to": 2000}, "metadataEpoch": before[2] + 1}
    # R7: the member's metadata is behind now; it gets SYNC_METADATA with the new interval.
    _status, out = hb({"memberId": "a", "memberEpoch": a.epoch, "metadataEpoch": a.metadata_epoch,
                      "ownedShards": a.owned})
    assert out["status"] == "SYNC_METADATA"
    assert out["metadata"]["heartbeatIntervalMs"] == 2000
    assert out["metadata"]["metadataEpoch"] == before[2] + 1

    # Saving without changes is a no-op: no epoch bump, no event.
    r = root.post(f"/admin/groups/group/{g.pk}/change/", group_form(g))
    assert r.status_code == 302
    g.refresh_from_db()
    assert g.metadata_epoch == before[2] + 1
    assert Event.objects.filter(kind="config_changed").count() == 1


def test_group_config_invalid_values_are_refused_on_the_form(hb: Hb, orders: GroupFixture, root: Client):
    g = Group.objects.get(name="g1")
    for bad, text in (
        ({"session_timeout_ms": 2000}, "session timeout must be longer than the heartbeat interval"),
        ({"heartbeat_interval_ms": 5}, "heartbeat interval (ms) must be a whole number from 10"),
        ({"max_members": 0}, "max members must be a whole number from 1"),
        ({"start_position": "middle"}, "Select a valid choice"),
    ):
        r = root.post(f"/admin/groups/group/{g.pk}/change/", group_form(g, **bad))
        assert r.status_code == 200, bad
        assert text in r.content.decode(), bad
    g.refresh_from_db()
    assert (g.metadata_epoch, g.session_timeout_ms) == (1, 30_000)
    assert not Event.objects.filter(kind="config_changed").exists()


def test_update_group_config_service_rules(orders: GroupFixture):
    with pytest.raises(ServiceError, match="not a group setting: group_epoch, name"):
        update_group_config("g1", actor="t", group_epoch=7, name="x")
    with pytest.raises(ServiceError, match="group 'nope' does not exist"):
        update_group_config("nope", actor="t", max_members=3)
    # Validated against the merged settings: this interval alone is fine, not with a 30 s session.
    with pytest.raises(ServiceError, match="session timeout must be longer"):
        update_group_config("g1", actor="t", heartbeat_interval_ms=30_000)
    g = update_group_config("g1", actor="t", max_members=3, start_position="latest")
    assert (g.max_members, g.start_position, g.metadata_epoch) == (3, "latest", 2)
    assert update_group_config("g1", actor="t", max_members=3).metadata_epoch == 2  # no-op
    assert Event.objects.filter(kind="config_changed").count() == 1


def test_group_add_through_admin_uses_create_group(orders: GroupFixture, root: Client):
    stream = Stream.objects.get(name="orders")
    r = root.post("/admin/groups/group/add/", {
        "name": "g2", "stream": stream.pk, "heartbeat_interval_ms": 1000, "session_timeout_ms": 10_000,
        "rebalance_timeout_ms": 20_000, "max_members": 5, "start_position": "latest",
        "members-TOTAL_FORMS": 0, "members-INITIAL_FORMS": 0,
    })
    assert r.status_code == 302, r.content.decode()[:3000]
    g = Group.objects.get(name="g2")
    assert (g.group_epoch, g.metadata_epoch, g.max_members) == (1, 1, 5)
    assert ShardAssignment.objects.filter(group=g).count() == 4  # create_group made the slots
    r = root.post("/admin/groups/group/add/", {
        "name": "g2", "stream": stream.pk, "heartbeat_interval_ms": 1000, "session_timeout_ms": 500,
        "rebalance_timeout_ms": 20_000, "max_members": 5, "start_position": "latest",
        "members-TOTAL_FORMS": 0, "members-INITIAL_FORMS": 0,
    })
    assert r.status_code == 200
    page = r.content.decode()
    assert "Consumer group with this Name already exists" in page
    assert "session timeout must be longer" in page


# --- groups: assignment matrix -------------------------------------------------------------------
def test_matrix_shows_granted_pending_revoking_and_grant_epochs(hb: Hb, orders: GroupFixture, root: Client):
    a = Beat(hb, "a", "host-a")
    a()
    a()  # STABLE with all 4 shards at epoch 2
    b = Beat(hb, "b")
    b()  # joins: target split 2/2, b's shards still held by a → pending
    a(revoke=False)  # a learns: REVOKE_PENDING, 2 shards revoking
    g = Group.objects.get(name="g1")
    m = build_matrix(g, timezone.now())
    assert [r.member_id for r in m.rows] == ["a", "b"]
    assert [c.shard_id for c in m.columns] == [f"orders:1:{i}" for i in range(4)]
    ra, rb = m.rows
    kinds_a = [c.kind for c in ra.cells]
    assert sorted(kinds_a) == sorted([CellKind.GRANTED] * 2 + [CellKind.REVOKING] * 2)
    for ca, cb in zip(ra.cells, rb.cells, strict=True):
        # R9 in the picture: where a revokes, b waits; nobody else holds it.
        assert (ca.kind == CellKind.REVOKING) == (cb.kind == CellKind.PENDING)
        assert cb.target == (cb.kind == CellKind.PENDING)
        assert ca.grant_epoch == 2
        assert cb.grant_epoch is None
    assert (ra.status, rb.status, ra.revoking, rb.pending) == ("REVOKING", "PENDING", 2, 2)
    assert m.exclusive
    assert m.phase == "RECONCILING"
    assert ra.liveness == Liveness.ALIVE
    page = root.get(f"/admin/groups/group/{g.pk}/matrix/").content.decode()
    for text in ("granted @2", "revoking @2", "pending", "host-a", "RECONCILING", 'id="member-a"', "joined"):
        assert text in page, text

    converge(a, b)  # a reports REVOKED; b is granted at its new epoch
    m = build_matrix(g, timezone.now())
    ra, rb = m.rows
    assert {c.kind for c in ra.cells + rb.cells} == {CellKind.GRANTED, CellKind.EMPTY}
    assert all((ca.kind == CellKind.GRANTED) != (cb.kind == CellKind.GRANTED) for ca, cb in zip(ra.cells, rb.cells, strict=True))
    assert sorted(c.grant_epoch for c in rb.cells if c.kind == CellKind.GRANTED) == [3, 3]
    assert m.phase == "STABLE"
    assert m.totals["granted"] == 4
    assert m.totals["pending"] == 0
    assert "granted @3" in root.get(f"/admin/groups/group/{g.pk}/matrix/?refresh=5").content.decode()


@pytest.fixture
def stream_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.STREAM_REDIS_URL, decode_responses=True)
    yield client
    delete_keys(client, "rsc*:{adm-*")
    client.close()


def test_matrix_and_stream_page_show_resharding(api: Any, root: Client, stream_redis: redis.Redis):
    from groups.resharding import start_reshard
    from groups.sweeps import run_all_sweeps

    fx = make_group("adm-rs", "adm-g", shards=2)
    hb = Hb(api, fx)
    a = Beat(hb, "a")
    converge(a)
    start_reshard("adm-rs", 4, actor="test")
    run_all_sweeps()  # PREPARING → SEALING → DRAINING: v1 sealed
    assert Stream.objects.get(name="adm-rs").state == StreamState.DRAINING
    a()  # SYNC_METADATA
    a()  # OK again on current metadata
    a(drained=("adm-rs:1:0",))  # v1:0 read to the end
    g = Group.objects.get(name="adm-g")
    m = build_matrix(g, timezone.now())
    status = {c.shard_id: c.status for c in m.columns}
    assert status["adm-rs:1:0"] == "drained"
    assert status["adm-rs:1:1"] == "sealed"
    # Children of the drained parent only: 2:0 and 2:1 have parent 1:0 (2 → 4 splits).
    assert status["adm-rs:2:0"] == "assigned"
    assert status["adm-rs:2:3"] == "waiting for parents"
    assert m.versions == ((1, 2, True), (2, 4, False))
    page = root.get(f"/admin/groups/group/{g.pk}/matrix/").content.decode()
    assert "v1 (sealed)" in page
    assert "drained" in page
    assert "waiting for parents" in page
    stream = Stream.objects.get(name="adm-rs")
    page = root.get(f"/admin/groups/stream/{stream.pk}/change/").content.decode()
    assert "Draining" in page
    assert "<td>adm-g</td><td>v1</td><td>SEALED</td><td>1 / 2</td>" in page
    listing = root.get("/admin/groups/stream/").content.decode()
    assert "adm-g v1: 1/2" in listing
    assert "v1 (2, SEALED) → v2 (4, ACTIVE)" in listing


def test_reshard_action_asks_for_the_count_and_calls_start_reshard(orders: GroupFixture, root: Client,
                                                                  viewer: Client):
    stream = Stream.objects.get(name="orders")
    assert "start_reshard_action" in root.get("/admin/groups/stream/").content.decode()
    assert "start_reshard_action" not in viewer.get("/admin/groups/stream/").content.decode()
    r = viewer.post("/admin/groups/stream/", {"action": "start_reshard_action", "_selected_action": [stream.pk],
                                              "apply": "1", "shards": 8})
    assert ShardVersion.objects.filter(stream=stream).count() == 1  # not offered, not run
    r = root.post("/admin/groups/stream/", {"action": "start_reshard_action", "_selected_action": [stream.pk]})
    assert r.status_code == 200
    assert "New shard count" in r.content.decode()
    assert "with 4 shards" in r.content.decode()
    r = root.post("/admin/groups/stream/", {"action": "start_reshard_action", "_selected_action": [stream.pk],
                                            "apply": "1", "shards": 4}, follow=True)
    assert any("refused" in m and "already has 4 shards" in m for m in messages_of(r))
    r = root.post("/admin/groups/stream/", {"action": "start_reshard_action", "_selected_action": [stream.pk],
                                            "apply": "1", "shards": 8}, follow=True)
    assert any("version 2 with 8 shards" in m for m in messages_of(r)), messages_of(r)
    stream.refresh_from_db()
    assert (stream.state, stream.write_version) == ("PREPARING", 2)
    assert Event.objects.get(kind="reshard_started").actor == "root"
    r = root.post("/admin/groups/stream/", {"action": "start_reshard_action", "_selected_action": [stream.pk],
                                            "apply": "1", "shards": 2}, follow=True)
    assert any("already resharding" in m for m in messages_of(r))


# --- members -----------------------------------------------------------------------------------
def test_member_list_shows_liveness_at_a_glance(orders: GroupFixture, root: Client):
    now = timezone.now()
    # Joins at chosen times, through the core (interval 3 s, session 30 s).
    for mid, ago in (("fresh", 1), ("late", 7), ("gone", 40)):
        hb_services.heartbeat("g1", HeartbeatRequest(member_id=mid, member_epoch=0), now - timedelta(seconds=ago))
    page = root.get("/admin/members/member/").content.decode()
    assert re.search(r"rsc-alive\">\d+\.\d s · alive", page)
    assert "rsc-late" in page
    assert "rsc-expired" in page
    for value, expected in (("alive", {"fresh"}), ("late", {"late"}), ("expired", {"gone"})):
        r = root.get(f"/admin/members/member/?liveness={value}")
        assert {m.member_id for m in r.context["cl"].result_list} == expected, value
    assert liveness(None, now, 3000, 30_000) == (None, Liveness.UNKNOWN)
    assert liveness(now - timedelta(seconds=6), now, 3000, 30_000)[1] == Liveness.ALIVE  # exactly 2 intervals


def _post_action(client: Client, action: str, members: list[Member], **extra: Any) -> Any:
    return client.post("/admin/members/member/",
                       {"action": action, "_selected_action": [m.pk for m in members], **extra}, follow=True)


def test_fence_requires_the_fence_member_permission(hb: Hb, orders: GroupFixture, viewer: Client):
    Beat(hb, "a")()
    a = Member.objects.get(member_id="a")
    page = viewer.get("/admin/members/member/").content.decode()
    assert "fence_members" not in page
    assert "remove_members" not in page
    for action in ("fence_members", "remove_members"):
        r = _post_action(viewer, action, [a], post="yes")
        # The viewer has no actions at all: the POST is just the list again, nothing runs.
        assert r.status_code == 200
        assert 'name="action"' not in r.content.decode()
        assert "confirm-members" not in r.content.decode()
    a.refresh_from_db()
    assert a.status == "STABLE"
    assert not Event.objects.filter(kind__in=["fenced", "left"]).exists()


def test_fence_action_confirms_then_fences_through_the_service(hb: Hb, orders: GroupFixture, operator: Client):
    a, b = Beat(hb, "a"), Beat(hb, "b")
    converge(a, b)
    hb({"memberId": "c", "memberEpoch": 0})
    hb({"memberId": "c", "memberEpoch": -1})  # c left: a tombstone
    rows = list(Member.objects.filter(member_id__in=["a", "c"]).order_by("member_id"))
    epoch_before = Group.objects.get(name="g1").group_epoch

    page = operator.get("/admin/members/member/").content.decode()
    assert "fence_members" in page
    assert "remove_members" in page
    r = _post_action(operator, "fence_members", rows)
    page = r.content.decode()
    assert "confirm-members" in page
    assert "Yes, fence 2 members" in page
    assert "not live: will be skipped" in page
    assert Member.objects.get(member_id="a").status == "STABLE"  # nothing yet

    r = _post_action(operator, "fence_members", rows, post="yes", reason="stuck consumer")
    msgs = messages_of(r)
    assert "Fenced 1 member: g1/a." in msgs
    assert "Skipped 1 not live: g1/c." in msgs
    m = Member.objects.get(member_id="a")
    assert (m.status, m.fenced_by, m.fenced_reason) == ("FENCED", "operator", "stuck consumer")
    assert Group.objects.get(name="g1").group_epoch == epoch_before + 1  # one bump (R8)
    assert not ShardAssignment.objects.filter(owner=m).exists()
    ev = Event.objects.get(kind="fenced")
    assert (ev.member_id, ev.actor, ev.detail["reason"]) == ("a", "operator", "stuck consumer")
    # R8: the fenced member's next heartbeat is FENCED_MEMBER_EPOCH, naming the reason.
    status, out = hb({"memberId": "a", "memberEpoch": a.epoch, "metadataEpoch": 1, "ownedShards": a.owned})
    assert status == 409
    assert out["errorCode"] == "FENCED_MEMBER_EPOCH"
    assert "stuck consumer" in out["errorMessage"]
    # The list shows the fencing status and reason.
    page = operator.get("/admin/members/member/?status__exact=FENCED").content.decode()
    assert "fenced by operator: stuck consumer" in page


def test_remove_action_makes_the_next_heartbeat_unknown(hb: Hb, orders: GroupFixture, operator: Client):
    a = Beat(hb, "a")
    converge(a)
    r = _post_action(operator, "remove_members", [Member.objects.get(member_id="a")])
    assert "Yes, remove 1 member" in r.content.decode()
    r = _post_action(operator, "remove_members", [Member.objects.get(member_id="a")], post="yes")
    assert "Removed 1 member: g1/a." in messages_of(r)
    m = Member.objects.get(member_id="a")
    assert (m.status, m.fenced_by, m.fenced_reason) == ("LEFT", "operator", "removed by operator")
    status, out = hb({"memberId": "a", "memberEpoch": a.epoch, "metadataEpoch": 1})
    assert status == 409
    assert out["errorCode"] == "UNKNOWN_MEMBER_ID"


def test_member_page_lists_held_shards_with_grant_epochs(hb: Hb, orders: GroupFixture, root: Client):
    converge(Beat(hb, "a"))
    m = Member.objects.get(member_id="a")
    page = root.get(f"/admin/members/member/{m.pk}/change/").content.decode()
    assert "orders:1:0@2, orders:1:1@2, orders:1:2@2, orders:1:3@2" in page
    assert 'name="member_epoch"' not in page


# --- event log -----------------------------------------------------------------------------------
def test_event_log_shows_joins_rebalances_and_fences(hb: Hb, orders: GroupFixture, root: Client):
    a, b = Beat(hb, "a"), Beat(hb, "b")
    converge(a, b)
    from members.services import fence_member

    fence_member("g1", "b", reason="bad disk", actor="alice")
    kinds = list(Event.objects.order_by("id").values_list("kind", flat=True))
    # The core emits the rebalance (epoch bump) before the join it was caused by.
    assert kinds[:4] == ["rebalanced", "joined", "rebalanced", "joined"]
    assert kinds[-2:] == ["fenced", "rebalanced"]
    page = root.get("/admin/groups/event/?kind__exact=fenced").content.decode()
    assert "bad disk" in page
    assert "alice" in page
    r = root.get("/admin/groups/event/?kind__exact=rebalanced")
    assert {e.kind for e in r.context["cl"].result_list} == {"rebalanced"}
    assert "assignmentEpoch=4" in r.content.decode()


def test_heartbeats_that_change_nothing_write_no_event(hb: Hb, orders: GroupFixture):
    a, b = Beat(hb, "a"), Beat(hb, "b")
    converge(a, b)
    assert {m.status for m in Member.objects.all()} == {"STABLE"}
    count = Event.objects.count()
    for _ in range(5):
        a()  # steady: the lock-free fast path
        # Not eligible for the fast path (a REVOKED duplicate): the locked path through the core.
        status, out = hb({"memberId": "b", "memberEpoch": b.epoch, "metadataEpoch": 1, "ownedShards": b.owned,
                          "revokingShards": [{"shard": a.owned[0], "state": "REVOKED"}]})
        assert status == 200
        assert out["status"] == "OK"
    assert Event.objects.count() == count
    assert {m.status for m in Member.objects.all()} == {"STABLE"}


def test_sweep_runs_page_shows_lag(orders: GroupFixture, root: Client):
    from groups.sweeps import run_all_sweeps

    run_all_sweeps()
    page = root.get("/admin/groups/sweeprun/").content.decode()
    assert "liveness" in page
    assert "resharding" in page
    assert SweepRun.objects.filter(last_finished_at__isnull=False).count() == 2
