"""Heartbeat benchmark: one group of 1,000 members over 4,096 shards on gunicorn + PostgreSQL.

Prints, from one run on this machine:
- assignor time for 1,000 × 10,000 and 10,000 × 100,000 (pure Python);
- the time for 1,000 members joining from zero to reach a stable assignment (members answer
  revocations at once, as the data-plane client does; each has a keep-alive connection of
  its own, bench/http11.py; STORM_CONNECTIONS=n shares n);
- steady-state heartbeats/s and p50/p99 latency under wrk (32 connections), beside two
  reference endpoints on the same server — a DRF view with no database (the ceiling) and the
  naive group-row-lock design — as ratios, right after the join storm (planner statistics as
  the storm left them) and again after an explicit ANALYZE; heartbeat and ceiling run in
  BENCH_ROUNDS (3) rounds side by side, in alternating order, and the ratio is the rounds'
  median (this machine's speed drifts ±20 % over seconds even when idle);
- the same after-ANALYZE heartbeat and ceiling on a second server with the other worker class
  (sync if the shipped gevent is measured, and the reverse), each against its own ceiling;
- for reference, the after-ANALYZE rounds again on a server whose steady heartbeats skip
  their freshness read (bench/unsafe.py, never in production): what that read costs;
- R9 checked in the database after the load.

BENCH_SCALE=10k runs the same for 10,000 members over 16,384 shards, the storm's members on 256
shared connections (issue 26), with that size's goals and the settings docs/OPERATING.md gives
for a fleet that size (the per-key join rate off; a 3 s join-batching window, R1b, as the
10,000 joins take ~8-10 s to answer, past 5 windows of the default 1 s;
BENCH_REBALANCE_WINDOW_MS overrides it), and adds: each gunicorn worker's RSS
after the storm and after BENCH_SOAK_SECONDS (60) of steady heartbeats; the CPU share of
PostgreSQL, the workers and wrk during a steady run (heartbeats per second per core, for the
sizing in docs/OPERATING.md). It leaves out the second worker class and the freshness-read
reference (a run stays well under 10 minutes).

    make bench-heartbeat      (DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/rsc_bench;
                               the database is dropped and recreated)
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Sizes and their goals: members, shards, storm connections, storm goal (s), steady ratio goal.
SCALES: dict[str, tuple[int, int, int, float, float]] = {
    "1k": (1000, 4096, 0, 10, 0.85),  # issue 23's "still meets its goals": >= 0.85x, as at 10k
    "10k": (10_000, 16_384, 256, 30, 0.85),
}
SCALE = os.environ.get("BENCH_SCALE") or "1k"
if SCALE not in SCALES:
    raise SystemExit(f"BENCH_SCALE must be one of {', '.join(SCALES)}, got {SCALE!r}")
_members, _shards, _storm, STORM_GOAL_S, RATIO_GOAL = SCALES[SCALE]
LARGE = SCALE != "1k"
MEMBERS = int(os.environ.get("BENCH_MEMBERS", _members))
SHARDS = int(os.environ.get("BENCH_SHARDS", _shards))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", 32))
DURATION = int(os.environ.get("BENCH_SECONDS", 10))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", 3))  # steady heartbeat and ceiling, side by side
# The join storm: 0 = a connection per member, as in production.
STORM_CONNECTIONS = int(os.environ.get("STORM_CONNECTIONS", _storm))
# Join batching's window (R1b) for the storm: the 10k group takes ~9 s only to answer its
# 10,000 joins, past 5 windows of the default 1 s (docs/OPERATING.md, sizing).
STORM_WINDOW_MS = os.environ.get("BENCH_REBALANCE_WINDOW_MS", "3000" if LARGE else "")
SOAK_SECONDS = int(os.environ.get("BENCH_SOAK_SECONDS", 60))  # BENCH_SCALE=10k: RSS after this
DB_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rsc_bench")


def recreate_database(url: str) -> None:
    """Drop and create the bench's database, after unlinking the Redis keys of the streams the
    old one held: each run's installation has a prefix of its own, so a dropped database left
    its shard streams (16,384 at 10k) in the stream Redis for good, and every later SCAN of that
    database walked them (the test suite's cleanups in database 0: 141,598 such keys after a
    day of runs made SCAN three quarters of Redis's CPU)."""
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin = parsed._replace(path="/postgres").geturl()
    forget_stream_keys(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def forget_stream_keys(url: str) -> int:
    """UNLINK every key under the installation prefixes (`rsc-<id8>`) of the streams the
    database at `url` holds, in the stream Redis the bench uses; how many went."""
    import psycopg
    import redis

    from bench.redis_keys import delete_keys

    try:
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT DISTINCT key_prefix FROM groups_stream").fetchall()
    except psycopg.Error:  # no such database, or not migrated (a run stopped early): no streams
        return 0
    prefixes = [p for (p,) in rows if p.startswith("rsc-")]  # never a shared plain "rsc"
    client = redis.Redis.from_url(os.environ.get("STREAM_REDIS_URL")
                                  or os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    try:
        return sum(delete_keys(client, f"{prefix}:*") for prefix in prefixes)
    finally:
        client.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, **overrides: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, DATABASE_URL=DB_URL, ROOT_URLCONF="bench.urls", LOG_LEVEL="WARNING", **overrides)
    # The shipped gunicorn config (workers from WEB_CONCURRENCY, Prometheus multiprocess mode).
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "coordinator_project/gunicorn_conf.py",
         "coordinator_project.wsgi", "-b", f"127.0.0.1:{port}", "--log-level", "warning",
         "--backlog", "2048"],
        cwd=ROOT, env=env,
    )
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("gunicorn did not start")


