"""Issue 27.1: connections without a key cannot exhaust a node.

A real gunicorn with the shipped config and 2 × 40 slots (WORKER_CONNECTIONS=40) faces more
clients than slots, all on loopback, from addresses other than the prober's (127.0.0.2-12;
Linux routes all of 127/8 to loopback): clients that trickle a login body (Content-Length
100000, a byte every 2 s), and polite keep-alive clients that send a request every 3.5 s and
stay idle in between. The probes start only once the kernel shows every slot held
(/proc/net/tcp: 80 connections accepted by the workers), and the slots are still held at the
end. Meanwhile a client that connected after them keeps its heartbeats' p99 <= 100 ms, and
members arriving during the attack (a new connection each, every 0.5 s) are answered within
1 s. Run with WORKER_CLASS=gevent (the stock worker), the same test fails on the arrivals:
80 accepted and 250 waiting in the listen backlog when the probes start, 5 arrivals in the
attack, the slowest after 15.3 s, one given up after three 5 s read timeouts. The kept-alive
probe alone does not tell the two apart (p99 19 ms on the stock worker: once accepted, it
keeps its slot). The suite checks the stock worker's starvation itself in the quicker
test_i27_1_a_newcomer_while_slow_bodies_hold_every_slot[stock].

On a loaded machine (the suite's other workers) the bound is this machine's own noise: the
probe's p99 alone, before and after the attack, times NOISE_FACTOR, when that is above 100 ms;
and the probe runs until it has sent MIN_HEARTBEATS (within PROBE_DEADLINE_S), not for a fixed
time that a slow machine fills with fewer.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from dataplane.transport import CoordinatorUnavailable, Transport
from tests import plain_http

from .conftest import make_group, poll, running_gunicorn
from .probes import p50_p99_ms, probe_heartbeats

pytestmark = [pytest.mark.slow, pytest.mark.needs_postgres]

SLOTS_PER_WORKER = 40
SLOW_ADDRESSES = [f"127.0.0.{i}" for i in range(2, 7)]  # 5 × 30 trickling clients
IDLE_ADDRESSES = [f"127.0.0.{i}" for i in range(7, 13)]  # 6 × 30 keep-alive clients
PER_ADDRESS = 30
ATTACK_SECONDS = 14.0
MIN_HEARTBEATS = 201
PROBE_DEADLINE_S = 120.0
P99_LIMIT_MS = 100.0
NOISE_FACTOR = 3.0
LOADED_LIMIT_MS = 500.0  # the bound when the machine is over-committed (see the test)
# Dropped clients come back after 2 s: an attack that holds connections (what 27.1 is
# about), bounded in load; a flood of new connections is a firewall's or a proxy's matter.
RECONNECT_PAUSE = 2.0
ARRIVAL_EVERY_S = 0.5  # a new member connecting during the attack
MIN_ARRIVALS = 10
ARRIVAL_LIMIT_MS = 1_000.0  # connect + join answered; starvation costs the 5 s read timeouts
LOADED_ARRIVAL_LIMIT_MS = 2_500.0  # when the machine is over-committed: still under one timeout


def _slots_held(port: int) -> tuple[int, int]:
    """Connections to `port` that the server accepted (a worker holds them: a slot each) and
    that wait in its listen backlog, seen from the kernel's side (/proc/net/tcp): an
    ESTABLISHED socket not yet accepted has no file, so inode 0. Counts every client's."""
    accepted = queued = 0
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # local port, ESTABLISHED
                if fields[9] == "0":
                    queued += 1
                else:
                    accepted += 1
    return accepted, queued


