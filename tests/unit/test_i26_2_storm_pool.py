"""Issue 26.2: the 10k storm's shared connections go to members in the order they asked.

With asyncio.Queue a member that put its connection back and asked again at once (a
revocation reported at once) took it ahead of the joins already waiting."""
from __future__ import annotations

import asyncio

from bench.heartbeat import FairPool


def test_i26_2_storm_pool_serves_waiters_before_a_member_asking_again() -> None:
    async def run() -> list[str]:
        pool = FairPool(["conn"])
        order: list[str] = []

        async def member(name: str, again: bool) -> None:
            conn = await pool.get()
            order.append(name)
            await asyncio.sleep(0)
            pool.put(conn)
            if again:  # reports its revocation at once, as bench.heartbeat's members do
                conn = await pool.get()
                order.append(name)
                pool.put(conn)

        await asyncio.gather(member("a", True), member("b", False), member("c", False))
        return order

    assert asyncio.run(run()) == ["a", "b", "c", "a"]
