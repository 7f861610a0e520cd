"""The shipped gunicorn config loads the app once, in the master, and forks the workers from it
(preload_app): a worker starts without importing Django and the app again (~0.8 CPU-s each
when it did), and a fresh fork after a worker's restart answers at once. PRELOAD_APP=0 loads
the app in each worker (the check below then fails: each worker spends what the master did)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from bench.heartbeat import children, cpu_seconds
from tests import plain_http

from .conftest import make_group, poll, running_gunicorn

pytestmark = [pytest.mark.slow, pytest.mark.needs_postgres]


def test_workers_are_forks_of_a_master_that_loaded_the_app(transactional_db: None, tmp_path: Path):
    fx = make_group(stream="preload", group="preload-g")
    # A new interpreter: the master's CPU is what loading the app costs (a zygote's fork has
    # the libraries loaded already, and the master's share shrank to ~2x a worker's).
    with running_gunicorn(PROMETHEUS_MULTIPROC_DIR=str(tmp_path), new_interpreter=True) as server:
        master = server.process.pid
        # gunicorn forks its workers up to 0.1 s apart; one may answer /healthz before the next is forked
        assert poll(lambda: len(children(master)) == 2, 30), children(master)
        workers = children(master)
        loaded = cpu_seconds([master])
        spent = {pid: cpu_seconds([pid]) for pid in workers}
        # The master did the loading; a worker only forked (and answered a few /healthz polls).
        assert all(cpu < loaded / 2 for cpu in spent.values()), (loaded, spent)
        # A worker killed is replaced by another fork (no loading either), and heartbeats go on.
        os.kill(workers[0], signal.SIGKILL)
        replaced = poll(lambda: len(set(children(master)) - set(workers)) == 1, 30)
        assert replaced, children(master)
        (new,) = set(children(master)) - set(workers)
        headers = {"Authorization": f"Bearer {fx.key}"}
        for i in range(10):  # fresh connections: either worker may answer each
            r = plain_http.post(f"{server.url}/api/v1/groups/{fx.group}/heartbeat", headers=headers,
                                json={"memberId": f"m{i}", "memberEpoch": 0}, timeout=30)
            assert r.status_code == 200, r.text
        assert cpu_seconds([new]) < loaded / 2, (loaded, cpu_seconds([new]))
