"""§11 from the admin (issue 24.5): the pause and resume actions go through the service, record
who, and are offered only to staff who may change groups. And 24.2: gunicorn's control socket is
off unless GUNICORN_CONTROL_SOCKET names one for that master."""
from __future__ import annotations

import os
import re
import sys

import pytest
from django.test import Client

from groups.models import Event, Group
from tests import spawn

from .conftest import ROOT, GroupFixture
from .test_admin import messages_of, root, viewer  # noqa: F401 - fixtures

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def test_s11_admin_pause_and_resume_actions(orders: GroupFixture, root: Client, viewer: Client):  # noqa: F811
    g = Group.objects.get(name=orders.group)
    listing = root.get("/admin/groups/group/").content.decode()
    assert "pause_action" in listing
    assert "resume_action" in listing
    assert "pause_action" not in viewer.get("/admin/groups/group/").content.decode()
    viewer.post("/admin/groups/group/", {"action": "pause_action", "_selected_action": [g.pk]})
    g.refresh_from_db()
    assert g.paused_at is None  # not offered, not run
    r = root.post("/admin/groups/group/", {"action": "pause_action", "_selected_action": [g.pk]}, follow=True)
    assert any(m == f"paused: {orders.group}" for m in messages_of(r)), messages_of(r)
    g.refresh_from_db()
    assert g.paused_at is not None
    assert g.paused_by == "root"
    r = root.post("/admin/groups/group/", {"action": "pause_action", "_selected_action": [g.pk]}, follow=True)
    assert any("already paused" in m for m in messages_of(r)), messages_of(r)
    r = root.post("/admin/groups/group/", {"action": "resume_action", "_selected_action": [g.pk]}, follow=True)
    assert any(m == f"resumed: {orders.group}" for m in messages_of(r)), messages_of(r)
    g.refresh_from_db()
    assert g.paused_at is None
    assert list(Event.objects.filter(group=g, kind__in=["paused", "resumed"]).order_by("id")
                .values_list("kind", "actor")) == [("paused", "root"), ("resumed", "root")]


def _gunicorn_config(**env: str) -> str:
    e = {**os.environ, "SECRET_KEY": "k" * 50, **env}
    if "GUNICORN_CONTROL_SOCKET" not in env:
        e.pop("GUNICORN_CONTROL_SOCKET", None)
    done = spawn.run([sys.executable, "-m", "gunicorn", "-c", "coordinator_project/gunicorn_conf.py",
                           "--print-config", "coordinator_project.wsgi"], cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_i24_2_gunicorn_control_socket_is_off_unless_named_per_master():
    config = _gunicorn_config()
    assert re.search(r"^control_socket_disable\s+= True$", config, re.M), config
    config = _gunicorn_config(GUNICORN_CONTROL_SOCKET="/run/rsc/web-1.ctl")
    assert re.search(r"^control_socket\s+= /run/rsc/web-1.ctl$", config, re.M)
    assert re.search(r"^control_socket_disable\s+= False$", config, re.M)
