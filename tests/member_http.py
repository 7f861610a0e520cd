"""Reading a member's metrics port (``Consumer(metrics_port=…)``) in tests."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def get(port: int, path: str) -> tuple[int, str]:
    """Status and body of GET ``path``; (0, why) when nothing answers, so that a poll's
    predicate never raises while the port is not serving yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (name, sorted labels) -> value."""
    _, text = get(port, "/metrics")
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(port: int, name: str) -> float:
    """The sum of a metric's samples over every label set."""
    return sum(v for (n, _labels), v in samples(port).items() if n == name)
