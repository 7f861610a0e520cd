"""Issues 24.4 and 27.4: a database that refuses, never answers or freezes gives a prompt 503
under the shipped gunicorn config (gevent workers, pooled connections), and a request that
was dropped is never applied later.

PostgreSQL is reached through a TCP proxy the test switches (tests/integration/tcp_proxy.py).
"""
from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from tests import plain_http

from .conftest import GroupFixture, LiveServer, live_database_url, make_group, running_gunicorn
from .tcp_proxy import Mode, TcpProxy, tcp_proxy

pytestmark = [pytest.mark.slow, pytest.mark.needs_postgres]


@pytest.fixture
def proxied(transactional_db: None, tmp_path: Path) -> Iterator[tuple[LiveServer, TcpProxy, GroupFixture]]:
    fx = make_group(stream="hang", group="hang-g")
    url = urlsplit(live_database_url())
    with tcp_proxy((url.hostname or "127.0.0.1", url.port or 5432)) as proxy:
        via_proxy = url._replace(netloc=f"{url.username}@127.0.0.1:{proxy.port}").geturl()
        with running_gunicorn(DATABASE_URL=via_proxy, DB_CONNECT_TIMEOUT="2",
                              PROMETHEUS_MULTIPROC_DIR=str(tmp_path)) as server:
            yield server, proxy, fx


def heartbeat(server: LiveServer, fx: GroupFixture, member: str, epoch: int = 0,
              timeout: float = 30) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    r = plain_http.post(f"{server.url}/api/v1/groups/{fx.group}/heartbeat",
                   json={"memberId": member, "memberEpoch": epoch},
                   headers={"Authorization": f"Bearer {fx.key}"}, timeout=timeout)
    return r, time.monotonic() - started


def assert_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert int(r.headers["Retry-After"]) >= 1
    assert r.json()["errorCode"] == "COORDINATOR_UNAVAILABLE"


def joined(server: LiveServer, fx: GroupFixture, member: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        r, _ = heartbeat(server, fx, member, timeout=10)
        if r.status_code == 200:
            return
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)  # poll interval of a deadline loop (the database is coming back)


def member_exists(member: str) -> bool:
    with psycopg.connect(live_database_url().replace("postgres://", "postgresql://"), autocommit=True) as c:
        return c.execute("SELECT 1 FROM members_member WHERE member_id = %s", (member,)).fetchone() is not None


def test_i24_4_refused_database_answers_503_within_1s_and_recovers(proxied):
    server, proxy, fx = proxied
    joined(server, fx, "warm")  # the pools are open and hold connections
    proxy.set_mode(Mode.REFUSE)
    timings = []
    for i in range(6):
        r, took = heartbeat(server, fx, f"m{i}")
        assert_unavailable(r)
        timings.append(took)
    assert max(timings) < 1.0, timings
    started = time.monotonic()
    ready = plain_http.get(f"{server.url}/readyz", timeout=30)
    assert ready.status_code == 503
    assert time.monotonic() - started < 1.0
    proxy.set_mode(Mode.PASS)
    back = time.monotonic()
    joined(server, fx, "after")
    assert time.monotonic() - back < 5, "the pool took too long to reconnect"


def test_i27_4_black_hole_database_answers_every_request_without_serialising_on_one_key(proxied):
    server, proxy, fx = proxied
    proxy.set_mode(Mode.BLACK_HOLE)  # the pools' first connections are accepted and never answered
    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        started = time.monotonic()
        results = list(pool.map(lambda i: heartbeat(server, fx, f"b{i}"), range(100)))
        took = time.monotonic() - started
    for r, _ in results:
        assert_unavailable(r)
    # Each request is done within the connect timeout (2 s) or the request deadline (5 s);
    # the old per-key lookup lock made them fail one after another, 15 s apart.
    assert took < 12, f"100 requests on one key took {took:.1f} s"
    ready_started = time.monotonic()
    assert plain_http.get(f"{server.url}/readyz", timeout=30).status_code == 503
    assert time.monotonic() - ready_started < 4.0


def test_i27_4_frozen_connection_answers_503_and_the_dropped_request_is_never_applied(proxied):
    server, proxy, fx = proxied
    joined(server, fx, "warm")
    proxy.set_mode(Mode.FREEZE)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        late = [pool.submit(heartbeat, server, fx, f"late{i}") for i in range(4)]
        ready_started = time.monotonic()
        ready = plain_http.get(f"{server.url}/readyz", timeout=30)
        ready_took = time.monotonic() - ready_started
        answers = [f.result() for f in late]
    assert ready.status_code == 503
    assert ready_took < 4.0, ready_took
    for r, took in answers:
        assert_unavailable(r)
        assert took < 8.0, took  # REQUEST_DEADLINE_SECONDS (5 s) and a margin for a loaded machine
    proxy.set_mode(Mode.PASS)  # the thaw: whatever the frozen connections carried arrives now
    joined(server, fx, "after")
    time.sleep(1.0)  # a request that survived the freeze would commit within this: not a poll target
    assert not any(member_exists(f"late{i}") for i in range(4))


def test_i27_10_a_database_that_refuses_costs_no_failed_lookup_tokens(proxied):
    """A lookup the database did not answer is no unknown key: more requests than the failed-
    lookup burst (AUTH_FAILURE_BURST_PER_IP, 20 per worker) all get 503, never 429 RATE_LIMITED,
    and the member is answered as soon as the database is back."""
    server, proxy, fx = proxied
    proxy.set_mode(Mode.REFUSE)  # before any lookup: no worker knows the key
    codes = [heartbeat(server, fx, f"r{i}")[0] for i in range(3 * 20 * 2)]
    for r in codes:
        assert_unavailable(r)
    proxy.set_mode(Mode.PASS)
    joined(server, fx, "after")
