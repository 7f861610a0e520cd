"""The runtime's settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RuntimeConfig:
    """The consumer runtime's settings (``Consumer`` builds it from its arguments)."""

    workers: int = 4  # threads for a sync handler
    batch_size: int = 100
    block_ms: int = 1000
    max_deliveries: int = 5
    key_field: str = "key"
    ack: str = "after"  # "after": ACK once the handler succeeded; "before": ACK, then run
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 5000
    max_in_flight: int = 0  # 0: lanes * batch_size * 4
    max_concurrency: int = 16  # coroutines in flight (and lanes) for an async handler
    claim_idle_ms: int = 60_000  # orphan sweep: claim others' entries idle this long
    sweep_interval_ms: int = 30_000
    drain_check_ms: int = 1000
    dlq_maxlen: int = 100_000

    def validate(self) -> None:
        if self.ack not in ("after", "before"):
            raise ValueError("ack must be 'after' or 'before'")
        if min(self.workers, self.batch_size, self.max_deliveries, self.max_concurrency) < 1:
            raise ValueError("workers, batch_size, max_deliveries and max_concurrency must be >= 1")
