"""Rebalance listeners (Kafka's ``ConsumerRebalanceListener``; confluent-kafka's
``on_assign`` / ``on_revoke`` / ``on_lost``): what the application hears about its shards.

- ``on_assigned(shards)``: granted shards, before the runtime starts reading them;
- ``on_revoked(shards)``: shards handed over cleanly, after their in-flight work finished and
  was ACKed and before REVOKED is reported (C1): per-shard state may be flushed now, the next
  owner starts only after this returns;
- ``on_lost(shards)``: ownership lost without a clean hand-over (fence, session expiry, fence
  token taken, C4): another member may already own them, so the application must not flush.

Each is called with a sorted list of shard ids, from the thread that runs ``Consumer.run()``
(the heartbeat loop, like Kafka's ``poll()``), and may be ``async def``: it then runs on the
runtime's event loop for an async handler, else in a fresh one. Each shard is announced once
per ownership: a revocation that the coordinator cancels (the shard granted again) is neither
revoked nor assigned again. A listener that raises is logged with its traceback and the
protocol goes on as if it had returned: a grant is read, a revoked shard is reported REVOKED, a
lost shard stays lost. A listener holds up the heartbeat loop while it runs: keep it shorter
than the session timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

Listener = Callable[[list[str]], Any] | Callable[[list[str]], Awaitable[Any]]


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


class Listeners:
    def __init__(
        self,
        on_assigned: Listener | None = None,
        on_revoked: Listener | None = None,
        on_lost: Listener | None = None,
        *,
        loop: Callable[[], asyncio.AbstractEventLoop | None] = lambda: None,
    ) -> None:
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.on_lost = on_lost
        self._loop = loop  # the runtime's running event loop (async handler), if any
        self.held: set[str] = set()  # shards announced by on_assigned and not yet given up

    def assigned(self, shards: Iterable[str]) -> None:
        new = sorted(set(shards) - self.held)
        self.held.update(new)
        self._call("on_assigned", self.on_assigned, new)

    def revoked(self, shards: Iterable[str]) -> None:
        self._call("on_revoked", self.on_revoked, self._release(shards))

    def lost(self, shards: Iterable[str]) -> None:
        self._call("on_lost", self.on_lost, self._release(shards))

    def _release(self, shards: Iterable[str]) -> list[str]:
        gone = sorted(set(shards) & self.held)
        self.held.difference_update(gone)
        return gone

    def _call(self, name: str, fn: Listener | None, shards: list[str]) -> None:
        if fn is None or not shards:
            return
        try:
            result = fn(shards)
            if inspect.isawaitable(result):
                loop = self._loop()
                if loop is not None and loop.is_running():
                    asyncio.run_coroutine_threadsafe(_await(result), loop).result()
                else:
                    asyncio.run(_await(result))
        except Exception:
            log.exception("%s listener raised on %s; the protocol goes on regardless", name, shards)


__all__ = ["Listener", "Listeners"]
