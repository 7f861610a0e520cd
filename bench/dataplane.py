"""Data-plane throughput against raw redis-py, measured in the same run (ratios, not absolutes).

    .venv/bin/python bench/dataplane.py [--messages 200000] [--shards 4] [--count 100]

Consumer: the runtime with a no-op handler, sync (worker threads), ``async def`` (event
loop lanes) and a no-op batch handler (``batch=True``, worker threads), shards granted directly through its seam, no coordinator, vs a raw loop of
XREADGROUP COUNT n over the same shard streams + one XACK per stream and batch: the same
messages, the same COUNT, the same BLOCK, each in a group of its own. The runtime's time runs
from its grant (fence raise, group creation, recovery included) until Redis shows every
message ACKed (polled every 10 ms, one round trip). Rounds alternate raw and runtime; the
figure is the best round of each, and the per-round ratios show the spread. Producer:
Producer.send_many (routing via a local stub endpoint, Lua append that checks the seal
marker) vs raw pipelined XADD, same batch size. Needs only Redis; uses $REDIS_URL (default
db 9) with a unique key prefix, and deletes its keys afterwards. Prints the load average:
on a busy machine the threaded runtime loses more than the single-threaded raw loop.
``--gc freeze`` (the default) calls gc.freeze() once before the rounds, for the raw loops and
the library alike, as ``rsc-dataplane consume`` does after its start-up; ``--gc default``
measures with the collector as Python starts it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.membership import Grant
from dataplane.producer import Producer
from dataplane.routing import ShardKeys, ShardVersion
from dataplane.runtime import Runtime, RuntimeConfig


def fill(r: redis.Redis, streams: list[str], n: int, keys: int = 1000) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(streams[i % len(streams)], {"key": f"k{i % keys}", "v": "x" * 32})
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()


def raw_consume(url: str, streams: list[str], group: str, total: int, count: int) -> float:
    r = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
    for s in streams:
        r.xgroup_create(s, group, id="0")
    done = 0
    t0 = time.perf_counter()
    while done < total:
        reply = r.xreadgroup(group, "raw", {s: ">" for s in streams}, count=count, block=100)
        if not reply:
            continue
        pipe = r.pipeline(transaction=False)
        for stream, entries in reply:
            pipe.xack(stream, group, *[e[0] for e in entries])
            done += len(entries)
        pipe.execute()
    dt = time.perf_counter() - t0
    r.close()
    return total / dt


def runtime_consume(
    url: str,
    prefix: str,
    shards: list[str],
    group: str,
    total: int,
    count: int,
    workers: int,
    is_async: bool = False,
    batch: bool = False,
) -> float:
    r = redis.Redis.from_url(url, decode_responses=True)
    streams = [ShardKeys(s, prefix).stream for s in shards]

    def noop(msg: object) -> None:
        pass

    async def async_noop(msg: object) -> None:
        pass

    def batch_noop(msgs: list[object]) -> None:
        pass

    cfg = RuntimeConfig(workers=workers, batch_size=count, block_ms=100)
    handler = batch_noop if batch else async_noop if is_async else noop
    rt = Runtime(url, group, "bench", handler, cfg, batch=batch)  # type: ignore[arg-type]
    rt.start()
    t0 = time.perf_counter()
    for s in shards:
        k = ShardKeys(s, prefix)
        rt.grant(Grant(s, 1, "bench", k.stream, k.sealed, "0", prefix))

    def finished() -> bool:
        # One round trip for all streams: the poll competes with the runtime for the GIL and
        # the server, which the raw loop does not have to share with anything.
        pipe = r.pipeline(transaction=False)
        for st in streams:
            pipe.xinfo_groups(st)
        acked = 0
        for groups in pipe.execute(raise_on_error=False):
            info = [] if isinstance(groups, Exception) else [g for g in groups if g["name"] == group]
            if not info:
                return False  # the runtime has not created the group yet
            acked += (info[0]["entries-read"] or 0) - info[0]["pending"]
        return acked >= total

    while not finished():
        time.sleep(0.01)  # polling the outcome (<1% of a run), not synchronising the code
    dt = time.perf_counter() - t0
    rt.stop()
    r.close()
    return total / dt


def raw_produce(url: str, streams: list[str], total: int, batch: int) -> float:
    r = redis.Redis.from_url(url, decode_responses=True)
    t0 = time.perf_counter()
    sent = 0
    i = 0
    while sent < total:
        pipe = r.pipeline(transaction=False)
        for _ in range(min(batch, total - sent)):
            pipe.xadd(streams[i % len(streams)], {"key": f"k{i}", "v": "x" * 32})
            i += 1
        pipe.execute()
        sent += batch
    dt = time.perf_counter() - t0
    r.close()
    return total / dt


class RoutingStub:
    def __init__(self, doc: dict) -> None:
        body = json.dumps(doc).encode()

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def producer_throughput(url: str, prefix: str, nshards: int, total: int, batch: int) -> float:
    stub = RoutingStub(
        {
            "stream": "bp",
            "writeVersion": 1,
            "metadataEpoch": 1,
            "state": "STABLE",
            "hash": "blake2b-64",
            "keyPrefix": prefix,
            "versions": [ShardVersion("bp", 1, nshards, key_prefix=prefix).document()],
        }
    )
    p = Producer(stub.url, "bp", "bench", redis_url=url)
    p.routing()
    items = [(f"k{i}", {"v": "x" * 32}) for i in range(total)]
    t0 = time.perf_counter()
    for j in range(0, total, batch):
        p.send_many(items[j : j + batch])
    dt = time.perf_counter() - t0
    p.close()
    stub.close()
    return total / dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/9"))
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--count", type=int, default=100, help="XREADGROUP COUNT for both")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=500, help="producer batch for both")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds, best of each")
    ap.add_argument("--gc", choices=("freeze", "default"), default="freeze",
                    help="freeze: gc.freeze() once before the rounds, for the raw loops and the "
                         "library alike, as `rsc-dataplane consume` does after start-up; default: "
                         "the collector as Python starts it")
    args = ap.parse_args()

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(args.redis, decode_responses=True)
    shards = [f"bc:1:{i}" for i in range(args.shards)]
    streams = [ShardKeys(s, prefix).stream for s in shards]
    load_before = os.getloadavg()
    try:
        fill(r, streams, args.messages)
        if args.gc == "freeze":
            gc.freeze()
        raw_c, rt_c, rt_a, rt_b, raw_p, dp_p = [], [], [], [], [], []
        for rnd in range(args.rounds):
            raw_c.append(raw_consume(args.redis, streams, f"raw{rnd}", args.messages, args.count))
            rt_c.append(
                runtime_consume(
                    args.redis, prefix, shards, f"rt{rnd}", args.messages, args.count, args.workers
                )
            )
            rt_a.append(
                runtime_consume(
                    args.redis, prefix, shards, f"ra{rnd}", args.messages, args.count, args.workers, True
                )
            )
            rt_b.append(
                runtime_consume(args.redis, prefix, shards, f"rb{rnd}", args.messages,
                                args.count, args.workers, batch=True)
            )
            raw_p.append(
                raw_produce(
                    args.redis,
                    [f"{prefix}:rawp:{{{i}}}" for i in range(args.shards)],
                    args.messages,
                    args.batch,
                )
            )
            dp_p.append(producer_throughput(args.redis, prefix, args.shards, args.messages, args.batch))
        c_ratio = max(rt_c) / max(raw_c)
        a_ratio = max(rt_a) / max(raw_c)
        b_ratio = max(rt_b) / max(raw_c)
        p_ratio = max(dp_p) / max(raw_p)
        print(
            f"messages={args.messages} shards={args.shards} count={args.count} "
            f"workers={args.workers} producer_batch={args.batch} rounds={args.rounds} gc={args.gc}"
        )
        load_after = os.getloadavg()
        print(
            f"load average (1/5/15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}, "
            f"after: {' '.join(f'{x:.2f}' for x in load_after)}  ({os.cpu_count()} CPUs)"
        )
        print(
            f"consumer raw XREADGROUP+XACK : {max(raw_c):>10,.0f} msg/s  "
            f"(rounds {', '.join(f'{x:,.0f}' for x in raw_c)})"
        )
        print(
            f"consumer dataplane runtime  : {max(rt_c):>10,.0f} msg/s  "
            f"(rounds {', '.join(f'{x:,.0f}' for x in rt_c)})"
        )
        print(
            f"consumer ratio              : {c_ratio:.2f}x  (goal >= 0.8x; per round "
            f"{', '.join(f'{c / w:.2f}' for c, w in zip(rt_c, raw_c, strict=True))})"
        )
        print(
            f"consumer runtime, async def : {max(rt_a):>10,.0f} msg/s  "
            f"(rounds {', '.join(f'{x:,.0f}' for x in rt_a)})"
        )
        print(
            f"consumer async ratio        : {a_ratio:.2f}x  (goal >= 0.7x; per round "
            f"{', '.join(f'{c / w:.2f}' for c, w in zip(rt_a, raw_c, strict=True))})"
        )
        print(
            f"consumer runtime, batch     : {max(rt_b):>10,.0f} msg/s  "
            f"(rounds {', '.join(f'{x:,.0f}' for x in rt_b)})"
        )
        print(
            f"consumer batch ratio        : {b_ratio:.2f}x  (batch_handler, no-op; per round "
            f"{', '.join(f'{c / w:.2f}' for c, w in zip(rt_b, raw_c, strict=True))})"
        )
        print(
            f"producer raw pipelined XADD : {max(raw_p):>10,.0f} msg/s  "
            f"(rounds {', '.join(f'{x:,.0f}' for x in raw_p)})"
        )
        print(
            f"producer dataplane          : {max(dp_p):>10,.0f} msg/s  "
            f"(rounds {', '.join(f'{x:,.0f}' for x in dp_p)})"
        )
        print(f"producer ratio              : {p_ratio:.2f}x  (goal >= 1.0x)")
    finally:
        keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
        for j in range(0, len(keys), 500):
            r.delete(*keys[j : j + 500])
        r.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
