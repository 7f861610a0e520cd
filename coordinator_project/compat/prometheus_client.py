"""prometheus_client internals the coordinator uses (checked by tests/unit/test_compat.py)."""
from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Histogram


def add_observations(histogram: Histogram, total: float, bucket_counts: Sequence[int]) -> None:
    """Add many observations to an unlabelled histogram at once, as observe() one by one would:
    `total` to its sum, `bucket_counts[i]` to its i-th bucket (the last one +Inf; the
    client's `_sum` and `_buckets` values; it has no bulk observe)."""
    histogram._sum.inc(total)
    buckets = histogram._buckets
    if len(buckets) != len(bucket_counts):
        raise ValueError(f"{len(bucket_counts)} bucket counts for {len(buckets)} buckets")
    for value, n in zip(buckets, bucket_counts, strict=True):
        if n:
            value.inc(n)


def problems() -> list[str]:
    """What this module relies on and the installed prometheus_client lacks."""
    from prometheus_client import CollectorRegistry

    found = []
    h = Histogram("compat_probe_seconds", "probe", buckets=(0.1, 1.0), registry=CollectorRegistry())
    if not callable(getattr(getattr(h, "_sum", None), "inc", None)):
        found.append("Histogram._sum (a value with inc()) is gone")
    buckets = getattr(h, "_buckets", None)
    if not isinstance(buckets, list) or len(buckets) != 3 or not all(callable(getattr(b, "inc", None)) for b in buckets):
        found.append("Histogram._buckets (one value with inc() per bucket, +Inf last) is gone")
    return found
