"""A static member (PROTOCOL.md §9): ``dataplane.Consumer(..., instance_id=...)`` with the
recording handler, until SIGTERM (then it drains in-flight work and sends memberEpoch -2).

    python -m tests.e2e.static_member --coordinator URL --group G --api-key K --redis URL \
        --member-id ID --instance-id INSTANCE

(The CLI's ``--instance-id`` is added with the dataplane CLI work; this runner does not need it.)
"""

from __future__ import annotations

import argparse
import logging

from dataplane import Consumer

from . import handlers


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("--coordinator", "--group", "--api-key", "--redis", "--member-id", "--instance-id"):
        p.add_argument(name, required=True)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    Consumer(
        args.coordinator, args.group, args.api_key, handlers.record, redis_url=args.redis,
        member_id=args.member_id, instance_id=args.instance_id, workers=4, batch_size=50, block_ms=500,
    ).run()


if __name__ == "__main__":
    main()
