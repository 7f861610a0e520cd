"""Wrong-password admin logins as fast as they are answered, in a process of its own (issue 27.2).

`python tests/integration/login_flood.py URL SECONDS ADDRESS[,ADDRESS...] PER_ADDRESS` opens
PER_ADDRESS clients from each source address, each fetching the login form once (its CSRF
token) and then posting wrong passwords for "root". It prints "started" once every client has its
token and the server has answered a few of their logins (the hashing is under way; waiting for
half of them cost ~30 password hashes per run before measuring anything), floods for SECONDS more, and prints its tally as one JSON line (status code
or exception name -> count). A process of its own, so that the flood's client work never
shares a GIL with the heartbeat probe that measures the server.
"""
from __future__ import annotations

import asyncio
import json
import re
import sys
import time

import httpx

from dataplane.transport import tls_context

MODE = sys.argv[5] if len(sys.argv) > 5 else "post"
ANSWERED_BEFORE_START = 4
TLS = tls_context()  # one for the 60 clients (plain http), not one per transport


async def _client(url: str, source: str, stop: asyncio.Event, stats: dict[str, int], ready: list[str]) -> None:
    transport = httpx.AsyncHTTPTransport(local_address=source, verify=TLS)
    async with httpx.AsyncClient(base_url=url, transport=transport, timeout=60) as client:
        token = ""
        while not stop.is_set() and not token:
            try:
                page = await client.get("/admin/login/")
                found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
                token = found.group(1) if found else ""
            except httpx.HTTPError:
                await asyncio.sleep(0.2)
        ready.append(source)
        n = 0
        while not stop.is_set():
            n += 1
            try:
                if MODE == "get":  # the same clients, the form only: no password check (a comparison)
                    r = await client.get("/admin/login/")
                    stats[str(r.status_code)] = stats.get(str(r.status_code), 0) + 1
                    continue
                r = await client.post("/admin/login/?next=/admin/", data={
                    "csrfmiddlewaretoken": token, "username": "root", "password": f"wrong-{source}-{n}",
                    "next": "/admin/"})
                key = str(r.status_code)
            except httpx.HTTPError as exc:
                key = type(exc).__name__
            stats[key] = stats.get(key, 0) + 1


async def main(url: str, seconds: float, addresses: list[str], per_address: int) -> dict[str, int]:
    stats: dict[str, int] = {}
    ready: list[str] = []  # one entry per client that has its token and is posting
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_client(url, a, stop, stats, ready)) for a in addresses for _ in range(per_address)]
    deadline = time.monotonic() + 60
    while (len(ready) < len(tasks) or sum(v for k, v in stats.items() if k.isdigit()) < ANSWERED_BEFORE_START) \
            and time.monotonic() < deadline:
        await asyncio.sleep(0.1)  # poll: the flood is answering logins before the probe starts
    print("started", flush=True)
    stats.clear()  # the tally covers the flood's measured part only
    await asyncio.sleep(seconds)
    tally = dict(stats)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return tally


if __name__ == "__main__":
    url, seconds, addresses, per_address = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(","), int(sys.argv[4])
    print(json.dumps(asyncio.run(main(url, seconds, addresses, per_address))), flush=True)
