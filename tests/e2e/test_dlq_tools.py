"""Issue 10.5, end to end: ``python -m dataplane dlq list|replay|purge`` and
``dataplane.dlq.DeadLetters`` against the real coordinator (gunicorn on PostgreSQL), real Redis
and a real member process (``python -m dataplane consume``, run from a temporary directory with
a handler module that lives there).

The handler fails every delivery of a message with ``fail=always`` until the test "fixes" it
(sets ``<results>:fixed``); the runtime moves such a message to the DLQ after
``--max-deliveries`` deliveries.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dataplane.dlq import DeadLetters
from groups.describe import describe_group
from groups.models import ShardVersion, Stream
from groups.resharding import start_reshard
from groups.services import create_api_key, create_group
from tests import spawn

from .cli import cli_env, one_line, run_cli
from .conftest import MemberProc, World

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]

GROUP_CONFIG = {"heartbeat_interval_ms": 250, "session_timeout_ms": 3000, "rebalance_timeout_ms": 20_000}
MAX_DELIVERIES = 2

HANDLER = """\
import os

import redis

r = redis.Redis.from_url(os.environ["E2E_REDIS_URL"], decode_responses=True)
RESULTS = os.environ["E2E_RESULTS"]


class Poison(RuntimeError):
    pass


def handle(msg):
    poisoned = os.environ.get("E2E_POISON", "1") == "1"  # "0": this member's group copes
    if poisoned and msg.fields.get("fail") == "always" and not r.exists(RESULTS + ":fixed"):
        raise Poison(f"cannot handle {msg.key}")
    r.xadd(RESULTS, {"shard": msg.shard, "id": msg.id, "key": msg.key,
                     "seq": msg.fields.get("seq", ""), "member": os.environ["E2E_MEMBER"],
                     "dc": msg.delivery_count})
