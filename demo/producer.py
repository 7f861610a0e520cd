"""Demo producer: a few keyed messages per second until interrupted; a summary every few seconds."""
from __future__ import annotations

import argparse
import itertools
import logging
import os
import signal
import threading
import time
from collections import Counter

from dataplane import Producer

log = logging.getLogger("demo.producer")
SUMMARY_EVERY_S = 5.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--api-key", default=os.environ.get("RSC_API_KEY"),
                        help="the stream's key (default: RSC_API_KEY, which keeps it out of ps)")
    parser.add_argument("--redis", required=True)
    parser.add_argument("--rate", type=float, default=5.0, help="messages per second")
    args = parser.parse_args()
    if not args.api_key:
        parser.error("give --api-key or set RSC_API_KEY")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per routing request
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    by_shard: Counter[str] = Counter()
    last = time.monotonic()
    with Producer(args.coordinator, args.stream, args.api_key, redis_url=args.redis) as producer:
        for n in itertools.count():
            if stop.wait(1.0 / args.rate):
                break
            key = f"customer-{n % 17}"
            by_shard[producer.send(key, {"order": str(n), "amount": str(n % 100)}).shard] += 1
            if time.monotonic() - last >= SUMMARY_EVERY_S:
                shards = ", ".join(f"{s} {c}" for s, c in sorted(by_shard.items()))
                log.info("sent %d orders in the last %.0f s (%s); %d in all",
                         sum(by_shard.values()), time.monotonic() - last, shards, n + 1)
                by_shard.clear()
                last = time.monotonic()


if __name__ == "__main__":
    main()
