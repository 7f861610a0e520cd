"""The cyclic garbage collector of a web worker (decision 0027).

Under gevent a collection stalls every request of the worker while it runs, and a full pass
walks every tracked object the worker holds. At 10,000 members over 16,384 shards a worker
holds ~110,000 of them (the group snapshot's members, slots and sets, the steady-answer memo),
and a full pass costs 60-120 ms of CPU. CPython starts one after every 10 passes of the middle
generation once the old generation grew by a quarter since the last one; right after a join
storm the memo and the reads of held reports grow it that fast, so a worker ran two or three
full passes in a 10-s round and that round's p99 rose from ~20 ms to 60-90 ms.

`settle()` runs once per worker, after the fork: what the app loaded leaves the collector's
generations (`gc.freeze()`), and a full pass waits for `FULL_PASS_EVERY` middle passes instead
of 10. The young passes, which free a request's cycles within milliseconds, are unchanged; an
object that outlives them waits ~10 times longer for a full pass (RSS after a 60-s soak at
10,000 members: the same 131-139 MB). Imports nothing but the standard library."""
from __future__ import annotations

import gc

# Middle-generation passes between two full passes (CPython's default: 10).
FULL_PASS_EVERY = 100


def settle() -> None:
    """Freeze what is loaded and make full passes rare (once per worker, after the fork)."""
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_PASS_EVERY)
