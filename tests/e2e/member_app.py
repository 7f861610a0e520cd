"""A member application built on ``dataplane.Consumer`` directly (not the CLI), for what the
CLI cannot reach: the idempotency helper lives on the Consumer object.

    python -m tests.e2e.member_app --coordinator URL --group G --api-key K --redis URL \
        --member-id ID [--max-deliveries N]

Handler: the failures of ``handlers.check_failure``, then the idempotency marker on the
message's ``event`` field guards a side effect (``INCR <E2E_RESULTS>:effect:<event>``), then
the handling is recorded with ``first=1|0``.
"""

from __future__ import annotations

import argparse
import logging
import os

from dataplane import Consumer, Message

from . import handlers


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--coordinator", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--api-key", required=True)
    p.add_argument("--redis", required=True)
    p.add_argument("--member-id", required=True)
    p.add_argument("--max-deliveries", type=int, default=3)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    results = os.environ["E2E_RESULTS"]
    r = handlers.client()
    consumer: Consumer

    def handle(msg: Message) -> None:
        handlers.check_failure(msg)
        event = msg.fields["event"]
        first = consumer.idempotency_marker(msg, event, 120_000)
        if first:
            r.incr(f"{results}:effect:{event}")
        handlers.record(msg, first=int(first))

    consumer = Consumer(
        args.coordinator,
        args.group,
        args.api_key,
        handle,
        redis_url=args.redis,
        member_id=args.member_id,
        workers=2,
        max_deliveries=args.max_deliveries,
        retry_backoff_ms=20,
    )
    consumer.run()


if __name__ == "__main__":
    main()