async def _slow_body(port: int, source: str, stop: asyncio.Event, stats: dict[str, int]) -> None:
    """Holds a connection with a login body that never completes; reconnects when dropped."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        except OSError:
            await asyncio.sleep(0.5)
            continue
        stats["slow_opened"] += 1
        try:
            writer.write(b"POST /admin/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n")
            await writer.drain()
            while not stop.is_set() and not reader.at_eof():
                writer.write(b"a")
                await writer.drain()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(reader.read(4096), 2.0)
        except OSError:
            pass
        finally:
            writer.close()
        await asyncio.sleep(RECONNECT_PAUSE)


async def _idle_keepalive(port: int, source: str, stop: asyncio.Event, stats: dict[str, int]) -> None:
    """A polite client: GET /healthz every 3.5 s on one kept-alive connection; reconnects."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        except OSError:
            await asyncio.sleep(0.5)
            continue
        stats["idle_opened"] += 1
        try:
            while not stop.is_set():
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                await writer.drain()
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                if not head:
                    break
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) if b"Content-Length" in head else 0
                await reader.readexactly(length)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 3.5)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, IndexError):
            pass
        finally:
            writer.close()
        await asyncio.sleep(RECONNECT_PAUSE)


def _attack(port: int, stop_flag: threading.Event, started: threading.Event, stats: dict[str, int]) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(_slow_body(port, a, stop, stats))
                 for a in SLOW_ADDRESSES for _ in range(PER_ADDRESS)]
        tasks += [asyncio.create_task(_idle_keepalive(port, a, stop, stats))
                  for a in IDLE_ADDRESSES for _ in range(PER_ADDRESS)]
        started.set()  # the test waits until every slot is held (_slots_held)
        while not stop_flag.is_set():
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def _arrivals(server_url: str, key: str, group: str, stop: threading.Event, latencies: list[float],
              failures: list[object]) -> None:
    """Members arriving during the attack: every ARRIVAL_EVERY_S a new connection (a fresh
    Transport) sends one heartbeat of a member of its own, joining; the time from connect to
    answer. A client kept alive since before the slots filled proves little: the stock worker
    starves only those that connect while every slot is held. Each leaves at once after."""
    i = 0
    while not stop.is_set():
        i += 1
        t0 = time.perf_counter()
        with Transport(server_url, key) as transport:
            try:
                status, body = transport.heartbeat(group, {"memberId": f"arrival-{i}", "memberEpoch": 0})
                latencies.append(time.perf_counter() - t0)
                if status != 200:
                    failures.append(("arrival", status, body.get("errorCode")))
                else:  # leaves at once: the group stays the probe's
                    transport.heartbeat(group, {"memberId": f"arrival-{i}", "memberEpoch": -1})
            except CoordinatorUnavailable as exc:
                latencies.append(time.perf_counter() - t0)
                failures.append(("arrival", repr(exc)))
        stop.wait(ARRIVAL_EVERY_S)


def _loopback_aliases_work() -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.2", 0))
        except OSError:
            return False
    return True


needs_loopback_aliases = pytest.mark.skipif(
    not _loopback_aliases_work() or not os.path.exists("/proc/net/tcp"),
    reason="127.0.0.2 cannot be bound here, or no /proc/net/tcp to count held connections")


