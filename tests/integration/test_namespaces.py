"""Installations sharing one Redis (issue 12.2): each has its own key prefix and Celery
namespace, and keys this database did not write are refused with a message that says so.

The second installation is a real second database: SQLite in a temp dir, driven through
manage.py in a subprocess (the test session itself runs on PostgreSQL).
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command

from coordinator_project.celery import installation_namespace, namespace_settings
from dataplane.routing import ShardKeys
from groups.metadata import group_metadata
from groups.models import Stream
from groups.namespace import default_key_prefix, identity_key, installation_id, owner_key
from groups.resharding import start_reshard
from groups.services import ServiceError, create_group, create_stream
from tests import spawn
from tests.redis_keys import delete_keys

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db]

OTHER_INSTALLATION = """
import json
from coordinator_project.celery import installation_namespace, namespace_settings
from groups.resharding import start_reshard
from groups.services import create_stream
from groups.sweeps import run_all_sweeps
create_stream("ns-orders", 2)
create_stream("ns-shared", 1, key_prefix="ns-shared-prefix")
start_reshard("ns-orders", 3)
run_all_sweeps()  # PREPARING -> SEALING
run_all_sweeps()  # seal markers of version 1
ns = installation_namespace()
print(json.dumps({"namespace": ns, "celery": namespace_settings(ns)}))
"""


@pytest.fixture
def stream_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.STREAM_REDIS_URL, decode_responses=True)
    yield client
    ours = identity_key(default_key_prefix())  # other tests' members check it
    for pattern in ("rsc*:{ns-*", "ns-shared-prefix:*", "ns-id-prefix:*", "rsc-*:identity"):
        delete_keys(client, pattern, keep=frozenset({ours}))
    client.close()


def other_installation(tmp_path: Path) -> dict:
    """A second installation (its own SQLite database) on this Redis: streams, a reshard, seals."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_NAMESPACE"}}
    env.update(SQLITE_PATH=str(tmp_path / "other.sqlite3"), REDIS_URL=settings.REDIS_URL,
               STREAM_REDIS_URL=settings.STREAM_REDIS_URL, LOG_LEVEL="WARNING")
    for argv in (["migrate", "-v0"], ["shell", "-c", OTHER_INSTALLATION]):
        done = spawn.run([sys.executable, "manage.py", *argv], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_ns_two_installations_on_one_redis_do_not_see_each_others_keys(
    tmp_path: Path, stream_redis: redis.Redis
):
    create_stream("ns-orders", 2)  # the same stream name in this installation
    mine = default_key_prefix()
    assert Stream.objects.get(name="ns-orders").key_prefix == mine == f"rsc-{installation_id()[:8]}"

    other = other_installation(tmp_path)

    theirs = other["namespace"]
    assert theirs != mine
    assert theirs.startswith("rsc-")
    # Their reshard sealed their version 1, under their prefix; nothing appeared under ours
    # but our own identity (issue 25.4), which they did not overwrite.
    assert stream_redis.exists(*(ShardKeys(f"ns-orders:1:{i}", theirs).sealed for i in range(2))) == 2
    assert list(stream_redis.scan_iter(f"{mine}:*", count=1000)) == [identity_key(mine)]
    # Each installation publishes its own id under its own prefix, for its members to check.
    assert stream_redis.get(identity_key(mine)) == installation_id()
    assert stream_redis.get(identity_key(theirs)) not in (None, installation_id())
    assert stream_redis.get(identity_key("ns-shared-prefix")) == stream_redis.get(owner_key("ns-shared-prefix"))
    # ... so this installation's stream is not sealed and reshards normally.
    assert start_reshard("ns-orders", 4).version == 2
    # Celery: their own queue, exchanges and broker key prefix.
    ours_celery = namespace_settings(installation_namespace())
    assert ours_celery["task_default_queue"] == mine
    assert other["celery"]["task_default_queue"] == theirs
    assert ours_celery["broker_transport_options"]["global_keyprefix"] == f"{mine}:"
    assert other["celery"]["broker_transport_options"]["global_keyprefix"] == f"{theirs}:"
    assert ours_celery["control_exchange"] != other["celery"]["control_exchange"]


def test_ns_a_key_prefix_owned_by_another_installation_is_refused(tmp_path: Path, stream_redis: redis.Redis):
    other = other_installation(tmp_path)
    assert stream_redis.get(owner_key("ns-shared-prefix")) not in (None, installation_id())

    with pytest.raises(ServiceError) as refused:
        create_stream("ns-mine", 1, key_prefix="ns-shared-prefix")
    assert str(refused.value).startswith("Redis key prefix 'ns-shared-prefix' belongs to another installation")
    assert installation_id() in str(refused.value)
    assert other["namespace"] not in str(refused.value)
    assert not Stream.objects.filter(name="ns-mine").exists()
    with pytest.raises(CommandError, match="belongs to another installation"):
        call_command("create_stream", "ns-mine", "--shards", "1", "--key-prefix", "ns-shared-prefix")
    # A refused prefix keeps its owner's identity: members of the other installation still match.
    assert stream_redis.get(identity_key("ns-shared-prefix")) == other_id(stream_redis)


def other_id(stream_redis: redis.Redis) -> str | None:
    return stream_redis.get(owner_key("ns-shared-prefix"))


def test_i25_4_publish_identity_writes_every_prefix_and_the_metadata_carries_the_id(stream_redis: redis.Redis):
    create_stream("ns-id", 1, key_prefix="ns-id-prefix")
    mine = default_key_prefix()
    for key in (identity_key(mine), identity_key("ns-id-prefix")):
        stream_redis.delete(key)  # a restored or moved stream Redis
    out = StringIO()
    call_command("publish_identity", stdout=out)
    assert stream_redis.get(identity_key(mine)) == installation_id()
    assert stream_redis.get(identity_key("ns-id-prefix")) == installation_id()
    assert f"{identity_key('ns-id-prefix')} = {installation_id()}" in out.getvalue()
    group = create_group("ns-id-g", "ns-id")
    assert group_metadata(group)["installationId"] == installation_id()
    stream_redis.delete(identity_key("ns-id-prefix"), owner_key("ns-id-prefix"))


def test_ns_leftover_seal_markers_and_fence_tokens_are_refused(stream_redis: redis.Redis):
    prefix = default_key_prefix()
    # A reset database on the same Redis: markers of shards this database never had.
    stream_redis.set(ShardKeys("ns-left:1:1", prefix).sealed, "{}")
    with pytest.raises(ServiceError) as refused:
        create_stream("ns-left", 2)
    sealed = ShardKeys('ns-left:1:1', prefix).sealed
    assert str(refused.value) == (
        f"Redis already holds {sealed}, which this database did not write: another installation, a "
        "deleted stream or group, or a client that may write this stream's keys (a producer role can "
        f"XADD into a stream key of a version not made yet) used key prefix {prefix!r}. Nothing was "
        f"changed. Look at them (a stream may hold messages), delete them (redis-cli DEL '{sealed}') "
        "and retry, or use another key prefix"
    )
    assert not Stream.objects.filter(name="ns-left").exists()

    create_stream("ns-ok", 2)
    stream_redis.set(ShardKeys("ns-ok:1:0", prefix).fence("ns-g"), "7:m-old")
    with pytest.raises(ServiceError, match=r"already holds .*:\{ns-ok:1:0\}:fence:ns-g"):
        create_group("ns-g", "ns-ok")
    create_group("ns-g2", "ns-ok")  # another group's name has no tokens: fine

    stream_redis.set(f"{prefix}:{{ns-ok:2:0}}", "x")  # a stream key of the next version
    with pytest.raises(ServiceError, match=r"already holds .*:\{ns-ok:2:0\}, which this database did not write"):
        start_reshard("ns-ok", 3)
    assert Stream.objects.get(name="ns-ok").write_version == 1


def test_i27_6_a_stray_next_version_key_names_every_key_to_delete_and_the_reshard_works_after(
    stream_redis: redis.Redis,
):
    """A producer role may XADD into a stream key of a version not made yet; the reshard is
    refused with every such key and the command that deletes them, and works once they are gone."""
    prefix = default_key_prefix()
    create_stream("ns-stray", 2)
    strays = [ShardKeys("ns-stray:2:1", prefix).stream, ShardKeys("ns-stray:2:2", prefix).sealed]
    stream_redis.xadd(strays[0], {"key": "k", "forged": "1"})
    stream_redis.set(strays[1], "{}")
    with pytest.raises(ServiceError) as refused:
        start_reshard("ns-stray", 3)
    message = str(refused.value)
    assert f"Redis already holds {strays[0]}, {strays[1]}, which this database did not write" in message
    assert f"redis-cli DEL '{strays[0]}' '{strays[1]}'" in message
    assert "a producer role can XADD" in message
    assert Stream.objects.get(name="ns-stray").write_version == 1
    stream_redis.delete(*strays)
    assert start_reshard("ns-stray", 3).version == 2

    create_stream("ns-many", 1)
    many = [ShardKeys(f"ns-many:2:{i}", prefix).stream for i in range(25)]
    for key in many:
        stream_redis.xadd(key, {"x": "1"})
    with pytest.raises(ServiceError) as refused:
        start_reshard("ns-many", 25)
    message = str(refused.value)
    assert ", ".join(many[:20]) + " and 5 more" in message
    assert f"redis-cli --scan --pattern '{prefix}:{{ns-many:2:*'" in message


def test_i25_4_a_celery_worker_or_beat_start_publishes_the_identity(stream_redis: redis.Redis):
    """Coordinator start (not a request path): the worker_ready and beat_init receivers write
    every prefix's identity again, e.g. after the stream Redis was restored or moved."""
    from celery import signals

    import coordinator_project.celery  # noqa: F401 - connects the receivers

    create_stream("ns-start", 1)
    key = identity_key(default_key_prefix())
    for signal in (signals.worker_ready, signals.beat_init):
        stream_redis.delete(key)
        signal.send(sender=None)
        assert stream_redis.get(key) == installation_id(), signal.name
