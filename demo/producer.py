"""Demo producer: a few keyed messages per second until interrupted."""
from __future__ import annotations

import argparse
import itertools
import logging
import signal
import threading

from dataplane import Producer

log = logging.getLogger("demo.producer")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--rate", type=float, default=5.0, help="messages per second")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with Producer(args.coordinator, args.stream, args.api_key, redis_url=args.redis) as producer:
        for n in itertools.count():
            if stop.wait(1.0 / args.rate):
                break
            key = f"customer-{n % 17}"
            sent = producer.send(key, {"order": str(n), "amount": str(n % 100)})
            if n % 25 == 0:
                log.info("sent order %d for %s to %s", n, key, sent.shard)


if __name__ == "__main__":
    main()