@needs_loopback_aliases
def test_i27_1_slow_body_and_idle_connections_beyond_the_slots_leave_heartbeats_fast(
    transactional_db: None, tmp_path: Path
):
    fx = make_group(stream="exhaust", group="exhaust-g")
    env = {"WORKER_CONNECTIONS": str(SLOTS_PER_WORKER), "MAX_CONNECTIONS_PER_CLIENT": "12",
           "CONNECTION_CAP_EXEMPT": "", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    with running_gunicorn(**env) as server:
        port = int(server.url.rsplit(":", 1)[1])
        url = f"{server.url}/api/v1/groups/{fx.group}/heartbeat"
        headers = {"Authorization": f"Bearer {fx.key}"}
        r = plain_http.post(url, json={"memberId": "probe", "memberEpoch": 0}, headers=headers, timeout=10)
        epoch = r.json()["memberEpoch"]
        with Transport(server.url, fx.key) as transport:  # for the report: this machine's noise
            alone = probe_heartbeats(transport, fx.group, epoch, 3.0, [])
        stats = {"slow_opened": 0, "idle_opened": 0}
        stop, started = threading.Event(), threading.Event()
        attacker = threading.Thread(target=_attack, args=(port, stop, started, stats), daemon=True)
        attacker.start()
        held = (len(SLOW_ADDRESSES) + len(IDLE_ADDRESSES)) * PER_ADDRESS
        slots = 2 * SLOTS_PER_WORKER
        try:
            assert started.wait(30)
            # The premise, before any newcomer: every attacker has connected once and the
            # workers hold a full set of slots (on the stock worker the rest wait in the backlog).
            full = poll(lambda: stats["slow_opened"] + stats["idle_opened"] >= held
                         and _slots_held(port)[0] >= slots, 30)
            at_start = _slots_held(port)
            assert full, f"the attack did not hold every slot: (accepted, queued) {at_start}; {stats}"
            failures: list[object] = []
            arrived: list[float] = []
            arrivals_stop = threading.Event()
            arrivals = threading.Thread(target=_arrivals, args=(server.url, fx.key, fx.group, arrivals_stop,
                                                                arrived, failures), daemon=True)
            arrivals.start()
            # The member library's transport (one kept-alive connection, retries a connection
            # the server closed), created after the attack began.
            with Transport(server.url, fx.key) as transport:
                latencies = probe_heartbeats(transport, fx.group, epoch, ATTACK_SECONDS, failures,
                                             MIN_HEARTBEATS, PROBE_DEADLINE_S)
            # Still full at the end (the probe's and the arrivals' own connections count too).
            still_full = poll(lambda: _slots_held(port)[0] >= slots, 5)
            at_end = _slots_held(port)
            arrivals_stop.set()
            arrivals.join(60)
        finally:
            stop.set()
            attacker.join(30)
        with Transport(server.url, fx.key) as transport:  # the noise again, after the attack
            alone += probe_heartbeats(transport, fx.group, epoch, 3.0, [])
    assert held > slots  # more clients than slots
    (p50, p99), (alone_p50, alone_p99) = p50_p99_ms(latencies), p50_p99_ms(alone)
    print(f"alone: p50 {alone_p50:.1f} ms, p99 {alone_p99:.1f}"
          f" ms; {len(latencies)} heartbeats during the attack: p50 {p50:.1f} ms, p99 {p99:.1f} ms;"
          f" {len(arrived)} arrivals: slowest {max(arrived, default=0) * 1000:.0f} ms; {stats};"
          f" (accepted, queued) at the probe's start {at_start}, at its end {at_end}")
    assert still_full, f"the attack no longer held every slot at the end: {at_end}"
    assert not failures, failures[:5]
    assert len(arrived) >= MIN_ARRIVALS, f"{len(arrived)} arrivals answered during the attack"
    assert len(latencies) >= MIN_HEARTBEATS, f"{len(latencies)} heartbeats in {PROBE_DEADLINE_S} s"
    limit = max(P99_LIMIT_MS, NOISE_FACTOR * alone_p99)
    if os.getloadavg()[0] > (os.cpu_count() or 1):
        # The suite's other workers share the cores: the attack's own 2,000 connections then
        # cost the probe a few hundred ms at its tail (266 ms at p99 in one CI run, against 39 ms
        # alone). Exhaustion, what this test is for, costs seconds to minutes.
        limit = max(limit, LOADED_LIMIT_MS)
    assert p99 <= limit, f"heartbeat p99 {p99:.0f} ms over {len(latencies)} heartbeats (limit {limit:.0f} ms); {stats}"
    # Each arrival opens a connection, so its time includes a TCP and HTTP set-up; starved, it
    # waits out read timeouts of seconds (the stock worker: the backlog behind held slots).
    slowest = max(arrived) * 1000
    arrival_limit = LOADED_ARRIVAL_LIMIT_MS if os.getloadavg()[0] > (os.cpu_count() or 1) else ARRIVAL_LIMIT_MS
    assert slowest <= arrival_limit, f"an arrival waited {slowest:.0f} ms for its first answer; {stats}"


SHIPPED_WORKER = "webserver.worker.GuardedGeventWorker"
STOCK_WORKER = "gevent"
SMALL_SLOTS = 8  # per worker: a few connections fill a node, so this test is quick
NEWCOMER_LIMIT_S = 1.0
LOADED_NEWCOMER_LIMIT_S = 2.5
STARVED_AFTER_S = 3.0  # the stock worker's newcomer: no answer this long (slots held for 30 s)


@needs_loopback_aliases
@pytest.mark.parametrize(("worker_class", "starves"), [(SHIPPED_WORKER, False), (STOCK_WORKER, True)],
                         ids=["shipped", "stock"])
def test_i27_1_a_newcomer_while_slow_bodies_hold_every_slot(transactional_db: None, tmp_path: Path,
                                                             worker_class: str, starves: bool):
    """Both sides of 27.1 on one premise, checked from the server's side: more slow bodies
    (from 127.0.0.2) than the node's slots, every slot held, then a new client's heartbeat.
    The shipped worker answers it (a slow body is shed for it); the stock gevent worker does
    not (its connection waits in the listen backlog until a slot frees: here, after the 30 s
    body deadline). The stock case asserts the starvation, so this test fails if either the
    fix or the premise stops being true."""
    fx = make_group(stream="exhaust-n", group="exhaust-n-g")
    env = {"WORKER_CLASS": worker_class, "WORKER_CONNECTIONS": str(SMALL_SLOTS),
           "MAX_CONNECTIONS_PER_CLIENT": "100", "CONNECTION_CAP_EXEMPT": "", "BODY_READ_TIMEOUT_SECONDS": "30",
           "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    slots = 2 * SMALL_SLOTS
    holders: list[socket.socket] = []
    with running_gunicorn(**env) as server:
        port = int(server.url.rsplit(":", 1)[1])
        try:
            def hold() -> None:
                s = socket.socket()
                holders.append(s)
                s.bind(("127.0.0.2", 0))
                s.connect(("127.0.0.1", port))
                s.sendall(b"POST /admin/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\na")

            # The two workers take connections unevenly, and the shipped one refuses a worker's
            # excess (503): open slow bodies until both workers' slots are held, then a few more.
            deadline = time.monotonic() + 15
            while _slots_held(port)[0] < slots and len(holders) < 20 * slots and time.monotonic() < deadline:
                hold()
            for _ in range(SMALL_SLOTS):
                hold()
            full = poll(lambda: _slots_held(port)[0] >= slots, 15)
            accepted, queued = _slots_held(port)
            assert full, f"{len(holders)} slow bodies, {slots} slots: only {accepted} accepted ({queued} queued)"
            if starves:
                assert queued > 0, "the stock worker's slots are full: the rest wait in the backlog"
            t0 = time.perf_counter()
            try:
                r = plain_http.post(f"{server.url}/api/v1/groups/{fx.group}/heartbeat",
                               json={"memberId": "newcomer", "memberEpoch": 0},
                               headers={"Authorization": f"Bearer {fx.key}"}, timeout=STARVED_AFTER_S)
                answered: float | None = time.perf_counter() - t0
                status = r.status_code
            except httpx.TimeoutException:
                answered, status = None, 0
        finally:
            for s in holders:
                s.close()
    print(f"{worker_class}: {accepted} accepted, {queued} queued; newcomer answered"
          f" {'never' if answered is None else f'{answered * 1000:.0f} ms'} (status {status})")
    if starves:
        assert answered is None, f"the stock worker answered a newcomer in {answered:.2f} s with every slot held"
    else:
        limit = LOADED_NEWCOMER_LIMIT_S if os.getloadavg()[0] > (os.cpu_count() or 1) else NEWCOMER_LIMIT_S
        assert answered is not None, f"no answer to a newcomer within {STARVED_AFTER_S} s: starved"
        assert status == 200, f"newcomer answered {status}"
        assert answered <= limit, f"newcomer answered after {answered:.2f} s (limit {limit} s)"