"""


def start_member(
    world: World, cwd: Path, member_id: str, group: str | None = None, api_key: str | None = None,
    poison: bool = True,
) -> MemberProc:
    """``python -m dataplane consume`` from ``cwd``, where its handler module is (in
    ``group``, default the world's; ``poison=False``: its handler copes with the poison)."""
    (cwd / "dlqhandler.py").write_text(HANDLER)
    log = world.log_dir / f"{member_id}.log"
    argv = [
        sys.executable, "-m", "dataplane", "consume", "--coordinator", world.server.url,
        "--group", group or world.group, "--redis", world.redis_url, "--handler", "dlqhandler:handle",
        "--member-id", member_id, "--block-ms", "200", "--max-deliveries", str(MAX_DELIVERIES),
    ]
    env = cli_env(E2E_REDIS_URL=world.redis_url, E2E_RESULTS=world.results_key,
                  E2E_MEMBER=member_id, RSC_API_KEY=api_key or world.group_key,
                  E2E_POISON="1" if poison else "0")
    with open(log, "wb") as out:
        proc = spawn.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    m = MemberProc(member_id, proc, log)
    world.members[member_id] = m  # stopped by world.close()
    return m


def dlq(world: World, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        ["dlq", args[0], "--coordinator", world.server.url, "--group", world.group,
         "--redis", world.redis_url, *args[1:]],
        cwd, RSC_API_KEY=world.group_key,
    )


def dead_letters(world: World) -> DeadLetters:
    return DeadLetters(world.server.url, world.group, world.group_key, world.redis_url)


def produce_with_poison(world: World, good: int, poison_keys: list[str]) -> None:
    items = [(f"k{i}", {"seq": str(i)}) for i in range(good)]
    items += [(k, {"seq": "0", "fail": "always"}) for k in poison_keys]
    world.producer().send_many(items)


def wait_dead_lettered(world: World, good: int, n: int) -> None:
    with dead_letters(world) as dl:
        def done() -> bool:
            world.results.poll()
            return len(world.results.records) >= good and sum(dl.counts().values()) == n
        world.wait(done, 30, f"{good} handled and {n} dead-lettered")
    world.wait(lambda: world.total_pending() == 0, 20, "nothing pending")


def test_dlq_list_then_replay_after_the_fix_handles_each_poison_message_once_and_empties_the_dlq(
    world: World, tmp_path: Path
) -> None:
    world.create(2, **GROUP_CONFIG)
    start_member(world, tmp_path, "a")
    world.wait(lambda: world.stable_with({"a"}), 30, "member a STABLE")
    poison = ["bad0", "bad1", "bad2"]
    produce_with_poison(world, 20, poison)
    wait_dead_lettered(world, 20, 3)
    assert not [r for r in world.results.records if r.key in poison]

    # list: a table with shard, id, source id, deliveries, key and error; --json the same data.
    out = dlq(world, tmp_path, "list")
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split() == ["SHARD", "ID", "SOURCE-ID", "DELIVERIES", "KEY", "ERROR"]
    assert len(rows) == 3
    assert out.stderr.strip() == f"3 shown of 3 dead letters of group {world.group}"
    out = dlq(world, tmp_path, "list", "--json")
    listed = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(x["key"] for x in listed) == poison
    for x in listed:
        assert x["shard"] == world.route(x["key"], 2)
        assert x["deliveries"] == MAX_DELIVERIES
        assert x["error"] == f"Poison: cannot handle {x['key']}"
        assert x["fields"] == {"key": x["key"], "seq": "0", "fail": "always"}
        assert world.r.xrange(world.keys(x["shard"]).stream, x["sourceId"], x["sourceId"])
    # --limit and --shard narrow the list; the Python API says the same.
    assert len(dlq(world, tmp_path, "list", "--json", "--limit", "2").stdout.splitlines()) == 2
    one_shard = listed[0]["shard"]
    out = dlq(world, tmp_path, "list", "--json", "--shard", one_shard)
    assert {json.loads(line)["shard"] for line in out.stdout.splitlines()} == {one_shard}
    with dead_letters(world) as dl:
        assert [(x.shard, x.id, x.key) for x in dl.list()] == [
            (x["shard"], x["id"], x["key"]) for x in listed
        ]

    # Fixed; replay: each message appended again (routed by its key), then handled once.
    world.r.set(f"{world.results_key}:fixed", "1")
    out = dlq(world, tmp_path, "replay")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"replayed": 3}

    def replayed_handled() -> bool:
        world.results.poll()
        return {r.key for r in world.results.records} >= set(poison)

    world.wait(replayed_handled, 30, "the replayed messages handled")
    world.wait(lambda: world.total_pending() == 0, 20, "nothing pending")
    for key in poison:
        recs = [r for r in world.results.records if r.key == key]
        assert len(recs) == 1, recs
        assert recs[0].shard == world.route(key, 2)
        assert recs[0].dc == 1
        assert recs[0].seq == 0
    with dead_letters(world) as dl:
        assert dl.list() == []
        assert dl.counts() == {}
    out = dlq(world, tmp_path, "list")
    assert out.returncode == 0
    assert out.stdout == ""
    assert out.stderr.strip() == f"0 shown of 0 dead letters of group {world.group}"
    assert world.members["a"].proc.poll() is None, world.diag()


def test_dlq_purge_needs_yes_and_deletes_only_what_it_is_told(world: World, tmp_path: Path) -> None:
    world.create(1, **GROUP_CONFIG)
    start_member(world, tmp_path, "a")
    world.wait(lambda: world.stable_with({"a"}), 30, "member a STABLE")
    produce_with_poison(world, 5, ["p0", "p1", "p2"])
    wait_dead_lettered(world, 5, 3)

    out = dlq(world, tmp_path, "purge")
    assert out.returncode == 2
    assert one_line(out) == (f"error: refusing to purge 3 dead letters of group {world.group} "
                             "without --yes (nothing deleted)")
    out = dlq(world, tmp_path, "purge", "--shard", "other:1:0", "--yes")
    assert out.returncode == 2
    assert one_line(out).startswith(f"error: shard 'other:1:0' is not a shard of stream {world.stream!r}")
    with dead_letters(world) as dl:
        assert sum(dl.counts().values()) == 3
        before = [x.key for x in dl.list()]  # oldest first (workers dead-letter in any order)

    out = dlq(world, tmp_path, "purge", "--yes", "--limit", "1")
    assert out.returncode == 0
    assert json.loads(out.stdout) == {"purged": 1}
    with dead_letters(world) as dl:
        assert [x.key for x in dl.list()] == before[1:]
    out = dlq(world, tmp_path, "purge", "--yes")
    assert out.returncode == 0
    assert json.loads(out.stdout) == {"purged": 2}
    with dead_letters(world) as dl:
        assert dl.list() == []
    world.results.poll()
    assert not [r for r in world.results.records if r.key.startswith("p")]


