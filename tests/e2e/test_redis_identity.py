"""Issue 25.4: a member on a Redis that is not the coordinator's stream Redis refuses to read it.

Before, ``consume --redis redis://…/1`` while the coordinator's streams live in ``/0`` joined,
took every shard, showed as alive with lag in describe_group and created empty stream keys,
consumer groups and fence tokens in the wrong database, without a word. Now the coordinator
publishes its installation id in ``<keyPrefix>:identity`` (with each stream, group and reshard,
and at start) and as ``installationId`` in the heartbeat metadata; the member compares them
after the join, before its first read: it creates nothing there, leaves the group with a clean
leave heartbeat, and the CLI exits 2 with one error line.

Real gunicorn coordinator on the test database, real Redis, the real CLI in a subprocess.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from dataplane import Consumer, RedisMismatchError, __version__
from groups.models import Event
from groups.namespace import identity_key, installation_id
from tests.redis_keys import delete_keys

from ..consumer_thread import run_consumer
from .cli import run_cli
from .conftest import World

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]


def other_db_url(url: str) -> str:
    """The same Redis server, another database number (the mistake of the issue)."""
    base, _, db = url.rpartition("/")
    return f"{base}/{(int(db or 0) + 1) % 16}"


@pytest.fixture
def wrong(world: World) -> Iterator[tuple[str, redis.Redis]]:
    url = other_db_url(world.redis_url)
    client = redis.Redis.from_url(url, decode_responses=True)
    yield url, client
    prefix = getattr(world, "prefix", None)
    if prefix:
        delete_keys(client, f"{prefix}:*")
    client.close()


def events_of(world: World, member_id: str) -> list[str]:
    return list(
        Event.objects.filter(group__name=world.group, member_id=member_id).order_by("created_at", "id")
        .values_list("kind", flat=True)
    )


def test_i25_4_cli_on_the_wrong_redis_database_exits_2_with_one_line_creating_nothing(
    world: World, wrong: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    world.create(4, heartbeat_interval_ms=500)
    wrong_url, wrong_db = wrong
    # The coordinator published its identity in its own stream Redis with the stream.
    assert world.r.get(identity_key(world.prefix)) == installation_id()
    assert list(wrong_db.scan_iter(match=f"{world.prefix}:*")) == []
    world.producer().send_many([(f"k{i}", {"n": str(i)}) for i in range(10)])

    (tmp_path / "h.py").write_text("def handle(msg):\n    pass\n")
    out = run_cli(["consume", "--coordinator", world.server.url, "--group", world.group,
                   "--api-key", world.group_key, "--redis", wrong_url, "--handler", "h:handle",
                   "--member-id", "m-wrong"], tmp_path)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1] == errors[0]
    assert errors[0].startswith(
        f"error: Redis {wrong_url} holds no {world.prefix}:identity: it is not the coordinator's "
        f"stream Redis (installation {installation_id()}); nothing was read or written there."
    ), errors[0]
    # Nothing in the wrong database: no stream key, consumer group, fence token or marker.
    assert list(wrong_db.scan_iter(match=f"{world.prefix}:*")) == []
    # It had joined (and been granted shards), and left with a leave heartbeat: not expired.
    assert events_of(world, "m-wrong") == ["joined", "left"]
    assert world.describe()["members"] == []
    # The right database was not touched by it either: nothing read, nothing pending.
    assert world.total_pending() == 0


def test_i25_4_consumer_on_another_installations_redis_raises_and_leaves(
    world: World, wrong: tuple[str, redis.Redis]
) -> None:
    """A Redis holding another installation's identity under the same prefix (a copy, a
    restored backup of another setup): Consumer.run() leaves and raises RedisMismatchError
    naming both ids; on_assigned is never called (nothing was started)."""
    world.create(2, heartbeat_interval_ms=500)
    wrong_url, wrong_db = wrong
    wrong_db.set(identity_key(world.prefix), "f" * 32)
    assigned: list[str] = []
    consumer = Consumer(world.server.url, world.group, world.group_key, lambda msg: None,
                        redis_url=wrong_url, member_id="m-other", block_ms=100,
                        on_assigned=lambda shards: assigned.extend(shards))
    running = run_consumer(consumer)
    thread, raised = running.thread, running.raised
    thread.join(30)
    assert not thread.is_alive(), "run() did not return"
    assert len(raised) == 1, raised
    assert isinstance(raised[0], RedisMismatchError), raised
    assert f"belongs to installation {'f' * 32}" in str(raised[0])
    assert f"the coordinator is installation {installation_id()}" in str(raised[0])
    assert assigned == []
    assert sorted(wrong_db.scan_iter(match=f"{world.prefix}:*")) == [identity_key(world.prefix)]
    assert events_of(world, "m-other") == ["joined", "left"]

    # The right Redis: the same member works (the check passes, shards are read).
    ok = Consumer(world.server.url, world.group, world.group_key, lambda msg: None,
                  redis_url=world.redis_url, member_id="m-right", block_ms=100)
    thread = threading.Thread(target=ok.run, daemon=True)
    thread.start()
    try:
        world.wait(lambda: world.stable_with({"m-right"}), 30, "m-right owning both shards")
        assert ok.status().owned_shards == tuple(sorted(world.shard_ids()))
        # Issue 25.7: the coordinator shows the member's library version from its User-Agent.
        assert world.describe()["members"][0]["libraryVersion"] == f"rsc-dataplane/{__version__}"
    finally:
        ok.stop()
        thread.join(30)
