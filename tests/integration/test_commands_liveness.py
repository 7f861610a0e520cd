"""Operator commands: fence_member / remove_member (R8) and sweep (L1, L2, §6), on PostgreSQL."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
import redis
from django.core.management import CommandError, call_command
from django.utils import timezone

from groups.models import Event, Group, SweepRun
from groups.resharding import start_reshard
from members.models import Member
from tests import spawn

from .conftest import ROOT, Hb, live_database_url, make_group

pytest_plugins = ["tests.integration.conftest_celery"]  # stream_redis
pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DATABASE_URL=live_database_url())
    return spawn.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_r8_fence_member_command_fences_with_reason(hb: Hb, capsys: pytest.CaptureFixture[str]):
    s, body = hb({"memberId": "a", "memberEpoch": 0})
    epoch = Group.objects.get(name="g1").group_epoch
    call_command("fence_member", "g1", "a", "--reason", "stuck on shard 3", "--actor", "alice")
    assert "fenced member a of group g1" in capsys.readouterr().out
    m = Member.objects.get(member_id="a")
    assert (m.status, m.fenced_reason, m.fenced_by) == ("FENCED", "stuck on shard 3", "alice")
    assert Group.objects.get(name="g1").group_epoch == epoch + 1
    assert not m.owned_shards.exists()
    s, r = hb({"memberId": "a", "memberEpoch": body["memberEpoch"], "metadataEpoch": 1})
    assert s == 409
    assert r["errorCode"] == "FENCED_MEMBER_EPOCH"
    assert "stuck on shard 3" in r["errorMessage"]


def test_r8_remove_member_command_makes_the_next_heartbeat_unknown(hb: Hb, capsys: pytest.CaptureFixture[str]):
    s, body = hb({"memberId": "a", "memberEpoch": 0})
    call_command("remove_member", "g1", "a", "--reason", "decommissioned host")
    assert "removed member a from group g1" in capsys.readouterr().out
    ev = Event.objects.get(kind="left", member_id="a")
    assert ev.detail["reason"] == "decommissioned host"
    assert ev.actor.startswith("cli")
    s, r = hb({"memberId": "a", "memberEpoch": body["memberEpoch"], "metadataEpoch": 1})
    assert s == 409
    assert r["errorCode"] == "UNKNOWN_MEMBER_ID"


@pytest.mark.parametrize("command", ["fence_member", "remove_member"])
def test_r8_fence_and_remove_refuse_unknown_group_or_member(hb: Hb, command: str):
    hb({"memberId": "a", "memberEpoch": 0})
    hb({"memberId": "gone", "memberEpoch": 0})
    hb({"memberId": "gone", "memberEpoch": -1})
    before = (Group.objects.get(name="g1").group_epoch, list(Member.objects.values_list("member_id", "status")))
    with pytest.raises(CommandError, match="group 'nope' does not exist"):
        call_command(command, "nope", "a")
    with pytest.raises(CommandError, match="group 'g1' has no live member 'zz'"):
        call_command(command, "g1", "zz")
    with pytest.raises(CommandError, match="group 'g1' has no live member 'gone'"):
        call_command(command, "g1", "gone")  # already left
    assert (Group.objects.get(name="g1").group_epoch, list(Member.objects.values_list("member_id", "status"))) == before


def test_r8_fence_member_exits_non_zero_for_unknown_group_and_member(hb: Hb):
    hb({"memberId": "a", "memberEpoch": 0})
    proc = manage("fence_member", "nope", "a", "--reason", "x")
    assert proc.returncode != 0
    assert "group 'nope' does not exist" in proc.stderr
    proc = manage("remove_member", "g1", "zz")
    assert proc.returncode != 0
    assert "group 'g1' has no live member 'zz'" in proc.stderr
    assert Member.objects.get(member_id="a").status == "STABLE"


def test_l1_sweep_command_prints_what_it_did(api, capsys: pytest.CaptureFixture[str], stream_redis: redis.Redis):
    fx = make_group(stream="rs-cmd", group="rs-cmd-g", shards=2, session_timeout_ms=5000)
    hb = Hb(api, fx)
    hb({"memberId": "a", "memberEpoch": 0})
    call_command("sweep")
    assert capsys.readouterr().out.splitlines() == [
        "liveness: nothing to expire or fence", "resharding: no stream is resharding",
    ]
    start_reshard("rs-cmd", 4)
    call_command("sweep")
    out = capsys.readouterr().out
    assert "resharding rs-cmd: sealed v1 (2 seal markers); v1 still draining in rs-cmd-g (2 shards); now DRAINING" in out

    # a falls silent: the sweep (with the real clock) expires it once the session times out.
    Member.objects.filter(member_id="a").update(last_heartbeat_at=timezone.now() - timedelta(seconds=6))
    call_command("sweep", "--json")
    result = json.loads(capsys.readouterr().out)
    assert result["liveness"] == {"expired": {"rs-cmd-g": ["a"]}, "fenced": {}}
    # Nobody holds v1 now, but nobody drained it for rs-cmd-g either: still waiting.
    assert result["resharding"] == {"rs-cmd": {"waiting": {"1": {"rs-cmd-g": 2}}}}
    assert SweepRun.objects.get(name="liveness").last_result == result["liveness"]