_servers: dict[str, int] = {}  # URL -> gunicorn master pid, for the workers' RSS and CPU


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                    out.append(int(entry.name))
    return sorted(out)


def rss_mb(pid: int) -> float:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) / 1024
    return 0.0


def worker_rss(url: str) -> str:
    return ", ".join(f"{rss_mb(pid):.0f} MB" for pid in children(_servers[url]))


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (and of their reaped children), in seconds."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def postgres_pids() -> list[int]:
    """The backends connected to the bench's database (PostgreSQL's shared background
    processes and other databases' backends are not counted; on this machine others run)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return [pid for (pid,) in cur.fetchall()]


@contextlib.contextmanager
def serving(wait: float = 60, **overrides: str) -> Iterator[str]:
    """A server of the shipped config on a free port (`start_server`), as its URL; stopped on
    exit: its workers write their last batch of last-seen stamps first, and are killed if that
    takes more than `wait` seconds."""
    port = free_port()
    server = start_server(port, **overrides)
    url = f"http://127.0.0.1:{port}"
    _servers[url] = server.pid
    try:
        yield url
    finally:
        _servers.pop(url, None)
        server.terminate()
        try:
            server.wait(wait)
        except subprocess.TimeoutExpired:
            server.kill()


class SimMember:
    def __init__(self, member_id: str) -> None:
        self.member_id = member_id
        self.epoch = 0
        self.metadata_epoch: int | None = None
        self.owned: list[str] = []
        self.revoked: list[str] = []
        self.stable = False
        self.joined = False

    def body(self) -> dict[str, Any]:
        return {
            "memberId": self.member_id, "memberEpoch": self.epoch, "metadataEpoch": self.metadata_epoch,
            "ownedShards": self.owned,
            "revokingShards": [{"shard": s, "state": "REVOKED"} for s in self.revoked],
        }

    def apply(self, data: dict[str, Any]) -> None:
        if data["errorCode"] != "NONE":
            raise RuntimeError(f"{self.member_id}: {data['errorCode']} {data['errorMessage']}")
        self.epoch = data["memberEpoch"]
        self.metadata_epoch = data["metadata"]["metadataEpoch"]
        a = data["assignment"]
        assigned = set(a["assignedShards"])
        self.revoked = list(a["revokingShards"])  # nothing in flight: REVOKED at once (C1)
        self.owned = sorted(s for s in self.owned if s in assigned)
        if data["status"] == "OK":
            self.owned = sorted(assigned)
        # A join may be answered with an empty assignment while its target waits for the batch
        # window (R1b): with at least as many shards as members, nobody is settled empty-handed.
        self.stable = (data["status"] == "OK" and not a["pendingShards"] and not a["revokingShards"]
                       and data["memberEpoch"] == data["assignmentEpoch"]
                       and (bool(a["assignedShards"]) or SHARDS < MEMBERS))


_METADATA = b',"metadata":'
_METADATA_EPOCH = re.compile(rb'\{"metadataEpoch":(-?\d+)[,}]')


def answer(body: bytes) -> dict[str, Any]:
    """A heartbeat answer as a simulated member needs it: every field, and of the metadata
    document only its metadataEpoch. This one process stands for 1,000 members, and each join
    answer carries the whole document (~800 KB for 4,096 shards); parsing them all here took
    a core (json or orjson alike) and set the storm's pace instead of the coordinator. The
    coordinator writes `metadata` last, starting with its metadataEpoch; anything else fails."""
    cut = body.rfind(_METADATA)
    if cut < 0:
        return json.loads(body)  # an error answer has no metadata
    match = _METADATA_EPOCH.match(body, cut + len(_METADATA))
    if match is None:
        raise RuntimeError(f"unexpected metadata in the answer: {body[cut:cut + 80]!r}")
    data = json.loads(body[:cut] + b"}")
    data["metadata"] = {"metadataEpoch": int(match.group(1))}
    return data


class FairPool:
    """The storm's shared connections, handed out strictly in the order they were asked for.

    asyncio.Queue is not fair: a connection put back wakes the first waiter, but a task that
    asks before that waiter runs takes it, and the woken waiter queues again at the end. In
    the storm the member that just put its connection back and reports a revocation at once
    (or whose heartbeat timer fires) always asked first, so heartbeats of joined members kept
    overtaking the joins still waiting: joins answered over ~23 s instead of the ~8 s the
    server needs for 10,000 of them, and each late join (past R1b's 5 W cap) cost a recompute.
    With a connection each, as in production, a request waits behind those sent before it."""

    def __init__(self, conns: list[Any]) -> None:
        self._free: deque[Any] = deque(conns)
        self._waiters: deque[asyncio.Future[Any]] = deque()

    async def get(self) -> Any:
        if self._free and not self._waiters:
            return self._free.popleft()
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return await waiter

    def put(self, conn: Any) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._free.append(conn)

    def drain(self) -> list[Any]:
        conns, self._free = list(self._free), deque()
        return conns


async def converge(url: str, group: str, key: str) -> tuple[float, int, float]:
    """All members join at once, then heartbeat as the data plane does: every
    heartbeatIntervalMs, and at once when a revocation is to be reported (C1). Each member has
    a keep-alive connection of its own, as each is a process of its own in production
    (STORM_CONNECTIONS=n shares n among them). Returns the time until every member holds its
    whole target at one epoch, the heartbeats sent, and the time the joins alone took."""
    from bench.http11 import Connection, TransportError

    members = [SimMember(f"m{i:04d}") for i in range(MEMBERS)]
    parsed = urlparse(url)
    headers = {"Authorization": f"Bearer {key}"}
    pool = FairPool([Connection(parsed.hostname or "127.0.0.1", parsed.port or 80, headers)
                     for _ in range(min(MEMBERS, STORM_CONNECTIONS or MEMBERS))])
    path = f"/api/v1/groups/{group}/heartbeat"
    requests = 0
    joined = 0
    unsettled = {m.member_id for m in members}
    epochs: Counter[int] = Counter()
    joins_done = asyncio.Event()
    settled = asyncio.Event()
    failures: list[str] = []
    transport_errors = [0]

    async def live(m: SimMember) -> None:
        try:
            await heartbeats(m)
        except Exception as e:  # a member that fails ends the run, loudly
            failures.append(f"{m.member_id}: {e!r}")
            joins_done.set()
            settled.set()

    async def heartbeats(m: SimMember) -> None:
        nonlocal requests, joined
        while not settled.is_set():
            conn = await pool.get()
            try:
                status, headers, body = await conn.post(path, json.dumps(m.body()).encode())
            except TransportError:
                # The data plane retries a dropped connection after a backoff (same body).
                transport_errors[0] += 1
                await asyncio.sleep(0.5)
                continue
            finally:
                pool.put(conn)
            requests += 1
            if status in (429, 503):  # RATE_LIMITED, COORDINATOR_UNAVAILABLE: retried after Retry-After
                transport_errors[0] += 1
                await asyncio.sleep(float(headers.get("retry-after", 1)))
                continue
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
            data = answer(body)
            del body  # nothing of the answer outlives this step (1,000 members wait at once)
            epochs[m.epoch] -= 1
            m.apply(data)
            epochs[m.epoch] += 1
            if m.epoch and not m.joined:
                m.joined = True
                joined += 1
                if joined == len(members):
                    joins_done.set()
            if m.stable:
                unsettled.discard(m.member_id)
            else:
                unsettled.add(m.member_id)
            if not unsettled and epochs[m.epoch] == len(members):
                settled.set()
            if m.revoked:
                continue  # a revocation is reported at once, like the data plane does
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(settled.wait(), data["heartbeatIntervalMs"] / 1000)

    epochs[0] = len(members)
    start = time.monotonic()
    tasks = [asyncio.ensure_future(live(m)) for m in members]
    await joins_done.wait()
    joins = time.monotonic() - start
    try:
        await asyncio.wait_for(settled.wait(), 600)
    finally:
        elapsed = time.monotonic() - start
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn in pool.drain():
            await conn.close()
    if failures:
        raise SystemExit(f"{len(failures)} members failed, first: {failures[0]}")
    if transport_errors[0]:
        print(f"   ({transport_errors[0]} dropped connections, 429s or 503s retried, as the data plane does)")
    return elapsed, requests, joins


def single_join_cost(group: str, samples: int = 40) -> dict[str, dict[str, float]]:
    """Coordinator time (service call, in this process) of one join into the settled group
    and of the leave that undoes it: the first join loads the snapshot, the rest catch up.
    Every join and leave here recomputes the target at once (batch window 0): the figure is
    a join's whole cost, not a join whose recompute some later heartbeat pays (R1b)."""
    from django.test import override_settings
    from django.utils import timezone

    from assignments import services, snapshot_cache
    from coordination.model import HeartbeatRequest
    from groups.models import Group

    meta = Group.objects.get(name=group).metadata_epoch

    def timed(epoch: int) -> float:
        req = HeartbeatRequest(member_id="extra", member_epoch=epoch, metadata_epoch=meta)
        t = time.perf_counter()
        result = services.heartbeat(group, req, timezone.now())
        elapsed = (time.perf_counter() - t) * 1000
        assert result.response.error_code.value == "NONE", result.response
        return elapsed

    def pct(values: list[float], p: float) -> float:
        return sorted(values)[min(len(values) - 1, int(len(values) * p))]

    # This process also drove the storm: its 1,000 simulated members and their answers are not
    # the coordinator's heap, and a collection walking them is not coordinator time. Frozen,
    # as a gunicorn worker freezes its loaded app (gunicorn_conf.py).
    gc.collect()
    gc.freeze()
    out: dict[str, dict[str, float]] = {}
    for label, enabled in (("without snapshots", False), ("with snapshots", True)):
        snapshot_cache.forget_snapshots()
        joins, leaves = [], []
        with override_snapshots(enabled), override_settings(RSC_REBALANCE_WINDOW_MS=0):
            for _ in range(samples + 1):
                joins.append(timed(0))
                leaves.append(timed(-1))
        first = joins.pop(0)
        out[label] = {"first": first, "join": pct(joins, 0.5), "join_p95": pct(joins, 0.95),
                      "leave": pct(leaves, 0.5)}
    return out


def override_snapshots(enabled: bool):
    from django.test import override_settings

    return override_settings(RSC_GROUP_SNAPSHOTS=enabled)


def wrk(url: str, path: str, key: str, bodies_file: str, duration: int = 0) -> dict[str, float]:
    env = dict(os.environ, BODIES_FILE=bodies_file, BENCH_PATH=path, BENCH_KEY=key)
    out = subprocess.run(
        ["wrk", "-t", "2", "-c", str(CONNECTIONS), "-d", f"{duration or DURATION}s", "--latency", "-s",
         str(ROOT / "bench" / "wrk_bodies.lua"), url],
        env=env, capture_output=True, text=True, check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def pct(p: str) -> float:
        m = re.search(rf"\s{p}%\s+([\d.]+)(us|ms|s)", out)
        value, unit = float(m.group(1)), m.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value

    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    return {"rps": rps, "p50_ms": pct("50"), "p99_ms": pct("99"),
            "non2xx": int(errors.group(1)) if errors else 0,
            "socket_errors": socket_errors.group(1) if socket_errors else ""}


HEARTBEAT = "/api/v1/groups/bench/heartbeat"


def show(label: str, r: dict[str, Any]) -> None:
    print(f"   {label:<32} {r['rps']:8.0f} req/s  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms"
          f"  non-2xx {r['non2xx']} {r['socket_errors']}")


def side_by_side(url: str, phase: str, key: str, bodies_file: str) -> dict[str, Any]:
    """ROUNDS pairs of heartbeat and ceiling on one server, the order alternating, so drift in
    this machine's speed (±20 % over seconds here, idle) lands on both sides of a ratio instead
    of on one measurement. The ratio is the median of the rounds' own ratios."""
    rounds = []
    for n in range(ROUNDS):
        order = (("heartbeat", HEARTBEAT), ("ceiling", "/bench/ceiling"))
        pair = {label: wrk(url, path, key, bodies_file) for label, path in (order if n % 2 == 0 else order[::-1])}
        for label in ("heartbeat", "ceiling"):
            show(f"{phase}, round {n + 1}: {label}", pair[label])
        rounds.append(pair)
    ratios = sorted(p["heartbeat"]["rps"] / p["ceiling"]["rps"] for p in rounds)
    p99s = sorted(p["heartbeat"]["p99_ms"] for p in rounds)
    return {"ratio": ratios[len(ratios) // 2], "ratios": ratios, "p99": p99s[len(p99s) // 2],
            "p99_max": p99s[-1], "rps": sorted(p["heartbeat"]["rps"] for p in rounds)[len(rounds) // 2],
            "non2xx": sum(p["heartbeat"]["non2xx"] for p in rounds)}


def freshness_read_cost(with_read: float, key: str, bodies_file: str) -> None:
    """What a steady heartbeat's one freshness read costs: the same measurement on a server
    whose workers read the group row once and then never again (bench/unsafe.py; never in
    production: such a worker misses every write made by another process). Every steady
    heartbeat waits for a read that started after it arrived (assignments.fastpath._GroupReads),
    so that it sees every write committed before it arrived; docs/decisions/0009 and
    bench/RESULTS.md (2026-12-03 19:20) have what that
    wait costs and why the database's share of it is small."""
    print("== reference: heartbeat without its freshness read (unsafe, bench only; after ANALYZE, same run)")
    with serving(RSC_BENCH_NO_FRESHNESS_READ="1") as url:
        wrk(url, HEARTBEAT, key, bodies_file)  # the new workers load their snapshots first
        fig = side_by_side(url, "without the read", key, bodies_file)
    print(f"   without the read: {fig['ratio']:.2f}x the ceiling (rounds {', '.join(f'{r:.2f}' for r in fig['ratios'])});"
          f" with it: {with_read:.2f}x. The difference is what the freshness guarantee costs.")


def compare_worker_class(shipped: str, key: str, bodies_file: str) -> None:
    """The same steady measurement on a second server with the other worker class (gevent is
    shipped for slow clients; sync is what it replaced), its own ceiling beside it: each
    ratio compares a heartbeat with a ceiling served by the same kind of worker."""
    other = "sync" if shipped == "gevent" else "gevent"
    with serving(WORKER_CLASS=other) as url:
        wrk(url, HEARTBEAT, key, bodies_file)  # the new workers load their snapshots first
        figures = {label: wrk(url, path, key, bodies_file)
                   for label, path in (("ceiling", "/bench/ceiling"), ("heartbeat", HEARTBEAT))}
    ceiling, ours = figures["ceiling"], figures["heartbeat"]
    print(f"== for comparison, {other} workers (after ANALYZE, same run)")
    for label, r in figures.items():
        show(label, r)
    print(f"   heartbeat on {other} workers: {ours['rps'] / ceiling['rps']:.2f}x its ceiling,"
          f" p99 {ours['p99_ms']:.1f} ms")


def cpu_shares(url: str, key: str, bodies_file: str) -> None:
    """Where a steady run's CPU goes: PostgreSQL's backends, the gunicorn workers and wrk, in
    cores (of os.cpu_count()), and heartbeats per second per core of workers + PostgreSQL."""
    before_pg = {pid: cpu_seconds([pid]) for pid in postgres_pids()}
    workers = children(_servers[url])
    before_workers = cpu_seconds(workers)
    before_wrk = os.times()
    started = time.monotonic()
    r = wrk(url, HEARTBEAT, key, bodies_file)
    wall = time.monotonic() - started
    after_wrk = os.times()
    pg = sum(cpu_seconds([pid]) - before_pg.get(pid, 0.0) for pid in postgres_pids()) / wall
    ours = (cpu_seconds(workers) - before_workers) / wall
    load = (after_wrk.children_user + after_wrk.children_system
            - before_wrk.children_user - before_wrk.children_system) / wall
    cores = os.cpu_count() or 1
    print(f"== CPU during a steady heartbeat run ({r['rps']:.0f} heartbeats/s, {cores} cores)")
    print(f"   PostgreSQL backends of this database {pg:.2f} cores ({pg / cores:.0%} of the machine),"
          f" gunicorn workers {ours:.2f} cores, wrk {load:.2f} cores")
    print(f"   CPU per heartbeat: workers {ours / r['rps'] * 1e6:.0f} us, PostgreSQL {pg / r['rps'] * 1e6:.0f} us;"
          f" {r['rps'] / max(ours + pg, 1e-9):.0f} heartbeats/s per core of coordinator + PostgreSQL")


def join_answer(url: str, group: str, key: str) -> None:
    """The size of a join answer over HTTP and a member's time to parse it (json.loads, the
    member library's parser), then the probe leaves again."""
    import httpx

    path = f"{url}/api/v1/groups/{group}/heartbeat"
    headers = {"Authorization": f"Bearer {key}"}
    r = httpx.post(path, json={"memberId": "probe", "memberEpoch": 0, "ownedShards": []}, headers=headers)
    r.raise_for_status()
    body = r.content
    parses = []
    for _ in range(200):
        started = time.perf_counter()
        json.loads(body)
        parses.append((time.perf_counter() - started) * 1e6)
    metadata = len(json.dumps(json.loads(body)["metadata"], separators=(",", ":")))
    print(f"== a join answer at {SHARDS} shards: {len(body)} bytes (its metadata {metadata} bytes),"
          f" parsed in {sorted(parses)[len(parses) // 2]:.0f} us (json.loads, p50)")
    httpx.post(path, json={"memberId": "probe", "memberEpoch": -1}, headers=headers).raise_for_status()


def main() -> None:
    if not shutil.which("wrk"):
        print("wrk not found; installing Debian's wrk")
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True)
    from bench.assignor import run as assignor_run

    print("== assignor (pure Python, median of 3)")
    figures = assignor_run(runs=3)
    for name, ms in figures.items():
        print(f"   {name:<32} {ms:8.1f} ms")

    recreate_database(DB_URL)
    os.environ["DATABASE_URL"] = DB_URL
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator_project.settings")
    os.environ.setdefault("SECRET_KEY", "bench-insecure-key")  # the server refuses to start without one
    # As the servers it starts: the single-join figure is not the time to print two INFO
    # event lines per join to this terminal.
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    from groups.services import create_api_key, create_group, create_stream

    call_command("migrate", verbosity=0)
    from django.test import override_settings

    with override_settings(MAX_SHARDS_PER_STREAM=max(SHARDS, 1024)):  # beyond the default cap
        create_stream("bench", SHARDS)
    # Room for one more: the single-join figure joins into the settled group.
    create_group("bench", "bench", max_members=MEMBERS + 1, session_timeout_ms=3_600_000,
                 rebalance_timeout_ms=3_600_000, heartbeat_interval_ms=3000)
    key = create_api_key(group="bench")
    from django.db import connection as _conn

    def analyze() -> None:
        with _conn.cursor() as cur:
            cur.execute("ANALYZE")

    analyze()  # the empty tables' statistics, as on a fresh install

    # 10,000 joins with one API key: past the default join rate (50/s per key and worker, a
    # burst of 1,000), which an operator of such a group raises (docs/OPERATING.md, sizing).
    storm_env = {"JOIN_RATE_PER_KEY": "0"} if LARGE else {}
    if STORM_WINDOW_MS:
        storm_env["RSC_REBALANCE_WINDOW_MS"] = STORM_WINDOW_MS
    with serving(**storm_env) as url:
        conns = f"{STORM_CONNECTIONS} shared connections" if STORM_CONNECTIONS else "a connection each"
        print(f"== {MEMBERS} members joining a group of {SHARDS} shards at once, heartbeats every 3 s"
              f" (revocations reported at once, {conns})")
        seconds, requests, joins = asyncio.run(converge(url, "bench", key))
        from groups.models import Event

        recomputes = Event.objects.filter(group__name="bench", kind="rebalanced").count()
        print(f"   stable after {seconds:.1f} s (goal <= {STORM_GOAL_S:.0f} s; all joins answered after {joins:.1f} s;"
              f" {requests} heartbeats; {recomputes} target recomputes)")
        print(f"   gunicorn worker RSS after the storm: {worker_rss(url)}")
        import httpx

        collector = httpx.get(f"{url}/bench/collector", timeout=10).json()
        print(f"   a worker's collector: thresholds {tuple(collector['threshold'])}, {collector['frozen']} objects"
              " frozen (decision 0027)")

        from groups.describe import describe_group

        doc = describe_group("bench", page_size=None)  # every member
        assert doc, doc and doc["state"]
        assert doc["state"] == "STABLE", doc and doc["state"]
        bodies = [
            json.dumps({"memberId": m["memberId"], "memberEpoch": m["memberEpoch"],
                        "metadataEpoch": doc["metadataEpoch"], "ownedShards": m["assignedShards"]})
            for m in doc["members"]
        ]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("\n".join(bodies) + "\n")
        workers = os.environ.get("WEB_CONCURRENCY", "the config's default")
        worker_class = os.environ.get("WORKER_CLASS", "gevent")
        print(f"== steady state under wrk: {CONNECTIONS} connections, {DURATION} s each, "
              f"gunicorn workers: {workers} × {worker_class} (the ceiling runs on the same server);"
              f" {ROUNDS} rounds of heartbeat and ceiling side by side, each round's ratio its own")
        results = {"heartbeat right after the storm": side_by_side(url, "after the storm", key, f.name)}
        analyze()
        results["heartbeat after ANALYZE"] = side_by_side(url, "after ANALYZE", key, f.name)
        # The naive reference last: it rewrites member rows through the ORM for 10 s (dead
        # tuples where autovacuum is off), so it runs after both measured phases, not between.
        naive = wrk(url, "/bench/naive", key, f.name)
        show("naive (group row lock via ORM)", naive)
        print("== ratios (same run; median of the rounds, each round's heartbeat against its own ceiling)")
        for label, fig in results.items():
            print(f"   {label}: {fig['ratio']:.2f}x the ceiling (goal >= {RATIO_GOAL}x; rounds "
                  f"{', '.join(f'{r:.2f}' for r in fig['ratios'])}), {fig['rps'] / naive['rps']:.1f}x naive,"
                  f" p99 {fig['p99']:.1f} ms (goal <= 50 ms; worst round {fig['p99_max']:.1f} ms)")
        if LARGE:
            cpu_shares(url, key, f.name)
            print(f"== {SOAK_SECONDS} s of steady heartbeats ({CONNECTIONS} connections)")
            show("soak", wrk(url, HEARTBEAT, key, f.name, duration=SOAK_SECONDS))
            print(f"   gunicorn worker RSS after it: {worker_rss(url)}")
        else:
            compare_worker_class(worker_class, key, f.name)
            freshness_read_cost(results["heartbeat after ANALYZE"]["ratio"], key, f.name)
        join_answer(url, "bench", key)

        print(f"== one join into the settled {MEMBERS} x {SHARDS} group (coordinator time, 40 joins and leaves)")
        for label, fig in single_join_cost("bench").items():
            print(f"   {label:<18} first join {fig['first']:6.1f} ms, then join p50 {fig['join']:5.1f} ms"
                  f" p95 {fig['join_p95']:5.1f} ms (goal <= 5 ms), leave p50 {fig['leave']:5.1f} ms")
        print(f"== load average during the run: {os.getloadavg()[0]:.1f} (2 cores)")

        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("""SELECT count(*) FROM assignments_shardassignment a JOIN members_member m
                           ON m.id = a.owner_id WHERE m.status NOT IN ('STABLE','REVOKING','PENDING')""")
            stale = cur.fetchone()[0]
            cur.execute("SELECT count(*) FROM assignments_shardassignment WHERE owner_id IS NOT NULL")
            owned = cur.fetchone()[0]
        doc = describe_group("bench", page_size=None)  # every member
        held = [s for m in doc["members"] for s in m["assignedShards"] + m["revokingShards"]]
        r9 = stale == 0 and len(held) == len(set(held)) == owned == SHARDS and sum(fig["non2xx"] for fig in results.values()) == 0
        print(f"== R9 after the load: {owned} shards owned, {len(set(held))} distinct, "
              f"{stale} held by non-live members, group {doc['state']}: {'OK' if r9 else 'VIOLATED'}")
        os.unlink(f.name)
        if not r9:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
