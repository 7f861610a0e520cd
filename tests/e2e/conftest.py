"""Fixtures for the end-to-end tests: real gunicorn coordinator on the test database, real
Redis, member processes (``python -m dataplane consume`` or ``tests.e2e.member_app``), the
periodic sweeps run from the test process (instead of Celery beat) while it polls.

Redis: ``settings.STREAM_REDIS_URL`` (REDIS_URL; the coordinator writes seal markers there),
a unique key prefix and stream name per test, its keys deleted afterwards (no FLUSHDB).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from dataplane import Producer, Sent
from dataplane.routing import ShardKeys, hash64, shard_index
from groups.describe import describe_group
from groups.models import Shard
from groups.services import create_api_key, create_group, create_stream
from groups.sweeps import run_all_sweeps
from tests import spawn
from tests.integration.conftest import LiveServer, _fresh_process_state, one_worker_gunicorn  # noqa: F401
from tests.redis_keys import delete_keys

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class MemberProc:
    member_id: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""


@dataclass
class Record:
    """One successful handling, as the handler wrote it to the result stream."""

    rid: str
    shard: str
    id: str
    key: str
    seq: int
    member: str
    dc: int
    extra: dict[str, str]


class Results:
    """The result stream read incrementally, in its (total) order."""

    def __init__(self, r: redis.Redis, key: str) -> None:
        self.r, self.key = r, key
        self.records: list[Record] = []
        self.first: dict[tuple[str, int], Record] = {}  # (key, seq) -> its first handling
        self.by_id: dict[tuple[str, str], list[Record]] = defaultdict(list)  # (shard, id) ->
        self._last = "-"

    def poll(self) -> int:
        while True:
            start = "-" if self._last == "-" else f"({self._last}"
            page = self.r.xrange(self.key, min=start, count=5000)
            for rid, f in page:
                rec = Record(
                    rid, f.pop("shard"), f.pop("id"), f.pop("key"), int(f.pop("seq") or -1),
                    f.pop("member"), int(f.pop("dc")), f,
                )
                f.pop("pid", None)
                self.records.append(rec)
                self.first.setdefault((rec.key, rec.seq), rec)
                self.by_id[(rec.shard, rec.id)].append(rec)
                self._last = rid
            if len(page) < 5000:
                return len(self.records)

    def of(self, sent: Sent) -> list[Record]:
        """The handlings of one produced message (entry ids are unique per shard only)."""
        return self.by_id[(sent.shard, sent.id)]

    def handled_by(self, member: str) -> int:
        return sum(1 for rec in self.records if rec.member == member)


class Ledger:
    """What was produced: per key a sequence number in produce order."""

    def __init__(self) -> None:
        self.next_seq: dict[str, int] = defaultdict(int)
        self.sent: list[tuple[str, int, Sent]] = []

    def items(self, keys: list[str], n: int, start: int = 0, **fields: str) -> list[tuple[str, dict[str, str]]]:
        out = []
        for i in range(n):
            key = keys[(start + i) % len(keys)]
            seq = self.next_seq[key]
            self.next_seq[key] += 1
            out.append((key, {"seq": str(seq), **fields}))
        return out

    def send(self, producer: Producer, items: list[tuple[str, dict[str, str]]]) -> list[Sent]:
        sent = producer.send_many(items)
        for (key, fields), s in zip(items, sent, strict=True):
            self.sent.append((key, int(fields["seq"]), s))
        return sent

    def produced(self) -> set[tuple[str, int]]:
        return {(k, s) for k, s, _ in self.sent}


class SteadyProducer(threading.Thread):
    """Sends small keyed batches (per-key seq) until stopped; paced, not flooding."""

    def __init__(self, producer: Producer, ledger: Ledger, keys: list[str]) -> None:
        super().__init__(name="e2e-producer", daemon=True)
        self.producer, self.ledger, self.keys = producer, ledger, keys
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.sent = 0
        self.gate_key: str | None = None  # set by the test: mark that key's next message gate=1
        self.gated: Sent | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                items = self.ledger.items(self.keys, 20, start=self.sent)
                gate_key, at = self.gate_key, -1
                if gate_key is not None and self.gated is None:
                    at = next((i for i, (k, _f) in enumerate(items) if k == gate_key), -1)
                    if at >= 0:
                        items[at][1]["gate"] = "1"
                sent = self.ledger.send(self.producer, items)
                if at >= 0:
                    self.gated = sent[at]
                self.sent += len(items)
                self.halt.wait(0.02)  # pacing (about 1,000 messages/s), not synchronisation
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(30)
        assert not self.is_alive()
        if self.error is not None:
            raise self.error

    def sent_to_version(self, version: int) -> int:
        return sum(1 for _k, _s, sent in list(self.ledger.sent) if int(sent.shard.split(":")[1]) == version)


def wait_for(
    pred: Callable[[], Any], timeout: float, what: str, *, tick: Callable[[], Any] | None = None,
    diag: Callable[[], str] | None = None, interval: float = 0.1,
) -> Any:
    """Poll ``pred`` (calling ``tick`` each turn) until it returns something truthy; fail after
    ``timeout`` seconds with ``what`` and a diagnosis."""
    deadline = time.monotonic() + timeout
    while True:
        if tick is not None:
            tick()
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{diag() if diag else ''}")
        time.sleep(interval)


@dataclass(repr=False)
class World:
    server: LiveServer
    r: redis.Redis
    log_dir: Path
    redis_url: str = field(default_factory=lambda: settings.STREAM_REDIS_URL)
    uid: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    members: dict[str, MemberProc] = field(default_factory=dict)
    producers: list[Producer] = field(default_factory=list)
    sweep_every: float = 0.2
    sweeps: int = 0
    _last_sweep: float = 0.0

    # ---- setup -------------------------------------------------------------------------
    def create(self, shards: int, **group_config: Any) -> None:
        self.prefix = f"e2e-{self.uid}"
        self.stream = f"s-{self.uid}"
        self.group = f"g-{self.uid}"
        create_stream(self.stream, shards, key_prefix=self.prefix)
        create_group(self.group, self.stream, **group_config)
        self.group_key = create_api_key(group=self.group)
        self.stream_key = create_api_key(stream=self.stream)
        self.results_key = f"{self.prefix}:results"
        self.results = Results(self.r, self.results_key)

    def env(self, member_id: str, **extra: str) -> dict[str, str]:
        e = dict(os.environ)
        e.update(E2E_REDIS_URL=self.redis_url, E2E_RESULTS=self.results_key, E2E_MEMBER=member_id,
                 PYTHONUNBUFFERED="1", **extra)
        return e

    def _spawn(self, member_id: str, argv: list[str], env: dict[str, str]) -> MemberProc:
        log = self.log_dir / f"{member_id}.log"
        with open(log, "wb") as out:
            proc = spawn.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        m = MemberProc(member_id, proc, log)
        self.members[member_id] = m
        return m

    def start_cli_member(self, member_id: str, *args: str, gate: str | None = None) -> MemberProc:
        argv = [
            sys.executable, "-m", "dataplane", "consume",
            "--coordinator", self.server.url, "--group", self.group, "--api-key", self.group_key,
            "--redis", self.redis_url, "--handler", "tests.e2e.handlers:record",
            "--member-id", member_id, "--workers", "4", "--batch-size", "50", "--block-ms", "500",
            *args,
        ]
        extra = {"E2E_GATE": gate} if gate else {}
        return self._spawn(member_id, argv, self.env(member_id, **extra))

    def start_app_member(self, member_id: str, *args: str) -> MemberProc:
        argv = [
            sys.executable, "-m", "tests.e2e.member_app",
            "--coordinator", self.server.url, "--group", self.group, "--api-key", self.group_key,
            "--redis", self.redis_url, "--member-id", member_id, *args,
        ]
        return self._spawn(member_id, argv, self.env(member_id))

    def producer(self) -> Producer:
        p = Producer(self.server.url, self.stream, self.stream_key, redis_url=self.redis_url)
        self.producers.append(p)
        return p

    # ---- observing -----------------------------------------------------------------------
    def tick(self) -> None:
        """The sweeps beat would run (L1/L2 liveness, resharding), at most every sweep_every s."""
        now = time.monotonic()
        if now - self._last_sweep >= self.sweep_every:
            run_all_sweeps()
            self.sweeps += 1
            self._last_sweep = time.monotonic()

    def describe(self) -> dict[str, Any]:
        doc = describe_group(self.group)
        assert doc is not None
        return doc

    def owners(self) -> dict[str, str]:
        """shard -> member holding it (granted)."""
        return {s: m["memberId"] for m in self.describe()["members"] for s in m["assignedShards"]}

    def stable_with(self, member_ids: set[str]) -> dict[str, Any] | None:
        doc = self.describe()
        live = {m["memberId"] for m in doc["members"]}
        if doc["state"] != "STABLE" or live != member_ids:
            return None
        if any(m["pendingShards"] or m["revokingShards"] for m in doc["members"]):
            return None
        return doc

    def shard_ids(self) -> list[str]:
        return list(
            Shard.objects.filter(version__stream__name=self.stream).order_by("version__version", "index")
            .values_list("shard_id", flat=True)
        )

    def keys(self, shard: str) -> ShardKeys:
        return ShardKeys(shard, self.prefix)

    def pending(self, shard: str) -> dict[str, Any]:
        stream = self.keys(shard).stream
        if not self.r.exists(stream):
            return {"pending": 0, "consumers": []}
        try:
            return self.r.xpending(stream, self.group)
        except redis.ResponseError:  # no group yet
            return {"pending": 0, "consumers": []}

    def total_pending(self) -> int:
        return sum(int(self.pending(s)["pending"]) for s in self.shard_ids())

    def pending_ids(self, shard: str, consumer: str | None = None) -> list[str]:
        stream = self.keys(shard).stream
        if not self.r.exists(stream):
            return []
        rows = self.r.xpending_range(stream, self.group, "-", "+", 100_000, consumername=consumer)
        return [row["message_id"] for row in rows]

    def route(self, key: str, shards: int, version: int = 1) -> str:
        return f"{self.stream}:{version}:{shard_index(hash64(key), shards)}"

    def diag(self) -> str:
        lines = [f"describe: {self.describe()}", f"handled records: {len(self.results.records)}"]
        for m in self.members.values():
            rc = m.proc.poll()
            tail = "\n    ".join(m.log_text().splitlines()[-15:])
            lines.append(f"--- {m.member_id} pid {m.pid} rc {rc}:\n    {tail}")
        return "\n".join(lines)

    def wait(self, pred: Callable[[], Any], timeout: float, what: str) -> Any:
        return wait_for(pred, timeout, what, tick=self.tick, diag=self.diag)

    # ---- assertions --------------------------------------------------------------------
    def assert_nothing_lost(self, ledger: Ledger) -> None:
        self.results.poll()
        missing = ledger.produced() - set(self.results.first)
        assert not missing, f"{len(missing)} messages never handled, e.g. {sorted(missing)[:10]}"

    def assert_key_order(self, ledger: Ledger, skip_keys: frozenset[str] = frozenset()) -> None:
        """Per key, the sequence numbers in the order of their FIRST handling equal the
        produce order (0, 1, 2, ...)."""
        self.results.poll()
        firsts: dict[str, list[int]] = defaultdict(list)
        seen: set[tuple[str, int]] = set()
        for rec in self.results.records:
            if (rec.key, rec.seq) not in seen:
                seen.add((rec.key, rec.seq))
                firsts[rec.key].append(rec.seq)
        produced: dict[str, list[int]] = defaultdict(list)
        for key, seq, _ in ledger.sent:
            if key not in skip_keys:
                produced[key].append(seq)
        bad = {k: (firsts[k], produced[k]) for k in produced if firsts[k] != produced[k]}
        assert not bad, f"{len(bad)} keys handled out of order, e.g. {next(iter(bad.items()))}"

    # ---- teardown ------------------------------------------------------------------------
    def close(self) -> None:
        for pid in child_pids(self.server.process.pid):  # gunicorn workers a test may have stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for m in self.members.values():
            if m.proc.poll() is None:
                try:
                    os.kill(m.pid, signal.SIGCONT)  # a stopped process cannot die of SIGTERM
                    m.proc.kill()
                except ProcessLookupError:
                    pass
        for m in self.members.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                m.proc.wait(10)
        for p in self.producers:
            p.close()
        prefix = getattr(self, "prefix", None)
        if prefix:
            delete_keys(self.r, f"{prefix}:*")


@pytest.fixture
def e2e_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.STREAM_REDIS_URL, decode_responses=True)
    try:
        client.ping()
    except redis.ConnectionError as exc:  # pragma: no cover - environment problem
        pytest.fail(f"the e2e tests need Redis at {settings.STREAM_REDIS_URL}: {exc}")
    yield client
    client.close()


@pytest.fixture
def world(one_worker_gunicorn: LiveServer, e2e_redis: redis.Redis, tmp_path: Path) -> Iterator[World]:  # noqa: F811
    w = World(one_worker_gunicorn, e2e_redis, tmp_path)
    try:
        yield w
    finally:
        w.close()


def child_pids(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:  # gone already (a test stopped the server itself)
        return []


def has_open_request(pid: int, port: int) -> bool:
    """True when process ``pid`` has sent a request to ``port`` that the server has not read:
    the server's end of one of its connections holds unread bytes (the workers are stopped).
    Connections stay open between requests (keep-alive), so an open one alone proves nothing."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    with open(f"/proc/{pid}/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    client_ports = {
        int(r[1].split(":")[1], 16) for r in rows
        if int(r[2].split(":")[1], 16) == port and r[3] == "01" and r[9] in inodes
    }
    return any(
        int(r[1].split(":")[1], 16) == port and int(r[2].split(":")[1], 16) in client_ports
        and int(r[4].split(":")[1], 16) > 0  # rx_queue of the server's end
        for r in rows
    )
