"""The member library's own CPU per message, without Redis I/O or threads (issue 25.5 of the
benchmark goals: what the listener, metrics and tracing hooks cost on the message path).

    .venv/bin/python bench/dataplane_cpu.py [--rounds 7]

One thread does what the reader and a worker do for each read of 100 entries: the
dispatcher's pass (fields, key, lane, in-flight count) and the worker's run of each lane's
batch with a no-op handler, then the finish. Timed with ``time.thread_time()`` (this thread's
CPU), so the figure depends far less on the machine's load than ``bench/dataplane.py``'s
throughput ratios do; best and median of the rounds. Variants: hooks off (listeners are never
on the message path; metrics and tracing off wrap nothing), metrics on, tracing on (when the
opentelemetry SDK is installed: a real tracer provider, no exporter), and a batch handler.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.membership import Grant
from dataplane.runtime import Runtime, RuntimeConfig
from dataplane.runtime.shard_table import ShardState, ShardStatus

READS, PER_READ = 1000, 100


def per_message_us(handler: Any, *, batch: bool = False, metrics: Any = None, rounds: int = 7) -> list[float]:
    # The client is never connected: nothing here talks to Redis.
    rt = Runtime("redis://127.0.0.1:1/0", "g", "c", handler, RuntimeConfig(workers=4, batch_size=PER_READ),
                 batch=batch, metrics=metrics)  # fmt: skip
    st = ShardState(Grant("s:1:0", 1, "c", "p:{s:1:0}", "p:{s:1:0}:sealed", "0", "p"))
    st.status = ShardStatus.ACTIVE
    handed: list[Any] = []
    rt.workers.submit = handed.append  # type: ignore[method-assign]  # the hand-over, no thread
    dispatcher = rt.reader.recovery.dispatcher
    run = rt.workers._run  # type: ignore[attr-defined]
    entries = [(f"{i}-0", ["key", f"k{i % 1000}", "v", "x" * 32]) for i in range(PER_READ)]
    out = []
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(READS):
            handed.clear()
            dispatcher.dispatch_read([(st, entries)], flat=True)
            for batches in handed[0]:
                for b in batches:
                    run(b)
            rt.table.finish({st: PER_READ})
        out.append((time.thread_time() - t0) / (READS * PER_READ) * 1e6)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()

    def noop(msg: object) -> None:
        pass

    def batch_noop(msgs: list[object]) -> None:
        pass

    rows = [("hooks off (listeners, metrics, tracing)", per_message_us(noop, rounds=args.rounds))]
    try:
        from dataplane.metrics import Metrics

        rows.append(("metrics on", per_message_us(noop, metrics=Metrics(), rounds=args.rounds)))
    except ImportError:
        rows.append(("metrics on", []))
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
        from dataplane import tracing

        traced = tracing.wrap(noop, batch=False, epoch=lambda: 1)
        rows.append(("tracing on (SDK, no exporter)", per_message_us(traced, rounds=args.rounds)))
    except ImportError:
        rows.append(("tracing on (SDK, no exporter)", []))
    rows.append(("batch handler, hooks off", per_message_us(batch_noop, batch=True, rounds=args.rounds)))
    print(f"library CPU per message (dispatch + run, no I/O, {READS} reads of {PER_READ}):")
    for name, us in rows:
        if not us:
            print(f"  {name:<40}: not measured (extra not installed)")
            continue
        print(f"  {name:<40}: {min(us):6.2f} us  (median {statistics.median(us):.2f}; rounds "
              f"{', '.join(f'{x:.2f}' for x in us)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
