"""Issue 8.4: database trouble answers 503 with Retry-After and the JSON error body, quickly.

Against a real gunicorn with the shipped config: a database that does not exist, one that
accepts TCP connections and never answers, and a statement stuck behind a lock.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests import plain_http

from .conftest import live_database_url, make_group, running_gunicorn

pytestmark = [pytest.mark.slow, pytest.mark.needs_postgres]

HEARTBEAT_BODY = {"memberId": "a", "memberEpoch": 0}


@pytest.fixture
def silent_database() -> Iterator[str]:
    """A TCP port that completes the handshake (kernel backlog) and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)  # never accept()ed: connections sit in the backlog, unanswered
        yield f"postgres://postgres@127.0.0.1:{listener.getsockname()[1]}/rsc"


def assert_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert int(r.headers["Retry-After"]) >= 1
    body = r.json()
    assert body["errorCode"] == "COORDINATOR_UNAVAILABLE"
    assert "database is unavailable" in body["errorMessage"]


def test_wrong_database_answers_503_with_retry_after_and_readyz_names_it(db: None, tmp_path: Path):
    missing = live_database_url().rsplit("/", 1)[0] + "/rsc_no_such_database"
    # Each request waits for a pooled connection until DB_POOL_TIMEOUT, then answers 503: 2 s
    # here instead of the shipped 15 s (three requests; the next test checks the bound).
    with running_gunicorn(DATABASE_URL=missing, DB_POOL_TIMEOUT="2", PROMETHEUS_MULTIPROC_DIR=str(tmp_path)) as server:
        r = plain_http.post(f"{server.url}/api/v1/groups/g1/heartbeat", json=HEARTBEAT_BODY,
                       headers={"Authorization": "Bearer rsc_whatever"}, timeout=30)
        assert_unavailable(r)
        assert_unavailable(plain_http.get(f"{server.url}/api/v1/groups/g1",
                                     headers={"Authorization": "Bearer rsc_whatever"}, timeout=30))
        ready = plain_http.get(f"{server.url}/readyz", timeout=30)
        assert ready.status_code == 503
        assert ready.json()["status"] == "unavailable"
        assert ready.json()["checks"]["database"] == "error: OperationalError"
        assert ready.json()["checks"]["redis"] == "ok"


def test_database_that_never_answers_gives_503_within_the_connect_timeout(
    db: None, tmp_path: Path, silent_database: str
):
    # The request waits for a pooled connection that cannot be made: DB_POOL_TIMEOUT, 4 s here
    # instead of the shipped 15 s, bounds it; connect attempts end after DB_CONNECT_TIMEOUT.
    with running_gunicorn(DATABASE_URL=silent_database, DB_CONNECT_TIMEOUT="2", DB_POOL_TIMEOUT="4",
                          PROMETHEUS_MULTIPROC_DIR=str(tmp_path)) as server:
        started = time.monotonic()
        r = plain_http.post(f"{server.url}/api/v1/groups/g1/heartbeat", json=HEARTBEAT_BODY,
                       headers={"Authorization": "Bearer rsc_whatever"}, timeout=30)
        elapsed = time.monotonic() - started
        assert_unavailable(r)
        assert elapsed < 20, f"took {elapsed:.1f} s"  # DB_POOL_TIMEOUT, not a hang
        # /healthz does no I/O and the worker was not killed: it answers at once.
        assert plain_http.get(f"{server.url}/healthz", timeout=2).status_code == 200


def test_statement_stuck_behind_a_lock_answers_503_after_the_statement_timeout(
    transactional_db: None, tmp_path: Path
):
    fx = make_group(stream="locked", group="locked-g")
    with running_gunicorn(DB_STATEMENT_TIMEOUT_MS="500", PROMETHEUS_MULTIPROC_DIR=str(tmp_path)) as server, \
            psycopg.connect(live_database_url().replace("postgres://", "postgresql://"), autocommit=False) as holder:
        url = f"{server.url}/api/v1/groups/{fx.group}/heartbeat"
        headers = {"Authorization": f"Bearer {fx.key}"}
        # Another transaction holds the group's row lock (a stuck writer): the join waits on it.
        holder.execute("SELECT 1 FROM groups_group WHERE name = %s FOR UPDATE", (fx.group,))
        started = time.monotonic()
        r = plain_http.post(url, json=HEARTBEAT_BODY, headers=headers, timeout=30)
        elapsed = time.monotonic() - started
        assert_unavailable(r)
        assert elapsed < 5, f"took {elapsed:.1f} s"
        holder.rollback()  # the lock is gone: the member's retry succeeds
        r = plain_http.post(url, json=HEARTBEAT_BODY, headers=headers, timeout=10)
        assert r.status_code == 200
        assert r.json()["errorCode"] == "NONE"

