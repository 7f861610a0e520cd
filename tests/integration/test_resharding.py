"""§6 resharding end to end at the coordinator: members driven over HTTP, sweeps run by hand.

2→4 (splits), 4→2 (merges) and 4→3 (uneven) each go STABLE → PREPARING → SEALING → DRAINING →
STABLE with two groups: seal markers land in Redis, members get SYNC_METADATA then OK, no
child is granted before all its parents are drained in that group, drained parents are
revoked, and v is retired only when every group drained it and nobody holds it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from assignments.models import ShardAssignment
from assignments.services import heartbeat
from coordination.model import HeartbeatRequest, RevokeReport
from dataplane.protocol import RevokeState
from dataplane.routing import ShardKeys, document_versions, hash_range, shard_id
from groups.describe import describe_group
from groups.models import Event, Group, Shard, ShardVersion, Stream
from groups.namespace import default_key_prefix
from groups.resharding import start_reshard
from groups.services import create_api_key, create_group
from groups.sweeps import run_all_sweeps

from .conftest import GroupFixture, make_group

pytest_plugins = ["tests.integration.conftest_celery"]  # stream_redis
pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


class Member:
    """One well-behaved member over HTTP (C1–C5): REVOKED at once, drains when told."""

    def __init__(self, api: APIClient, group: str, key: str, member_id: str) -> None:
        self.api, self.group, self.key, self.member_id = api, group, key, member_id
        self.epoch = 0
        self.metadata_epoch: int | None = None
        self.owned: list[str] = []
        self.to_revoke: list[str] = []
        self.last: dict[str, Any] = {}

    def beat(self, drained: tuple[str, ...] = ()) -> dict[str, Any]:
        body: dict[str, Any] = {"memberId": self.member_id, "memberEpoch": self.epoch}
        if self.epoch > 0:
            body.update(
                metadataEpoch=self.metadata_epoch,
                ownedShards=self.owned,
                revokingShards=[{"shard": s, "state": "REVOKED"} for s in self.to_revoke],
                drainedShards=list(drained),
            )
        r = self.api.post(f"/api/v1/groups/{self.group}/heartbeat", body, format="json",
                          HTTP_AUTHORIZATION=f"Bearer {self.key}")
        out = r.json()
        assert r.status_code == 200, out
        self.last = out
        self.epoch = out["memberEpoch"]
        self.metadata_epoch = out["metadata"]["metadataEpoch"]
        a = out["assignment"]
        # C1: what left assignedShards is revoking; in-flight is 0 here, so REVOKED next beat.
        self.to_revoke = list(a["revokingShards"])
        self.owned = [s for s in self.owned if s in a["assignedShards"]]
        if out["status"] == "OK":  # C2/C3: new shards only from OK
            self.owned = sorted(set(self.owned) | set(a["assignedShards"]), key=_natural)
        return out


def _natural(s: str) -> tuple[str, int, int]:
    stream, v, i = s.rsplit(":", 2)
    return stream, int(v), int(i)


class World:
    """Two groups on one stream: g1 with members a, b; g2 with member c."""

    def __init__(self, api: APIClient, stream: str, shards: int) -> None:
        self.fx: GroupFixture = make_group(stream=stream, group=f"{stream}-g1", shards=shards)
        self.stream = stream
        create_group(f"{stream}-g2", stream)
        key2 = create_api_key(group=f"{stream}-g2")
        self.groups = {
            f"{stream}-g1": [Member(api, f"{stream}-g1", self.fx.key, m) for m in ("a", "b")],
            f"{stream}-g2": [Member(api, f"{stream}-g2", key2, "c")],
        }
        self.api = api

    def members(self) -> list[Member]:
        return [m for ms in self.groups.values() for m in ms]

    def settle(self, group: str | None = None) -> None:
        names = [group] if group else list(self.groups)
        for name in names:
            for _ in range(10):
                for m in self.groups[name]:
                    m.beat()
                    self.check()
                if all(m.last["status"] == "OK" and not m.to_revoke and not m.last["assignment"]["pendingShards"]
                       for m in self.groups[name]):
                    break
            else:
                raise AssertionError(f"group {name} did not settle: {[m.last for m in self.groups[name]]}")

    def check(self) -> None:
        """R9 on what the members themselves believe, and §6 on what the database says."""
        for name, ms in self.groups.items():
            seen: set[str] = set()
            for m in ms:
                assert not seen & set(m.owned), f"{name}: a shard owned twice"
                seen |= set(m.owned)
            rows = {sa.shard.shard_id: sa for sa in
                    ShardAssignment.objects.filter(group__name=name).select_related("shard")}
            for sid in seen:
                for parent in rows[sid].shard.parents:
                    if parent in rows:  # retired parents have no row
                        assert rows[parent].drained_at is not None, f"{name}: {sid} granted before {parent} drained"
            for sa in rows.values():
                if sa.owner_id is not None:
                    for parent in sa.shard.parents:
                        assert parent not in rows or rows[parent].drained_at is not None

    def drain(self, group: str, parent: str) -> None:
        """The owner of `parent` read it to the end: report it, then let the group settle."""
        owner = next(m for m in self.groups[group] if parent in m.owned)
        r = owner.beat(drained=(parent,))
        assert r["status"] == "REVOKE_PENDING"
        assert parent in r["assignment"]["revokingShards"]
        self.check()
        self.settle(group)
        assert not any(parent in m.owned for m in self.groups[group])
        assert ShardAssignment.objects.get(group__name=group, shard__shard_id=parent).owner_id is None


def routing(api: APIClient, fx: GroupFixture) -> dict[str, Any]:
    r = api.get(f"/api/v1/streams/{fx.stream}/routing", HTTP_AUTHORIZATION=f"Bearer {fx.stream_key}")
    assert r.status_code == 200, r.json()
    return r.json()


def start(how: str, api: APIClient, fx: GroupFixture, shards: int) -> None:
    if how == "http":
        r = api.post(f"/api/v1/streams/{fx.stream}/reshard", {"shards": shards}, format="json",
                     HTTP_AUTHORIZATION=f"Bearer {fx.admin_key}")
        assert r.status_code == 202, r.json()
        assert r.json()["state"] == "PREPARING"
        assert r.json()["routing"]["writeVersion"] == 2
    elif how == "command":
        call_command("reshard", fx.stream, "--shards", str(shards))
    else:
        start_reshard(fx.stream, shards, actor="test")


@pytest.mark.parametrize(("old", "new", "how"), [(2, 4, "http"), (4, 2, "command"), (4, 3, "service")])
def test_s6_reshard_end_to_end(api: APIClient, stream_redis: redis.Redis, old: int, new: int, how: str):
    stream = f"rs-{old}to{new}"
    w = World(api, stream, old)
    fx = w.fx
    for m in w.members():
        m.beat()
    w.settle()
    v1 = [shard_id(stream, 1, i) for i in range(old)]
    v2 = [shard_id(stream, 2, j) for j in range(new)]

    # §6.1: v+1 with parents from range overlap; routing names it; metadata epochs rise.
    start(how, api, fx, new)
    doc = routing(api, fx)
    assert (doc["state"], doc["writeVersion"], doc["hash"]) == ("PREPARING", 2, "blake2b-64")
    assert [(v["version"], v["state"], v["shardCount"]) for v in doc["versions"]] == [(1, "ACTIVE", old), (2, "ACTIVE", new)]
    # The versions' shape (§3) derives the shards' ids, parents and keys the database holds.
    parent, child = document_versions(doc)
    assert (child.parent_version, child.parent_shard_count) == (1, old)
    db_parents = dict(Shard.objects.filter(version__stream__name=stream, version__version=2)
                      .values_list("shard_id", "parents"))
    assert child.shard_ids() == v2
    assert parent.shard_ids() == v1
    for j in range(new):
        lo, hi = hash_range(j, new)
        expected = [v1[i] for i in range(old) if hash_range(i, old)[0] < hi and lo < hash_range(i, old)[1]]
        assert child.parents(j) == expected == db_parents[v2[j]]
        assert child.keys(j).sealed == ShardKeys(v2[j], default_key_prefix()).sealed
    assert describe_group(fx.group)["streamState"] == "PREPARING"

    # R7: behind on metadata → SYNC_METADATA with the full document, then OK; no child yet.
    for m in w.members():
        r = m.beat()
        assert r["status"] == "SYNC_METADATA"
        assert [v["version"] for v in r["metadata"]["versions"]] == [1, 2]
        assert m.beat()["status"] == "OK"
    w.check()
    # A drained report before the seal does not count (the shard may still get appends).
    a = w.groups[fx.group][0]
    a.beat(drained=(a.owned[0],))
    assert not ShardAssignment.objects.filter(drained_at__isnull=False).exists()
    assert not stream_redis.exists(ShardKeys(v1[0], default_key_prefix()).sealed)

    # §6.2: the sweep seals v: markers in Redis (in each shard's slot), then SEALED, DRAINING.
    result = run_all_sweeps()
    assert result["resharding"][stream]["sealed"] == [1]
    assert result["resharding"][stream]["state"] == "DRAINING"
    for sid in v1:
        assert stream_redis.exists(ShardKeys(sid, default_key_prefix()).sealed)
    assert not any(stream_redis.exists(ShardKeys(sid, default_key_prefix()).sealed) for sid in v2)
    doc = routing(api, fx)
    assert doc["state"] == "DRAINING"
    assert [v["state"] for v in doc["versions"]] == ["SEALED", "ACTIVE"]
    assert run_all_sweeps()["resharding"][stream] == {"waiting": {"1": {fx.group: old, f"{stream}-g2": old}}}
    for m in w.members():
        assert m.beat()["status"] == "SYNC_METADATA"
        assert m.beat()["status"] == "OK"

    # §6.3 in g1: drain parents one by one; children follow only when all their parents are drained.
    g1 = fx.group
    for parent in v1:
        w.drain(g1, parent)
        drained = {p for p in v1 if ShardAssignment.objects.get(group__name=g1, shard__shard_id=p).drained_at}
        held = {s for m in w.groups[g1] for s in m.owned}
        for child in v2:
            parents = set(ShardAssignment.objects.get(group__name=g1, shard__shard_id=child).shard.parents)
            assert (child in held) == (parents <= drained), (child, parents, drained)
    assert {s for m in w.groups[g1] for s in m.owned} == set(v2)
    # g2 has not drained: v1 stays (and g2 still reads it).
    assert run_all_sweeps()["resharding"][stream] == {"waiting": {"1": {f"{stream}-g2": old}}}
    assert Stream.objects.get(name=stream).state == "DRAINING"
    assert set(w.groups[f"{stream}-g2"][0].owned) == set(v1)

    for parent in v1:
        w.drain(f"{stream}-g2", parent)
    assert set(w.groups[f"{stream}-g2"][0].owned) == set(v2)

    # §6.4: every group drained v1 and nobody holds it: retired, STABLE, its slots gone.
    result = run_all_sweeps()["resharding"][stream]
    assert result == {"retired": [1], "state": "STABLE"}
    assert ShardVersion.objects.get(stream__name=stream, version=1).state == "RETIRED"
    assert not ShardAssignment.objects.filter(shard__version__version=1, group__stream__name=stream).exists()
    doc = routing(api, fx)
    assert doc["state"] == "STABLE"
    assert [v["version"] for v in doc["versions"]] == [2]
    assert describe_group(fx.group)["streamState"] == "STABLE"
    for m in w.members():
        r = m.beat()
        assert r["status"] == "SYNC_METADATA"
        assert [v["version"] for v in r["metadata"]["versions"]] == [2]
        assert m.beat()["status"] == "OK"
    w.settle()
    assert run_all_sweeps()["resharding"] == {}
    kinds = list(Event.objects.filter(stream__name=stream, group__isnull=True).order_by("id").values_list("kind", flat=True))
    assert kinds == ["reshard_started", "reshard_sealing", "version_sealed", "version_retired"]


def test_s6_sealing_state_is_visible_and_retried_when_redis_is_down(api: APIClient, stream_redis: redis.Redis):
    fx = make_group(stream="rs-down", group="rs-down-g", shards=2)
    start_reshard(fx.stream, 3)
    with override_settings(STREAM_REDIS_URL="redis://127.0.0.1:1/0"):
        result = run_all_sweeps()["resharding"]["rs-down"]
    assert result["state"] == "SEALING"
    assert "seal markers not written" in result["error"]
    doc = routing(api, fx)
    assert doc["state"] == "SEALING"
    assert [v["state"] for v in doc["versions"]] == ["ACTIVE", "ACTIVE"]
    assert Group.objects.get(name="rs-down-g").metadata_epoch == 2  # only the start raised it
    result = run_all_sweeps()["resharding"]["rs-down"]
    assert result["state"] == "DRAINING"
    assert result["sealMarkers"] == 2
    assert stream_redis.exists(*(ShardKeys(f"rs-down:1:{i}", default_key_prefix()).sealed for i in range(2))) == 2
    assert Group.objects.get(name="rs-down-g").metadata_epoch == 3


def test_s6_stream_without_members_or_groups_retires_at_once(stream_redis: redis.Redis):
    from groups.services import create_stream

    create_stream("rs-lonely", 2)
    start_reshard("rs-lonely", 5)
    assert run_all_sweeps()["resharding"]["rs-lonely"] == {
        "state": "STABLE", "sealed": [1], "sealMarkers": 2, "retired": [1],
    }
    assert Stream.objects.get(name="rs-lonely").write_version == 2
    # A second reshard is accepted once STABLE again.
    assert start_reshard("rs-lonely", 1).version == 3


def test_s6_group_created_mid_reshard_gets_the_new_version(api: APIClient, stream_redis: redis.Redis):
    fx = make_group(stream="rs-late", group="rs-late-g1", shards=2)
    start_reshard(fx.stream, 4)
    create_group("rs-late-g2", fx.stream)
    ids = set(ShardAssignment.objects.filter(group__name="rs-late-g2").values_list("shard__shard_id", flat=True))
    assert ids == {f"rs-late:1:{i}" for i in range(2)} | {f"rs-late:2:{j}" for j in range(4)}
    # Simulate the race where the group missed the new version: the sweep repairs it.
    ShardAssignment.objects.filter(group__name="rs-late-g2", shard__version__version=2).delete()
    epoch = Group.objects.get(name="rs-late-g2").metadata_epoch
    run_all_sweeps()  # seals
    run_all_sweeps()  # drains (repairs)
    assert ShardAssignment.objects.filter(group__name="rs-late-g2", shard__version__version=2).count() == 4
    assert Group.objects.get(name="rs-late-g2").metadata_epoch > epoch


def _member_thread(group: str, member_id: str, stop: threading.Event, errors: list[str]) -> None:
    """A member on its own thread and DB connection: C1–C5, REVOKED at once, and it reports
    every sealed shard it owns as drained (as if read to the end)."""
    epoch, metadata_epoch = 0, None
    owned: list[str] = []
    to_revoke: list[str] = []
    sealed: set[str] = set()
    try:
        while not stop.is_set():
            req = HeartbeatRequest(
                member_id=member_id, member_epoch=epoch, metadata_epoch=metadata_epoch,
                owned_shards=tuple(owned),
                revoking_shards=tuple(RevokeReport(s, RevokeState.REVOKED) for s in to_revoke),
                drained_shards=tuple(s for s in owned if s in sealed),
            )
            result = heartbeat(group, req, timezone.now())
            r = result.response
            if r.error_code != "NONE":
                errors.append(f"{member_id}: {r.error_code} {r.error_message}")
                return
            assert r.assignment is not None
            assert result.metadata is not None
            epoch, metadata_epoch = r.member_epoch, result.metadata["metadataEpoch"]
            if "versions" in result.metadata:
                sealed = {s for v in document_versions(result.metadata) if v.state == "SEALED"
                          for s in v.shard_ids()}
            to_revoke = list(r.assignment.revoking)
            owned = [s for s in owned if s in r.assignment.assigned]
            if r.status == "OK":
                owned = sorted(set(owned) | set(r.assignment.assigned))
            stop.wait(0.005)  # pacing only
    except Exception as exc:  # e.g. a deadlock error would land here
        errors.append(f"{member_id}: {exc!r}")
    finally:
        connections.close_all()


def _poll(condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_s6_reshard_while_members_heartbeat_concurrently(stream_redis: redis.Redis):
    """Heartbeats on their own connections race every reshard step (locks, no deadlock);
    the stream still ends STABLE with every child owned once."""
    make_group(stream="rs-race", group="rs-race-g", shards=4, heartbeat_interval_ms=50)
    stop, errors = threading.Event(), []
    threads = [threading.Thread(target=_member_thread, args=("rs-race-g", m, stop, errors)) for m in ("a", "b", "c")]
    for t in threads:
        t.start()
    try:
        owned = ShardAssignment.objects.filter(group__name="rs-race-g", owner__isnull=False)
        _poll(lambda: owned.count() == 4 and not errors, "v1 granted")
        start_reshard("rs-race", 3)

        def advanced() -> bool:
            run_all_sweeps()
            return Stream.objects.get(name="rs-race").state == "STABLE" or bool(errors)

        _poll(advanced, "the reshard to finish")
        _poll(lambda: owned.filter(shard__version__version=2).count() == 3 or bool(errors), "v2 granted")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert errors == []
    assert set(owned.values_list("shard__shard_id", flat=True)) == {"rs-race:2:0", "rs-race:2:1", "rs-race:2:2"}


def test_i23_2_group_metadata_is_one_document_per_metadata_epoch_across_sealing(stream_redis: redis.Redis):
    """PREPARING -> SEALING raises only the stream's epoch: a process that built the group's
    document before it and one that builds it after must serve the same document."""
    from coordinator_project.process_state import PROCESS
    from groups import metadata

    fx = make_group(stream="rs-doc", group="rs-doc-g", shards=2)
    start_reshard(fx.stream, 3)
    before = metadata.group_metadata(Group.objects.select_related("stream").get(name=fx.group))
    with override_settings(STREAM_REDIS_URL="redis://127.0.0.1:1/0"):
        assert run_all_sweeps()["resharding"]["rs-doc"]["state"] == "SEALING"
    PROCESS.reset()  # another process: nothing cached
    group = Group.objects.select_related("stream").get(name=fx.group)
    assert group.metadata_epoch == before["metadataEpoch"]
    assert metadata.group_metadata(group) == before
