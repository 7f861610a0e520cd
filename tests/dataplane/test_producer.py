"""Producer routing and sealed-shard refusal on the real Redis, routing from a local stub."""

from __future__ import annotations

import socket
import threading

import pytest

from dataplane import Producer, ShardSealedError
from dataplane.routing import ShardKeys, hash64, shard_index

from .conftest import routing_doc, version_doc


def test_send_routes_by_hash64_and_writes_key_field(r, prefix, coordinator, redis_url) -> None:
    coordinator.routing = routing_doc(
        "orders", prefix, version_doc("orders", 1, 4, prefix), write=1
    )
    with Producer(coordinator.url, "orders", "secret", redis_url=redis_url) as p:
        sent = p.send("customer-7", {"amount": "12"})
        assert sent.shard == f"orders:1:{shard_index(hash64('customer-7'), 4)}"
        [(entry_id, fields)] = r.xrange(ShardKeys(sent.shard, prefix).stream)
        assert entry_id == sent.id
        assert fields == {"key": "customer-7", "amount": "12"}
        many = p.send_many([(f"k{i}", {"n": str(i)}) for i in range(200)])
    assert [s.shard for s in many] == [
        f"orders:1:{shard_index(hash64(f'k{i}'), 4)}" for i in range(200)
    ]
    total = sum(r.xlen(ShardKeys(f"orders:1:{i}", prefix).stream) for i in range(4))
    assert total == 201
    assert coordinator.auth[0] == "Bearer secret"


def test_sealed_shard_refused_then_retried_on_next_version(r, prefix, coordinator, redis_url):
    v1 = version_doc("orders", 1, 2, prefix)
    coordinator.routing = routing_doc("orders", prefix, v1, write=1)
    p = Producer(coordinator.url, "orders", "k", redis_url=redis_url)
    p.send("warm-up", {"n": "0"})  # routing v1 is cached now
    # Reshard: v2 is the write version and every v1 shard is sealed.
    v2 = version_doc("orders", 2, 4, prefix, parents=True)
    coordinator.routing = routing_doc("orders", prefix, v1, v2, write=2)
    for i in range(2):
        r.set(ShardKeys(f"orders:1:{i}", prefix).sealed, "1")
    v1_len = [r.xlen(ShardKeys(f"orders:1:{i}", prefix).stream) for i in range(2)]
    sent = p.send_many([(f"k{i}", {"n": str(i)}) for i in range(50)])
    assert all(s.shard.startswith("orders:2:") for s in sent)
    assert [r.xlen(ShardKeys(f"orders:1:{i}", prefix).stream) for i in range(2)] == v1_len
    assert sum(r.xlen(ShardKeys(f"orders:2:{i}", prefix).stream) for i in range(4)) == 50
    # Order within a key survives the retry.
    p.send_many([("same", {"n": str(i)}) for i in range(5)])
    shard = p.route("same").stream
    assert [f["n"] for _id, f in r.xrange(shard) if f["key"] == "same"] == [
        str(i) for i in range(5)
    ]
    p.close()


def test_sealed_without_new_version_gives_up(r, prefix, coordinator, redis_url) -> None:
    coordinator.routing = routing_doc(
        "orders", prefix, version_doc("orders", 1, 1, prefix), write=1
    )
    r.set(ShardKeys("orders:1:0", prefix).sealed, "1")
    with (
        Producer(coordinator.url, "orders", "k", redis_url=redis_url, retry_timeout_s=0.2) as p,
        pytest.raises(ShardSealedError),
    ):
        p.send("a", {"n": "1"})
    assert r.xlen(ShardKeys("orders:1:0", prefix).stream) == 0


def test_maxlen_trims_approximately(r, prefix, coordinator, redis_url) -> None:
    coordinator.routing = routing_doc(
        "orders", prefix, version_doc("orders", 1, 1, prefix), write=1
    )
    with Producer(coordinator.url, "orders", "k", redis_url=redis_url, maxlen=100) as p:
        for _ in range(10):
            p.send_many([("a", {"n": "1"})] * 100)
    assert r.xlen(ShardKeys("orders:1:0", prefix).stream) < 400


def test_run_many_loads_a_script_the_server_does_not_know_and_runs_every_call(
    r, prefix, redis_url
) -> None:
    """scripts.run_many sends its calls in one write (not a redis-py pipeline): a NOSCRIPT
    reply (a restarted or failed-over server) loads the script and runs that call again."""
    from dataplane import scripts
    from dataplane.connections import redis_client

    # A script no other test loads: its SHA is unknown to the server until run_many loads it.
    lua = scripts.Lua(f"-- {prefix}\nreturn redis.call('INCRBY', KEYS[1], ARGV[1])")
    client = redis_client(redis_url)
    calls = [(lua, [f"{prefix}:{{n}}"], [i]) for i in (1, 2, 3)]
    assert scripts.run_many(client, calls) == [1, 3, 6]
    assert int(r.get(f"{prefix}:{{n}}")) == 6
    client.close()


class _DropFirstEvalsha:
    """A TCP relay to the real Redis that closes a connection, without forwarding it, the
    first time an EVALSHA comes through: a connection lost in the middle of a call."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.dropped = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, inspect: bool) -> None:
        try:
            while data := src.recv(65536):
                if inspect and not self.dropped and b"EVALSHA" in data:
                    self.dropped += 1
                    break
                dst.sendall(data)
        except OSError:
            pass  # the other direction closed it
        for s in (src, dst):
            s.close()

    def close(self) -> None:
        self.server.close()


def test_send_many_whose_connection_drops_mid_call_is_retried_on_a_new_one(
    r, prefix, coordinator, redis_url
) -> None:
    """A connection lost while the script calls are on their way is retried on a new
    connection, as the client's pipeline retried it (the client's Retry). The relay dropped
    the calls unsent, so each message is appended once."""
    coordinator.routing = routing_doc(
        "orders", prefix, version_doc("orders", 1, 2, prefix), write=1
    )
    kw = r.connection_pool.connection_kwargs
    relay = _DropFirstEvalsha(kw["host"], kw["port"])
    url = f"redis://127.0.0.1:{relay.port}/{kw.get('db', 0)}"
    try:
        with Producer(coordinator.url, "orders", "k", redis_url=url) as p:
            sent = p.send_many([(f"k{i}", {"n": str(i)}) for i in range(40)])
    finally:
        relay.close()
    assert relay.dropped == 1
    assert len({(s.shard, s.id) for s in sent}) == 40
    assert sum(r.xlen(ShardKeys(f"orders:1:{i}", prefix).stream) for i in range(2)) == 40
