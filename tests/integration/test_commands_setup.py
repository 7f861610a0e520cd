"""create_stream, create_group, create_api_key, describe_group: names, output, failures."""
from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from groups.models import Group, Stream
from groups.services import resolve_api_key
from tests import spawn

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db]


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_setup_commands_create_stream_group_and_keys():
    assert "4 shards" in run("create_stream", "orders", "--shards", "4")
    run("create_group", "billing", "--stream", "orders", "--heartbeat-interval-ms", "1000",
        "--session-timeout-ms", "9000", "--rebalance-timeout-ms", "20000", "--max-members", "7",
        "--start-position", "latest")
    g = Group.objects.get(name="billing")
    assert (g.heartbeat_interval_ms, g.session_timeout_ms, g.rebalance_timeout_ms, g.max_members,
            g.start_position, g.group_epoch, g.assignment_epoch, g.metadata_epoch) == (
        1000, 9000, 20000, 7, "latest", 1, 1, 1)
    group_key = run("create_api_key", "--group", "billing").strip().splitlines()[-1]
    stream_key = run("create_api_key", "--stream", "orders").strip().splitlines()[-1]
    assert resolve_api_key(group_key).group == "billing"
    scope = resolve_api_key(stream_key)
    assert scope.group is None
    assert scope.stream == "orders"
    text = run("describe_group", "billing")
    assert "groupEpoch=1" in text
    assert "no live members" in text
    doc = json.loads(run("describe_group", "billing", "--json"))
    assert doc["state"] == "EMPTY"
    assert doc["members"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create_stream", "orders", "--shards", "0"), "shards must be a whole number from 1"),
        (("create_stream", "orders", "--shards", "100000"), "shards must be a whole number from 1"),
        (("create_stream", "bad:name", "--shards", "2"), "stream name"),
        (("create_stream", "dup", "--shards", "2"), "already exists"),
        (("create_group", "g", "--stream", "nope"), "stream 'nope' does not exist"),
        (("create_group", "g", "--stream", "dup", "--heartbeat-interval-ms", "5000",
          "--session-timeout-ms", "4000"), "session timeout must be longer"),
        (("create_group", "g", "--stream", "dup", "--max-members", "0"), "max members"),
        (("create_api_key", "--group", "nope"), "group 'nope' does not exist"),
        (("create_api_key", "--stream", "nope"), "stream 'nope' does not exist"),
        (("describe_group", "nope"), "group 'nope' does not exist"),
    ],
)
def test_setup_commands_fail_clearly_and_change_nothing(args, message):
    run("create_stream", "dup", "--shards", "2")
    before = (Stream.objects.count(), Group.objects.count())
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert (Stream.objects.count(), Group.objects.count()) == before


def test_setup_commands_exit_non_zero_from_the_shell():
    import sys

    r = spawn.run([sys.executable, "manage.py", "create_stream", "x", "--shards", "abc"],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "invalid int value" in r.stderr
