"""The member process: heartbeat loop (membership machine + transport) driving the runtime.

``Consumer(...).run()`` is all an application needs; the coordinator URL is the only thing it
must know about the coordinator: intervals, timeouts, start position, key prefix and the
shards' Redis keys all come from the heartbeat answers.
"""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from .connections import NET_ERRORS
from .errors import (
    InstanceIdReplaced,
    RedisMismatchError,
    RedisPermissionError,
    RedisUnavailableError,
    heartbeat_refusal,
    is_noperm,
)
from .listeners import Listener, Listeners
from .membership import Actions, Membership
from .message import Message
from .protocol import MEMBER_ID_RE, MEMBER_ID_RULE
from .runtime import BatchHandler, Handler, Runtime, RuntimeConfig
from .transport import CoordinatorUnavailable, Transport

log = logging.getLogger(__name__)



def default_member_id() -> str:
    """``host-pid-rand``: unique per process, kept for its life (§2), valid by the contract."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{random.getrandbits(24):06x}"


@dataclass(frozen=True, slots=True)
class ConsumerStatus:
    """A snapshot of a consumer (:meth:`Consumer.status`), safe to take from any thread."""

    member_id: str
    group: str
    member_epoch: int  # 0 while joining
    state: str  # JOINING, OK / SYNC_METADATA / REVOKE_PENDING (the last answer), LEAVING, LEFT
    owned_shards: tuple[str, ...]  # granted and read now
    revoking_shards: tuple[str, ...]  # stopped, reported until the coordinator took REVOKED
    in_flight: int  # messages read and not finished, all shards
    last_heartbeat_at: float | None  # time.time() of the last accepted heartbeat
    seconds_since_last_heartbeat: float | None
    last_error: str | None  # the last refusal or failure, None after an accepted heartbeat

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class Consumer:
    """A member of a consumer group: joins through the coordinator's heartbeat, reads the
    shards it is granted from Redis and runs ``handler`` (sync or ``async def``) on each
    message, keeping per-key order; :meth:`run` until :meth:`stop` or SIGINT/SIGTERM.
    Optional rebalance listeners ``on_assigned`` / ``on_revoked`` / ``on_lost``
    (listeners.py); :meth:`status` for a snapshot. See dataplane/README.md."""

    def __init__(
        self,
        coordinator_url: str,
        group: str,
        api_key: str | None,
        handler: Handler | None,
        redis_url: str = "redis://127.0.0.1:6379/0",
        member_id: str | None = None,
        workers: int = 4,
        batch_size: int = 100,
        block_ms: int = 1000,
        max_deliveries: int = 5,
        key_field: str = "key",
        ack: str = "after",
        *,
        cluster: bool = False,
        client_id: str | None = None,
        rebalance_timeout_ms: int | None = None,
        shutdown_timeout_s: float = 30.0,
        refusal_timeout_s: float = 30.0,
        retry_backoff_ms: int = 100,
        max_concurrency: int = 16,
        transport: Transport | None = None,
        instance_id: str | None = None,
        on_assigned: Listener | None = None,
        on_revoked: Listener | None = None,
        on_lost: Listener | None = None,
        batch_handler: BatchHandler | None = None,
        metrics: bool = False,
        metrics_port: int | None = None,
        tracing: bool = False,
    ) -> None:
        if (handler is None) == (batch_handler is None):
            raise ValueError("give exactly one of handler and batch_handler")
        self.member_id = member_id or default_member_id()
        if not MEMBER_ID_RE.fullmatch(self.member_id):
            raise ValueError(f"member_id must be {MEMBER_ID_RULE}")
        # Static membership (§9): a restart with the same instance id gets the same shards back.
        if instance_id is not None and not MEMBER_ID_RE.fullmatch(instance_id):
            raise ValueError(f"instance_id must be {MEMBER_ID_RULE}")
        self.group = group
        self.transport = transport or Transport(coordinator_url, api_key)
        self.machine = Membership(
            self.member_id,
            client_id=client_id or f"{socket.gethostname()}/pid-{os.getpid()}",
            rebalance_timeout_ms=rebalance_timeout_ms,
            instance_id=instance_id,
        )
        cfg = RuntimeConfig(
            workers=workers,
            batch_size=batch_size,
            block_ms=block_ms,
            max_deliveries=max_deliveries,
            key_field=key_field,
            ack=ack,
            retry_backoff_ms=retry_backoff_ms,
            max_concurrency=max_concurrency,
        )
        if tracing:  # OpenTelemetry (the optional extra): imported only when asked for
            from . import tracing as otel

            epoch = lambda: self.machine.member_epoch  # noqa: E731
            if handler is not None:
                handler = otel.wrap(handler, batch=False, epoch=epoch)
            else:
                batch_handler = otel.wrap(batch_handler, batch=True, epoch=epoch)  # type: ignore[arg-type]
        # Prometheus metrics (the optional extra): imported only when asked for.
        self.metrics: Any = None
        self.metrics_port = metrics_port
        if metrics or metrics_port is not None:
            from .metrics import Metrics

            self.metrics = Metrics()
        self.runtime = Runtime(
            redis_url,
            group,
            self.member_id,
            handler or batch_handler,  # type: ignore[arg-type]
            cfg,
            cluster=cluster,
            batch=batch_handler is not None,
            metrics=self.metrics,
        )
        if self.metrics is not None:
            self.metrics.owned_shards.set_function(lambda: len(self.machine.owned))
            self.metrics.since_heartbeat.set_function(self._seconds_since_heartbeat)
        self.shutdown_timeout_s = shutdown_timeout_s
        # After the session is lost, how long 401/403/404 (deleted group) refusals may go on
        # before run() raises them: a key rotation or a redeploy heals sooner than this.
        self.refusal_timeout_s = refusal_timeout_s
        self._stop_timeout: float | None = None
        # Rebalance listeners (listeners.py), called from run()'s thread.
        self.listeners = Listeners(
            on_assigned,
            on_revoked,
            on_lost,
            loop=lambda: getattr(self.runtime.workers, "loop", None),
        )
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the machine is not thread-safe; run() owns it
        self._last_accepted_at: float | None = None  # time.time(), for status()
        self.redis_url = redis_url
        # Issue 25.4: key prefixes whose <prefix>:identity matched the metadata's installationId,
        # and the metadata document last checked (the check runs again only when it changes).
        self._verified_prefixes: set[str] = set()
        self._checked_metadata: object = None

    # ---- public ------------------------------------------------------------------------

    def stop(self, timeout: float | None = None) -> None:
        """Ask run() to leave the group and return (safe from any thread or signal handler).

        Work in flight gets ``timeout`` seconds (default ``shutdown_timeout_s``) to finish and be
        ACKed; what is still running after it is abandoned: not ACKed (it stays pending for the
        shard's next owner), logged, and its shards go to ``on_lost``."""
        if timeout is not None:
            self._stop_timeout = timeout
        self._stop.set()
        self.runtime.changed.set()

    def _seconds_since_heartbeat(self) -> float:
        at = self._last_accepted_at
        return -1.0 if at is None else max(0.0, time.time() - at)

    def health(self) -> str | None:
        """None when healthy, else why not (``/healthz`` answers 503 with it): not joined yet,
        the session lost (no accepted heartbeat within the session timeout), Redis unreachable,
        or left."""
        m = self.machine
        if m.left:
            return "left the group"
        if self._last_accepted_at is None:
            return "not joined yet"
        if time.monotonic() > self.runtime.read_deadline:
            return "session lost: no accepted heartbeat within the session timeout"
        if not self.runtime.redis_ok:
            return "Redis unreachable"
        return None

    def status(self) -> ConsumerStatus:
        """What this member is doing now (any thread): epoch, state, shards, in flight, last
        heartbeat and error. Read without stopping run(): a snapshot, not a transaction."""
        m = self.machine
        for _ in range(5):  # run() may change the maps while they are copied
            try:
                owned, revoking = tuple(sorted(m.owned)), tuple(sorted(m.revoking))
                break
            except RuntimeError:
                continue
        else:
            owned, revoking = (), ()
        if m.left:
            state = "LEFT"
        elif m.leaving:
            state = "LEAVING"
        elif m.member_epoch <= 0:
            state = "JOINING"
        else:
            state = m.last_status or "OK"
        at = self._last_accepted_at
        return ConsumerStatus(
            member_id=self.member_id,
            group=self.group,
            member_epoch=m.member_epoch,
            state=state,
            owned_shards=owned,
            revoking_shards=revoking,
            in_flight=self.runtime.table.total_in_flight,
            last_heartbeat_at=at,
            seconds_since_last_heartbeat=None if at is None else max(0.0, time.time() - at),
            last_error=m.last_error,
        )

    def idempotency_marker(self, msg: Message, marker: str, ttl_ms: int) -> bool:
        """True the first time ``marker`` is seen for this group and shard within ``ttl_ms``."""
        return self.runtime.idempotency_marker(msg, marker, ttl_ms)

    def run(self) -> None:
        """Join, consume until SIGINT/SIGTERM or stop(), then leave (memberEpoch -1; -2 with an
        instance id, so its shards wait for its restart). Raises :class:`InstanceIdReplaced`
        when another process joined with this instance id (its shards already aborted), and
        :class:`RedisPermissionError` after leaving at once when Redis refused the member a
        command it needs (an ACL): it neither heartbeats on holding shards it cannot serve."""
        restore = self._install_signals()
        try:
            if self.metrics is not None and self.metrics_port is not None:
                port = self.metrics.serve(self.metrics_port, self.health,
                                          status=lambda: self.status().as_dict())  # fmt: skip
                log.info("metrics on :%d/metrics, health on :%d/healthz, status on :%d/status",
                         port, port, port)  # fmt: skip
                self.metrics_port = port
            self.runtime.start()
            self._loop()
            if self.runtime.fatal is not None:
                raise self.runtime.fatal
            replaced = self.machine.replaced
            if replaced is not None:  # set only for a member with an instance id
                iid = self.machine.instance_id or ""
                raise InstanceIdReplaced(iid, self.member_id, replaced.by_member_id)
        finally:
            self.runtime.stop(timeout=5.0)
            self.transport.close()
            if self.metrics is not None:
                self.metrics.close()
            for sig, old in restore:
                signal.signal(sig, old)

    # ---- internals ---------------------------------------------------------------------

    def _install_signals(self) -> list[tuple[int, Any]]:
        if threading.current_thread() is not threading.main_thread():
            return []
        restore: list[tuple[int, Any]] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            restore.append((sig, signal.getsignal(sig)))
            signal.signal(sig, lambda *_: self.stop())
        return restore

    def _apply(self, actions: Actions) -> None:
        for shard in actions.abort:
            self.runtime.abort(shard)
        for shard in actions.revoke:
            self.runtime.revoke(shard)
        if actions.grant:
            # Before the runtime reads them: the application sets up per-shard state first.
            self.listeners.assigned(g.shard for g in actions.grant)
        for grant in actions.grant:
            self.runtime.grant(grant)
        if actions.abort:
            # Before rejoining, let the outstanding read that covers the aborted shards end:
            # entries it delivers after the next owner's recovery would sit in our PEL.
            self.runtime.wait_idle_reads(actions.abort, timeout=5.0)
            for shard in actions.abort:
                self.runtime.forget(shard)
            self.listeners.lost(actions.abort)  # after reads and ACKs stopped (C4)

    def _abandon(self, shards: list[str]) -> None:
        """The shutdown deadline passed with work still in flight: no ACK for it (the next
        owner gets it again, at-least-once), and the application hears the shards as lost."""
        if not shards:
            return
        counts = {s: self.runtime.in_flight(s) for s in shards}
        log.warning(
            "member %s: shutdown timeout passed; abandoning in-flight work, not ACKed: %s",
            self.member_id, ", ".join(f"{s} ({n} in flight)" for s, n in counts.items()),
        )  # fmt: skip
        for shard in shards:
            self.runtime.abort(shard)  # ABORTED: a handler that finishes later ACKs nothing
        self.listeners.lost(shards)

    def _check_identity(self) -> BaseException | None:
        """Issue 25.4: before the first read of a key prefix, its ``<prefix>:identity`` in our
        Redis must hold the metadata's ``installationId``: a wrong --redis (database, host,
        port) would otherwise be read, and written to, as if it were the coordinator's. One GET
        per prefix, once; None when it matches (or the coordinator publishes no identity: an
        older one), else the error to stop on."""
        md = self.machine.metadata
        if md is self._checked_metadata or not md:
            return None
        self._checked_metadata = md
        expected = md.get("installationId")
        if not isinstance(expected, str) or not expected:
            return None
        versions = md.get("versions") or []
        prefixes = {md.get("keyPrefix")}
        prefixes.update(v.get("keyPrefix") for v in versions if isinstance(v, dict))
        for prefix in sorted(p for p in prefixes if isinstance(p, str)):
            if prefix in self._verified_prefixes:
                continue
            key = f"{prefix}:identity"
            try:
                found = self.runtime.client.get(key)
            except NET_ERRORS as exc:
                return RedisUnavailableError(f"cannot read {key} to check the Redis: {exc}")
            except Exception as exc:
                if is_noperm(exc):
                    return RedisPermissionError(f"read the installation identity {key}", exc)
                raise
            if found != expected:
                return RedisMismatchError(self.redis_url, key, found, expected)
            self._verified_prefixes.add(prefix)
        return None

    def _refusal_is_fatal(self, refused_since: float | None) -> bool:
        """A 401/403/404 that kept coming for refusal_timeout_s, with the session lost by now
        (the coordinator has expired us: nothing is held any more)."""
        now = time.monotonic()
        return (
            refused_since is not None
            and now - refused_since >= self.refusal_timeout_s
            and now >= self.runtime.read_deadline
        )

    def _loop(self) -> None:
        m, rt = self.machine, self.runtime
        leave_deadline: float | None = None
        joined = False  # after the first accepted join, refusals are retried, not fatal
        refused_since: float | None = None  # the first of the 401/403/404 in a row
        while True:
            now = _now_ms()
            stopped_by = rt.fatal  # e.g. RedisPermissionError: no retry heals it
            if stopped_by is not None and leave_deadline is None:
                log.error("member %s stops: %s", self.member_id, stopped_by)
                self._stop.set()
            if self._stop.is_set() and leave_deadline is None:
                log.info("member %s leaving group %s", self.member_id, self.group)
                timeout = self._stop_timeout
                timeout = self.shutdown_timeout_s if timeout is None else timeout
                if stopped_by is not None:  # nothing more can be ACKed: nothing to wait for
                    timeout = 0.0
                leave_deadline = time.monotonic() + timeout
                self._apply(m.leave())
            if leave_deadline is not None and time.monotonic() > leave_deadline:
                self._abandon(m.revoking_in_progress)
                m.force_leave()
            self._apply(m.check_session(now))
            finished = [s for s in m.revoking_in_progress if rt.outstanding(s) == 0]
            if finished:
                # C1: after the in-flight work, before REVOKED goes out (the next poll).
                self.listeners.revoked(finished)
                for shard in finished:
                    m.revocation_finished(shard)
                    rt.forget(shard)
            for shard in rt.drained_shards():
                m.shard_drained(shard)
            lost = rt.pop_lost()
            if lost:
                self._apply(m.fence_locally(now, lost, f"fence token taken on {sorted(lost)}"))
            req = m.poll(now)
            if req is not None:
                sent_at = time.monotonic()
                try:
                    status, body = self.transport.heartbeat(self.group, req)
                except CoordinatorUnavailable as exc:
                    if self.metrics is not None:
                        self.metrics.heartbeat_errors.labels("UNREACHABLE").inc()
                    actions = m.on_failure(_now_ms(), repr(exc))
                else:
                    if self.metrics is not None:
                        self.metrics.heartbeat_seconds.observe(time.monotonic() - sent_at)
                        code = body.get("errorCode") or "NONE"
                        if code != "NONE":
                            self.metrics.heartbeat_errors.labels(str(code)).inc()
                    fatal = heartbeat_refusal(self.group, status, body)
                    if fatal is not None and not joined:
                        raise fatal  # before the first join: a wrong key or group, not a blip
                    if fatal is None:
                        refused_since = None
                    elif refused_since is None:
                        refused_since = sent_at
                    elif self._refusal_is_fatal(refused_since):
                        # A revoked key or a deleted group: retrying forever helps nobody.
                        took = time.monotonic() - refused_since
                        log.error("member %s: %s, for %.0f s and the session is lost; stopping",
                                  self.member_id, fatal, took)  # fmt: skip
                        raise fatal
                    actions = m.on_response(_now_ms(), status, body)
                    joined = joined or m.member_epoch > 0
                    mismatch = self._check_identity()
                    if mismatch is not None:
                        # Nothing of that Redis is touched: the grants are not started (no
                        # fence token, no consumer group), and the leave gives them back.
                        m.decline([g.shard for g in actions.grant])
                        actions.grant.clear()
                        rt.table.fail(mismatch)  # the loop leaves, run() raises it
                    if m.member_epoch > 0 and m.last_error is None:
                        # Accepted: the coordinator saw us alive no earlier than sent_at, so
                        # it cannot have expired us before sent_at + session timeout.
                        rt.read_deadline = sent_at + m.session_timeout_ms / 1000
                        self._last_accepted_at = time.time()
                self._apply(actions)
                rt.set_paused(m.paused)  # §11
                if m.left:
                    return
                continue
            if m.left:
                return
            wait_ms = min(m.next_wakeup_ms(_now_ms()), 200)
            if m.revoking_in_progress:
                wait_ms = min(wait_ms, 20)
            rt.changed.wait(wait_ms / 1000)
            rt.changed.clear()


__all__ = ["Consumer", "ConsumerStatus", "Message", "RuntimeConfig", "default_member_id"]