def test_dlq_replay_after_a_reshard_lands_on_the_current_version(world: World, tmp_path: Path) -> None:
    world.create(2, **GROUP_CONFIG)
    start_member(world, tmp_path, "a")
    world.wait(lambda: world.stable_with({"a"}), 30, "member a STABLE")
    poison = ["bad0", "bad1", "bad2", "bad3"]
    produce_with_poison(world, 10, poison)
    wait_dead_lettered(world, 10, 4)

    start_reshard(world.stream, 4)

    def resharded() -> bool:
        if Stream.objects.get(name=world.stream).state != "STABLE":
            return False
        return world.stable_with({"a"}) is not None

    world.wait(resharded, 60, "v1 retired, stream STABLE")
    assert ShardVersion.objects.get(stream__name=world.stream, version=1).state == "RETIRED"
    # Version 1 is out of the routing document; its DLQ streams are still found.
    with dead_letters(world) as dl:
        assert {x.shard for x in dl.list()} <= {f"{world.stream}:1:0", f"{world.stream}:1:1"}
        assert len(dl.list()) == 4

    world.r.set(f"{world.results_key}:fixed", "1")
    with dead_letters(world) as dl:
        replayed = dl.replay()
        assert dl.list() == []
    assert sorted(letter.key for letter, _sent in replayed) == poison
    for letter, sent in replayed:
        assert sent.shard == world.route(letter.key, 4, version=2)

    def handled() -> bool:
        world.results.poll()
        return {r.key for r in world.results.records} >= set(poison)

    world.wait(handled, 30, "the replayed messages handled on version 2")
    for key in poison:
        recs = [r for r in world.results.records if r.key == key]
        assert [r.shard for r in recs] == [world.route(key, 4, version=2)], recs


def test_i27_7_replay_of_one_groups_dlq_is_handled_by_that_group_only(world: World, tmp_path: Path) -> None:
    """Two groups on one stream: group A dead-letters the poison, group B handles it at once.
    A's replay re-appends to the shared stream: A handles it once more, B reads it and ACKs it
    without running its handler (before issue 27.7, B handled every replayed message again)."""
    world.create(2, **GROUP_CONFIG)
    group_b = f"{world.group}-b"
    create_group(group_b, world.stream, **GROUP_CONFIG)
    key_b = create_api_key(group=group_b)
    start_member(world, tmp_path, "a")
    start_member(world, tmp_path, "b", group=group_b, api_key=key_b, poison=False)

    def b_stable() -> bool:
        doc = describe_group(group_b)
        return bool(doc and doc["state"] == "STABLE" and [m["memberId"] for m in doc["members"]] == ["b"]
                    and len(doc["members"][0]["assignedShards"]) == 2)

    world.wait(lambda: world.stable_with({"a"}) and b_stable(), 30, "a and b STABLE in their groups")
    poison = ["bad0", "bad1", "bad2"]
    produce_with_poison(world, 10, poison)

    def handled_by(member: str, key: str) -> int:
        return sum(1 for r in world.results.records if r.member == member and r.key == key)

    def first_round() -> bool:
        world.results.poll()
        return all(handled_by("b", k) == 1 for k in poison)

    world.wait(first_round, 30, "b handled the poison messages")
    wait_dead_lettered(world, 23, 3)

    world.r.set(f"{world.results_key}:fixed", "1")
    with dead_letters(world) as dl:
        replayed = dl.replay()
    assert sorted(letter.key for letter, _sent in replayed) == poison

    def b_read_past_the_replay() -> bool:
        for _letter, sent in replayed:
            stream = world.keys(sent.shard).stream
            info = {g["name"]: g for g in world.r.xinfo_groups(stream)}[group_b]
            last = tuple(int(x) for x in info["last-delivered-id"].split("-"))
            if last < tuple(int(x) for x in sent.id.split("-")) or info["pending"]:
                return False
        return True

    def a_handled_replay() -> bool:
        world.results.poll()
        return all(handled_by("a", k) == 1 for k in poison)

    world.wait(a_handled_replay, 30, "a handled the replayed messages")
    world.wait(b_read_past_the_replay, 30, "b read past the replayed entries and ACKed them")
    world.wait(lambda: world.total_pending() == 0, 20, "nothing pending in a's group")
    world.results.poll()
    for key in poison:
        assert handled_by("b", key) == 1, [r for r in world.results.records if r.key == key]
        assert handled_by("a", key) == 1
