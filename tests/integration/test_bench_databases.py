"""The benches recreate their PostgreSQL database on every run (bench.heartbeat.recreate_database),
and each run's installation has a Redis key prefix of its own. Dropping the database used to
leave that prefix's shard streams (16,384 at 10k) in the stream Redis for good: after a day of
runs database 0 held 141,598 such keys, and every SCAN of it (the suite's cleanups) walked them.
Recreating a database now unlinks the keys of the streams it held, and no other key."""
from __future__ import annotations

import os
import uuid
from urllib.parse import urlparse

import psycopg
import pytest
import redis

from bench.heartbeat import recreate_database
from tests.integration.conftest import live_database_url

pytestmark = pytest.mark.needs_postgres


def test_recreating_a_bench_database_unlinks_the_stream_keys_it_held_and_no_other():
    url = urlparse(live_database_url())
    name = f"rsc_bench_hygiene_{uuid.uuid4().hex[:8]}"
    bench_url = url._replace(path=f"/{name}").geturl()
    admin = url._replace(path="/postgres").geturl()
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    mine, other = f"rsc-{uuid.uuid4().hex[:8]}", f"rsc-{uuid.uuid4().hex[:8]}"
    ours = [f"{mine}:{{bench:1:{i}}}" for i in range(2500)] + [f"{mine}:identity"]
    kept = [f"{other}:{{bench:1:0}}", "rsc:{bench:1:0}"]  # another installation's; a shared plain prefix
    try:
        recreate_database(bench_url)  # new: nothing to forget
        with psycopg.connect(bench_url, autocommit=True) as conn:  # the one column it reads
            conn.execute("CREATE TABLE groups_stream (key_prefix varchar(64))")
            conn.execute("INSERT INTO groups_stream VALUES (%s), (%s)", (mine, "rsc"))
        client.mset({key: "x" for key in ours + kept})
        recreate_database(bench_url)
        assert client.exists(*ours) == 0
        assert client.exists(*kept) == len(kept)
        with psycopg.connect(bench_url) as conn:  # and the database is new and empty
            assert conn.execute("SELECT to_regclass('groups_stream')").fetchone() == (None,)
    finally:
        client.unlink(*ours, *kept)
        client.close()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
