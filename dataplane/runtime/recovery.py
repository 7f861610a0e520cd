"""Starting a shard and recovering what is pending on it; drain detection; the orphan sweep.

Start: the fence token is raised to ``grantEpoch:memberId`` (refused when a newer grant
holds it: the shard is lost), then the consumer group is looked up and created only where it
is missing: the coordinator creates it when it creates a group or a shard version (issue
27.6), so the member role needs no ``xgroup|create``; with an older coordinator, or a group
made before that, the member creates it as it always did, if its role allows. Recovery, one
page per loop turn and shard so that other shards keep flowing: others' pending entries are
first claimed to us (JUSTID, fenced, no delivery bump), then our whole PEL is read from the
last dispatched ID:
one sequence in ID order, own and others' entries together.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from redis.exceptions import ResponseError

from .. import scripts
from ..errors import RedisPermissionError, is_noperm
from ..membership import Grant
from .config import RuntimeConfig
from .shard_table import RecoveryPhase, ShardState, ShardStatus, ShardTable, StartShard
from .workers import Dispatcher

log = logging.getLogger(__name__)


def entries_of(reply: Any) -> dict[str, list[Any]]:
    """XREADGROUP reply (RESP2 list or RESP3 map) -> {stream: [(id, fields), ...]}."""
    if not reply:
        return {}
    if isinstance(reply, dict):
        return {
            k: (v[0] if v and isinstance(v[0], list) and v[0] and isinstance(v[0][0], list) else v)
            for k, v in reply.items()
        }
    return {stream: entries for stream, entries in reply}


class Recovery:
    def __init__(
        self,
        client: Any,
        group: str,
        consumer: str,
        cfg: RuntimeConfig,
        table: ShardTable,
        dispatcher: Dispatcher,
        stopping: threading.Event,
    ) -> None:
        self.client = client
        self.group = group
        self.consumer = consumer
        self.cfg = cfg
        self.table = table
        self.dispatcher = dispatcher
        self.stopping = stopping

    def start_shard(self, grant: Grant) -> None:
        st = self.table.install(grant)
        ok, current = scripts.fence_raise(
            self.client, [st.keys.fence(self.group)], [grant.grant_epoch, grant.member_id]
        )
        if not ok:
            log.warning(
                "shard %s: fence token %s is above our grant %s", grant.shard, current, st.token
            )
            self.table.mark_lost(st)
            return
        self._ensure_group(st.stream, grant.start_id)
        self.table.advance(st, ShardStatus.STARTING, ShardStatus.RECOVERING)
        log.info("shard %s granted at epoch %s", grant.shard, grant.grant_epoch)

    def _has_group(self, stream: str) -> bool | None:
        """Whether ``stream`` has our consumer group; None when the role may not ask."""
        try:
            groups = self.client.xinfo_groups(stream)
        except ResponseError as exc:
            if is_noperm(exc):
                return None
            if "no such key" in str(exc).lower():
                return False
            raise
        for g in groups:
            name = g.get("name") if isinstance(g, dict) else None
            if (name.decode() if isinstance(name, bytes) else name) == self.group:
                return True
        return False

    def _ensure_group(self, stream: str, start_id: str) -> None:
        if self._has_group(stream):
            return
        try:
            self.client.xgroup_create(stream, self.group, id=start_id, mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" in str(exc):
                return
            if is_noperm(exc):
                raise RedisPermissionError(
                    f"create the missing consumer group {self.group!r} on {stream} (the "
                    "coordinator creates consumer groups with each group and shard version; for "
                    f"a group made before it did, run `manage.py ensure_consumer_groups --group "
                    f"{self.group}`)",
                    exc,
                ) from exc
            raise

    def step(self) -> None:
        """One page of recovery per recovering shard."""
        for st in self.table.with_status(ShardStatus.RECOVERING):
            if not self.table.wait_capacity(self.stopping):
                return
            try:
                self._page(st)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self.table.enqueue(StartShard(st.grant))  # stream or group deleted: set up again

    def _page(self, st: ShardState) -> None:
        n = self.cfg.batch_size
        if st.phase is RecoveryPhase.CLAIM:
            keys = [st.stream, st.keys.fence(self.group)]
            res = scripts.claim_ids(
                self.client, keys, [self.group, self.consumer, st.claim_cursor, n, st.token]
            )
            if res == -1:
                log.warning("claim refused on %s: fence token moved past %s", st.shard, st.token)
                self.table.mark_lost(st)
                return
            st.claim_cursor = res[0]
            if res[0] in ("0-0", b"0-0"):
                st.phase = RecoveryPhase.OWN
            return
        reply = self.client.xreadgroup(self.group, self.consumer, {st.stream: st.last_id}, count=n)
        entries = entries_of(reply).get(st.stream, [])
        if not entries:
            self.table.advance(st, ShardStatus.RECOVERING, ShardStatus.ACTIVE)
            return
        counts = self._delivery_counts(st, entries[0][0], entries[-1][0], len(entries))
        self.dispatcher.dispatch(st, entries, counts)

    def _delivery_counts(self, st: ShardState, lo: str, hi: str, n: int) -> dict[str, int]:
        rows = self.client.xpending_range(st.stream, self.group, lo, hi, n, self.consumer)
        return {r["message_id"]: int(r["times_delivered"]) for r in rows}

    def sweep_orphans(self, now: float) -> None:
        """Safety net: entries another consumer holds on a shard we own exclusively can only
        be orphans (e.g. a stale owner's read that landed after our recovery claimed). Claim
        those idle for claim_idle_ms and dispatch them."""
        for st in self.table.with_status(ShardStatus.ACTIVE):
            if now < st.next_sweep:
                continue
            st.next_sweep = now + self.cfg.sweep_interval_ms / 1000
            _c, claimed, *_ = self.client.xautoclaim(
                st.stream,
                self.group,
                self.consumer,
                self.cfg.claim_idle_ms,
                "0-0",
                count=self.cfg.batch_size,
            )
            claimed = [e for e in claimed if e and e[1]]
            if claimed:
                log.warning("shard %s: claimed %d orphaned entries", st.shard, len(claimed))
                counts = self._delivery_counts(st, claimed[0][0], claimed[-1][0], len(claimed))
                self.dispatcher.dispatch(st, claimed, counts, advance=False)

    def check_drained(self) -> None:
        """Mark ACTIVE shards that are sealed and read to the end with nothing pending."""
        todo = self.table.with_status(ShardStatus.ACTIVE)
        if not todo:
            return
        results = scripts.run_many(
            self.client,
            [(scripts.drained, [st.stream, st.grant.seal_key], [self.group]) for st in todo],
        )
        done = [st for st, res in zip(todo, results, strict=True) if res == 1]
        for shard in sorted(self.table.mark_drained(done)):
            log.info("shard %s drained: sealed, read to the end, nothing pending", shard)
