"""Lua scripts of the data plane. Each touches the keys of ONE shard only (one hash tag, one
slot), so every script also runs on Redis Cluster.

Scripts are loaded once and called with EVALSHA; NOSCRIPT (a restarted or failed-over server)
reloads and retries. redis-py's ``Script`` objects are not used on pipelines because they add
a SCRIPT EXISTS round trip to every pipeline execution.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from .wire import roundtrip

# Fence token "grantEpoch:memberId". Raised before a newly granted shard is read; monotonic:
# a lower grant epoch never overwrites a higher one, and an equal epoch only for the same
# member (re-raising our own token is idempotent). Returns {1, token} or {0, current}.
FENCE_RAISE = """
local cur = redis.call('GET', KEYS[1])
local epoch = tonumber(ARGV[1])
if cur then
  local sep = string.find(cur, ':', 1, true)
  local cur_epoch = tonumber(string.sub(cur, 1, sep - 1))
  if epoch < cur_epoch then return {0, cur} end
  if epoch == cur_epoch and string.sub(cur, sep + 1) ~= ARGV[2] then return {0, cur} end
end
local token = ARGV[1] .. ':' .. ARGV[2]
redis.call('SET', KEYS[1], token)
return {1, token}
"""

# Shared ACK body: XACKDEL ... ACKED deletes an entry only once every group has acknowledged
# it; XACK (older servers) leaves deletion to trimming. Never XDEL: other groups may still
# need the entry.
_ACK_FN = """
local function ack(stream, group, mode, ids)
  if #ids == 0 then return 0 end
  if mode == 'XACKDEL' then
    local res = redis.call('XACKDEL', stream, group, 'ACKED', 'IDS', #ids, unpack(ids))
    local n = 0
    for _, r in ipairs(res) do if r ~= -1 then n = n + 1 end end
    return n
  end
  return redis.call('XACK', stream, group, unpack(ids))
end
"""

# KEYS: stream, fence. ARGV: group, token, mode, id... -> number acked, or -1 when the fence
# token is not ours (a newer owner raised it: this member is stale and must not ACK).
ACK = (
    _ACK_FN
    + """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return -1 end
local n, ids = 0, {}
for i = 4, #ARGV do
  ids[#ids + 1] = ARGV[i]
  if #ids == 1000 then n = n + ack(KEYS[1], ARGV[1], ARGV[3], ids); ids = {} end
end
return n + ack(KEYS[1], ARGV[1], ARGV[3], ids)
"""
)

# KEYS: stream, fence, dlq. ARGV: group, token, mode, id, doAck, dlqMaxlen, field, value, ...
# Moves one exhausted message to the DLQ stream and ACKs it in one step, fenced like ACK.
DLQ = (
    _ACK_FN
    + """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return -1 end
local args = {KEYS[3]}
local maxlen = tonumber(ARGV[6])
if maxlen > 0 then
  args[#args + 1] = 'MAXLEN'; args[#args + 1] = '~'; args[#args + 1] = maxlen
end
args[#args + 1] = '*'
for i = 7, #ARGV do args[#args + 1] = ARGV[i] end
redis.call('XADD', unpack(args))
if ARGV[5] == '1' then ack(KEYS[1], ARGV[1], ARGV[3], {ARGV[4]}) end
return 1
"""
)

# KEYS: stream, seal. ARGV: group. 1 when the shard is sealed and this group has read it to
# the end with nothing pending. Uses last-delivered-id against the last entry, not `lag`
# (which becomes null after deletes/trims).
DRAINED = """
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 1 end
local pending, last_delivered = nil, nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, p, ld = nil, nil, nil
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1]
    elseif g[i] == 'pending' then p = g[i + 1]
    elseif g[i] == 'last-delivered-id' then ld = g[i + 1] end
  end
  if name == ARGV[1] then pending, last_delivered = p, ld end
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 then
  if pending == nil or pending == 0 then return 1 end
  return 0
end
if pending == nil or pending > 0 then return 0 end
local function parse(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end
local lms, lseq = parse(last[1][1])
local dms, dseq = parse(last_delivered)
if dms > lms or (dms == lms and dseq >= lseq) then return 1 end
return 0
"""

# KEYS: stream, seal. ARGV: maxlen (0 = none), message count, then per message: 2*nfields,
# field, value, ... Refuses (nil) the whole batch when the shard is sealed: checked in the
# same script as the XADDs, so nothing lands in a version after its seal marker is written.
APPEND = """
if redis.call('EXISTS', KEYS[2]) == 1 then return false end
local maxlen = tonumber(ARGV[1])
local ids, i = {}, 3
for m = 1, tonumber(ARGV[2]) do
  local n = tonumber(ARGV[i]); i = i + 1
  local args = {KEYS[1]}
  if maxlen > 0 then
    args[2] = 'MAXLEN'; args[3] = '~'; args[4] = maxlen
  end
  args[#args + 1] = '*'
  for j = i, i + n - 1 do args[#args + 1] = ARGV[j] end
  i = i + n
  ids[m] = redis.call('XADD', unpack(args))
end
return ids
"""

# KEYS: stream, fence. ARGV: group, consumer, start cursor, count, token. XAUTOCLAIM ...
# JUSTID, returned raw (redis-py's reply parser drops the cursor of a JUSTID claim), or -1
# when the fence token is not ours: a stale owner must not pull the new owner's pending
# entries into its own PEL. JUSTID does not bump the delivery count; the PEL read that
# follows does.
CLAIM_IDS = """
if redis.call('GET', KEYS[2]) ~= ARGV[5] then return -1 end
return redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'COUNT', ARGV[4], 'JUSTID')
"""

# KEYS: stream1, fence1, stream2, fence2, ... ARGV: group, consumer, count, token1, token2, ...
# A fenced read of new entries: only the shards whose fence token is still ours are read, with
# a NON-blocking XREADGROUP (BLOCK is refused inside scripts), so a member that stalled after
# its lease check cannot pull a lost shard's entries into its PEL. Returns
# {refused, reply, tails}: the 1-based shard positions refused; the XREADGROUP reply of the
# others (false when nothing was read); when nothing was read, per readable shard the ID to
# wait after with a plain XREAD BLOCK (its last entry, "0-0" when empty; false otherwise).
FENCED_READ = """
local refused, streams, ids, readable = {}, {}, {}, {}
for i = 1, #KEYS / 2 do
  if redis.call('GET', KEYS[2 * i]) == ARGV[3 + i] then
    streams[#streams + 1] = KEYS[2 * i - 1]
    ids[#ids + 1] = '>'
  else
    refused[#refused + 1] = i
  end
end
if #streams == 0 then return {refused, false, false} end
local args = {'XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS'}
for _, s in ipairs(streams) do args[#args + 1] = s end
for _, id in ipairs(ids) do args[#args + 1] = id end
local reply = redis.call(unpack(args))
if reply then return {refused, reply, false} end
local tails = {}
for i, s in ipairs(streams) do
  local last = redis.call('XREVRANGE', s, '+', '-', 'COUNT', 1)
  tails[i] = last[1] and last[1][1] or '0-0'
end
return {refused, false, tails}
"""


class Lua:
    """A script called by SHA, loading itself on NOSCRIPT."""

    def __init__(self, source: str) -> None:
        self.source = source
        # Redis names scripts by their SHA-1; it is an identifier here, not a safeguard.
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def ensure_loaded(self, client: Any) -> None:
        client.script_load(self.source)  # on a cluster client this loads on every primary


def _send(client: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """``commands`` in one write on one of the client's pooled connections, replies (error
    replies as exceptions) in order. A pipeline does the same, but checks and times every
    argument in Python first: a fifth of the producer's CPU per message. A connection error
    is retried as the client's pipeline would retry it (its Retry), on a new connection."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        return conn.retry.call_with_retry(lambda: roundtrip(conn, commands),
                                          lambda _error: conn.disconnect())
    finally:
        pool.release(conn)


def run_many(client: Any, calls: Sequence[tuple[Lua, Sequence[str], Sequence[Any]]]) -> list[Any]:
    """Run many script calls in as few round trips as possible; results (or exceptions) in
    call order. Standalone: one write. Cluster: redis-py's cluster pipeline refuses
    EVALSHA, so one write per node (each call's keys share one slot); a call that
    hits a slot migration (MOVED/ASK) is redone singly, where RedisCluster follows redirects.
    """
    if not calls:
        return []
    if not hasattr(client, "get_node_from_key"):
        groups: list[tuple[Any, list[int]]] = [(client, list(range(len(calls))))]
    else:
        by_node: dict[str, tuple[Any, list[int]]] = {}
        for i, (_lua, keys, _args) in enumerate(calls):
            node = client.get_node_from_key(keys[0])
            if node.name not in by_node:
                by_node[node.name] = (client.get_redis_connection(node), [])
            by_node[node.name][1].append(i)
        groups = list(by_node.values())
    results: list[Any] = [None] * len(calls)
    for target, idxs in groups:
        commands = [("EVALSHA", calls[i][0].sha, len(calls[i][1]), *calls[i][1], *calls[i][2])
                    for i in idxs]
        for i, res in zip(idxs, _send(target, commands), strict=True):
            if isinstance(res, Exception):
                text = str(res)
                lua, keys, args = calls[i]
                if is_noscript(res) or text.startswith(("MOVED", "ASK")) or "MOVED" in text:
                    try:
                        res = lua(client, keys, args)  # loads on NOSCRIPT, follows redirects
                    except Exception as exc:
                        res = exc
            results[i] = res
    return results


fence_raise = Lua(FENCE_RAISE)
ack = Lua(ACK)
dlq = Lua(DLQ)
drained = Lua(DRAINED)
append = Lua(APPEND)
claim_ids = Lua(CLAIM_IDS)
fenced_read = Lua(FENCED_READ)
ALL = (fence_raise, ack, dlq, drained, append, claim_ids, fenced_read)


def is_noscript(exc: BaseException) -> bool:
    return isinstance(exc, NoScriptError) or "NOSCRIPT" in str(exc)
