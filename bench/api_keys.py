"""Cost of the API key check on the hot path (issue 8.6): cached hit, DB lookup, unknown key.

Revocation must reach every worker within 1 s, so a resolved key is cached for 1 s: each
web worker pays one DB lookup per active key per second. This prints what that costs.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> .venv/bin/python -m bench.api_keys
(the database must be migrated; the script adds a stream `bench-keys` and keys to it)
"""
from __future__ import annotations

import os
import statistics
import time


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator_project.settings")
    import django

    django.setup()
    from groups.models import Stream
    from groups.services import (
        KEY_CACHE_SECONDS,
        clear_key_cache,
        create_api_key,
        create_stream,
        resolve_api_key,
    )

    if not Stream.objects.filter(name="bench-keys").exists():
        create_stream("bench-keys", 2)
    key = create_api_key(stream="bench-keys", name="bench")
    resolve_api_key(key)
    n = 200_000
    started = time.perf_counter()
    for _ in range(n):
        resolve_api_key(key)
    hit = (time.perf_counter() - started) / n
    misses = []
    for _ in range(500):
        clear_key_cache()
        started = time.perf_counter()
        resolve_api_key(key)
        misses.append(time.perf_counter() - started)
    misses.sort()
    median = statistics.median(misses)
    bad = "rsc_" + "x" * 43
    resolve_api_key(bad)
    started = time.perf_counter()
    for _ in range(n):
        resolve_api_key(bad)
    negative = (time.perf_counter() - started) / n
    print(f"cached hit:          {hit * 1e6:.2f} µs")
    print(f"DB lookup (miss):    median {median * 1e3:.3f} ms, p99 {misses[int(len(misses) * 0.99)] * 1e3:.3f} ms")
    print(f"refresh cost:        {median / KEY_CACHE_SECONDS * 100:.3f} % of one core per active key per worker")
    print(f"unknown key, cached: {negative * 1e6:.2f} µs")


if __name__ == "__main__":
    main()
