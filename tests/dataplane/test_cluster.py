"""Runtime and producer on a real (throw-away, local) Redis Cluster: per-shard scripts work
because every key of a shard shares its hash tag; reads go per node."""

from __future__ import annotations

import threading

from redis.cluster import RedisCluster

from dataplane import Producer
from dataplane.message import Message
from dataplane.routing import ShardKeys
from dataplane.runtime import Runtime, RuntimeConfig

from .conftest import make_grant, routing_doc, version_doc, wait_until


def test_consume_and_produce_on_cluster(cluster_url, coordinator) -> None:
    prefix = "cl"
    rc = RedisCluster.from_url(cluster_url, decode_responses=True)
    shards = [f"orders:1:{i}" for i in range(6)]
    nodes = {rc.get_node_from_key(ShardKeys(s, prefix).stream).name for s in shards}
    assert len(nodes) > 1  # the shards really spread over several nodes
    version = version_doc("orders", 1, 6, prefix)
    coordinator.routing = routing_doc("orders", prefix, version, write=1)
    with Producer(coordinator.url, "orders", "k", redis_url=cluster_url, cluster=True) as p:
        sent = p.send_many([(f"k{i}", {"n": str(i)}) for i in range(300)])
    assert len({s.shard for s in sent}) == 6
    seen: dict[str, list[int]] = {}
    lock = threading.Lock()

    def handler(msg: Message) -> None:
        with lock:
            seen.setdefault(msg.key, []).append(int(msg.fields["n"]))

    rt = Runtime(cluster_url, "g", "m-1", handler, RuntimeConfig(block_ms=100), cluster=True)
    rt.start()
    try:
        for s in shards:
            rt.grant(make_grant(prefix, s))
        wait_until(lambda: sum(map(len, seen.values())) >= 300, what="consumed on cluster")
        wait_until(
            lambda: all(
                rc.xpending(ShardKeys(s, prefix).stream, "g")["pending"] == 0 for s in shards
            ),
            what="acked on cluster",
        )
        assert rc.get(ShardKeys(shards[0], prefix).fence("g")) == "1:m-1"
        # A sealed shard refuses appends on the cluster too.
        rc.set(ShardKeys(sent[0].shard, prefix).sealed, "1")
        wait_until(lambda: sent[0].shard in rt.drained_shards(), what="drained on cluster")
    finally:
        rt.stop()
        rc.close()
