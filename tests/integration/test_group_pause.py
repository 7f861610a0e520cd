"""§11 group pause through the shell: the service, the steady path, HTTP, the command, describe."""
from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from assignments import fastpath, services
from assignments.snapshot_cache import forget_snapshots
from coordination.model import HeartbeatRequest
from groups.describe import describe_group
from groups.models import Event, Group
from groups.services import create_api_key, create_group, pause_group, resume_group

from .conftest import make_group

pytestmark = [pytest.mark.needs_postgres,
              pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def _joined(group: str, member: str = "a") -> HeartbeatRequest:
    now = timezone.now()
    r = services.heartbeat(group, HeartbeatRequest(member_id=member, member_epoch=0), now).response
    return HeartbeatRequest(member_id=member, member_epoch=r.member_epoch or 0, metadata_epoch=1,
                            owned_shards=r.assignment.assigned if r.assignment else ())


def test_s11_steady_path_answers_paused_at_once_after_a_pause_elsewhere(orders):
    """The fast path's freshness check covers the pause: a steady heartbeat answered from this
    process's snapshot right before a pause is answered PAUSED right after it, by the fast path
    (not the locked one), and OK again right after the resume."""
    req = _joined(orders.group)
    now = timezone.now()
    first = fastpath.steady_heartbeat(orders.group, req, now)
    assert first is not None
    assert first.response.status == "OK"
    assert fastpath.steady_heartbeat(orders.group, req, now) is not None  # from the memo
    assert pause_group(orders.group, actor="cli:ops")
    paused = fastpath.steady_heartbeat(orders.group, req, now + timedelta(seconds=1))
    assert paused is not None
    assert paused.response.status == "PAUSED"
    assert paused.response.assignment.assigned == first.response.assignment.assigned
    # The statement path (no snapshot here) says so too.
    forget_snapshots()
    by_statement = fastpath.steady_heartbeat(orders.group, req, now + timedelta(seconds=2))
    assert by_statement is not None
    assert by_statement.response.status == "PAUSED"
    assert resume_group(orders.group, actor="cli:ops")
    again = fastpath.steady_heartbeat(orders.group, req, now + timedelta(seconds=3))
    assert again is not None
    assert again.response.status == "OK"


def test_s11_pause_keeps_every_epoch_and_owner_and_records_who(orders):
    req = _joined(orders.group)
    g = Group.objects.get(name=orders.group)
    epochs = (g.group_epoch, g.assignment_epoch, g.metadata_epoch)
    assert pause_group(orders.group, actor="cli:alice")
    assert not pause_group(orders.group, actor="cli:bob")  # already paused: nothing changes
    g.refresh_from_db()
    assert (g.group_epoch, g.assignment_epoch, g.metadata_epoch) == epochs
    assert g.paused_at is not None
    assert g.paused_by == "cli:alice"
    r = services.heartbeat(orders.group, req).response
    assert r.status == "PAUSED"
    assert r.assignment.assigned == req.owned_shards
    doc = describe_group(orders.group)
    assert doc is not None
    assert doc["paused"] is True
    assert doc["pausedBy"] == "cli:alice"
    assert doc["pausedAt"] == g.paused_at.isoformat()
    assert resume_group(orders.group, actor="admin:root")
    assert not resume_group(orders.group, actor="admin:root")
    kinds = list(Event.objects.filter(group__name=orders.group, kind__in=["paused", "resumed"])
                 .order_by("id").values_list("kind", "actor"))
    assert kinds == [("paused", "cli:alice"), ("resumed", "admin:root")]
    doc = describe_group(orders.group)
    assert doc is not None
    assert doc["paused"] is False
    assert doc["pausedAt"] is None


def test_s11_pause_and_resume_over_http_need_the_stream_admin_key(api, orders):
    def post(action: str, key: str | None, group: str = orders.group):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
        r = api.post(f"/api/v1/groups/{group}/{action}", **headers)
        return r.status_code, r.json()

    assert post("pause", None)[0] == 401
    for key in (orders.key, orders.stream_key):
        status, body = post("pause", key)
        assert (status, body["errorCode"]) == (403, "AUTHORIZATION_FAILED")
        assert "admin key of stream" in body["errorMessage"]
    make_group("other", "g2")
    other_admin = create_api_key(stream="other", scope="admin")
    assert post("pause", other_admin)[0] == 403
    assert post("pause", orders.admin_key, group="nope")[1]["errorCode"] == "GROUP_ID_NOT_FOUND"
    assert post("pause", orders.admin_key, group="bad name!")[0] == 400
    assert not Group.objects.get(name=orders.group).paused_at  # nothing refused changed anything
    status, body = post("pause", orders.admin_key)
    assert status == 200
    assert body["paused"] is True
    assert body["changed"] is True
    assert post("pause", orders.admin_key)[1]["changed"] is False
    actor = Event.objects.get(group__name=orders.group, kind="paused").actor
    assert actor.startswith("api-key:")
    status, body = post("resume", orders.admin_key)
    assert status == 200
    assert body == {"group": orders.group, "paused": False, "changed": True, "pausedAt": None}


def test_s11_pause_group_and_resume_group_commands(orders):
    out = StringIO()
    call_command("pause_group", orders.group, "--actor", "cli:ops", stdout=out)
    assert "paused group g1" in out.getvalue()
    out = StringIO()
    call_command("describe_group", orders.group, stdout=out)
    assert "PAUSED since" in out.getvalue()
    assert "cli:ops" in out.getvalue()
    out = StringIO()
    call_command("pause_group", orders.group, stdout=out)
    assert "already paused" in out.getvalue()
    out = StringIO()
    call_command("resume_group", orders.group, stdout=out)
    assert "resumed group g1" in out.getvalue()
    with pytest.raises(CommandError, match="does not exist"):
        call_command("pause_group", "nope")


def test_s11_a_group_created_after_a_pause_elsewhere_is_not_paused(db):
    make_group()
    pause_group("g1", actor="t")
    create_group("g3", "orders")
    assert Group.objects.get(name="g3").paused_at is None
