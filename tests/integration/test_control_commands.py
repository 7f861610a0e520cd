"""Issue 24.5: the control commands an operator expects (alter_group, list_members, describe_group
--all/--stream, delete_group leaving a reusable name, fence_member's help)."""
from __future__ import annotations

import json
from io import StringIO

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from groups.models import Event, Group
from groups.services import create_group, create_stream
from tests.redis_keys import delete_keys

from .conftest import Hb, make_group

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_i24_5_alter_group_validates_like_the_admin_and_raises_the_metadata_epoch(api: APIClient):
    fx = make_group()
    hb = Hb(api, fx)
    _s, joined = hb({"memberId": "m1", "memberEpoch": 0})
    text = run("alter_group", "g1", "--session-timeout-ms", "9000", "--start-position", "latest", "--actor", "cli:ops")
    assert text.strip() == "group g1: session_timeout_ms=9000, start_position=latest (metadataEpoch 2)"
    g = Group.objects.get(name="g1")
    assert (g.session_timeout_ms, g.start_position, g.metadata_epoch) == (9000, "latest", 2)
    event = Event.objects.get(kind="config_changed", group=g)
    assert event.actor == "cli:ops"
    assert event.detail["session_timeout_ms"] == {"from": 30_000, "to": 9000}
    # The member is told (R7): its next heartbeat at the old metadata epoch gets the new settings.
    status, body = hb({"memberId": "m1", "memberEpoch": joined["memberEpoch"], "metadataEpoch": 1,
                       "ownedShards": joined["assignment"]["assignedShards"]})
    assert status == 200
    assert body["status"] == "SYNC_METADATA"
    assert body["metadata"]["sessionTimeoutMs"] == 9000
    with pytest.raises(CommandError, match="session timeout must be longer than the heartbeat interval"):
        run("alter_group", "g1", "--heartbeat-interval-ms", "9000")
    with pytest.raises(CommandError, match="nothing to change"):
        run("alter_group", "g1")
    with pytest.raises(CommandError, match="does not exist"):
        run("alter_group", "nope", "--max-members", "3")
    assert Group.objects.get(name="g1").metadata_epoch == 2  # refusals changed nothing


def test_i24_5_list_members_table_and_json(api: APIClient):
    fx = make_group()
    hb = Hb(api, fx)
    assert run("list_members", "g1").strip() == "group g1 has no live members"
    hb({"memberId": "m1", "memberEpoch": 0, "clientId": "host-1/pid-7"})
    hb({"memberId": "m2", "memberEpoch": 0, "instanceId": "billing-2"})
    lines = run("list_members", "g1").splitlines()
    assert lines[0].split()[:5] == ["MEMBER", "INSTANCE", "CLIENT", "EPOCH", "STATE"]
    assert [line.split()[0] for line in lines[1:]] == ["m1", "m2"]
    assert "host-1/pid-7" in lines[1]
    assert "billing-2" in lines[2]
    doc = json.loads(run("list_members", "g1", "--json"))
    assert [m["memberId"] for m in doc] == ["m1", "m2"]
    assert doc[1]["instanceId"] == "billing-2"
    with pytest.raises(CommandError, match="does not exist"):
        run("list_members", "nope")


def test_i24_5_describe_group_all_and_by_stream():
    make_group("orders", "g1")
    create_group("g2", "orders")
    create_stream("other", 2)
    create_group("g3", "other")
    text = run("describe_group", "--all")
    assert [line.split()[1] for line in text.splitlines() if line.startswith("GROUP ")] == ["g1", "g2", "g3"]
    text = run("describe_group", "--stream", "orders")
    assert [line.split()[1] for line in text.splitlines() if line.startswith("GROUP ")] == ["g1", "g2"]
    docs = json.loads(run("describe_group", "--stream", "other", "--json"))
    assert [d["group"] for d in docs] == ["g3"]
    assert json.loads(run("describe_group", "g1", "--json"))["group"] == "g1"
    with pytest.raises(CommandError, match="name one group, or give --all or --stream S"):
        run("describe_group")
    with pytest.raises(CommandError, match="name one group, or give --all or --stream S"):
        run("describe_group", "g1", "--all")
    with pytest.raises(CommandError, match="stream 'nope' does not exist"):
        run("describe_group", "--stream", "nope")


def test_i24_5_a_group_deleted_without_purge_leaves_a_name_the_refusal_says_how_to_reuse(api: APIClient):
    fx = make_group("reuse", "gr", shards=2)
    r = redis.Redis.from_url(settings.STREAM_REDIS_URL, decode_responses=True)
    try:
        _s, joined = Hb(api, fx)({"memberId": "m1", "memberEpoch": 0})
        shard = joined["assignment"]["assignedShards"][0]
        fence = fx.keys(shard).fence("gr")
        r.set(fence, f"{joined['memberEpoch']}:m1")  # what the member's runtime writes
        assert r.xinfo_groups(fx.keys(shard).stream)  # the coordinator made the consumer group (27.6)
        Hb(api, fx)({"memberId": "m1", "memberEpoch": -1})
        run("delete_group", "gr")
        with pytest.raises(Exception, match=r"manage\.py delete_group gr --stream reuse --purge-redis") as refused:
            create_group("gr", "reuse")
        assert "fence tokens of a group named 'gr'" in str(refused.value)
        with pytest.raises(CommandError, match="give --purge-redis too"):
            run("delete_group", "gr", "--stream", "reuse")
        text = run("delete_group", "gr", "--stream", "reuse", "--purge-redis")
        assert "2 consumer groups destroyed, 1 fence tokens deleted; the name can be used again" in text
        assert not r.exists(fence)
        create_group("gr", "reuse")  # the name is usable again
        with pytest.raises(CommandError, match="group 'gr' exists: delete it with"):
            run("delete_group", "gr", "--stream", "reuse", "--purge-redis")
    finally:
        delete_keys(r, f"{fx.keys(fx.stream + ':1:0').stream.split(':')[0]}:*reuse*")
        r.close()


def test_i24_5_fence_member_help_says_what_it_does_and_what_to_do_instead():
    from members.management.commands.fence_member import Command

    text = Command.help
    assert "rejoins at once" in text
    assert "stop it" in text
    assert "pause the group (pause_group)" in text


def test_i24_5_delete_group_names_static_members_that_left_temporarily(api: APIClient):
    """A static member that left temporarily (§9) has stopped already: the refusal names it with
    its instance id and expiry and says how to remove it now, not "stop them"."""
    fx = make_group()
    hb = Hb(api, fx)
    assert hb({"memberId": "st-1", "memberEpoch": 0, "instanceId": "billing-3", "ownedShards": []})[0] == 200
    assert hb({"memberId": "st-1", "memberEpoch": -2, "instanceId": "billing-3"})[0] == 200
    with pytest.raises(CommandError) as refused:
        run("delete_group", "g1")
    message = str(refused.value)
    assert "st-1 (instance billing-3, expires in " in message
    assert "manage.py remove_member g1 MEMBER_ID" in message
    assert "stop them" not in message
    run("remove_member", "g1", "st-1")
    run("delete_group", "g1")
    assert not Group.objects.filter(name="g1").exists()
