"""The shipped gunicorn config loads the app once, in the master, and forks the workers from it
(preload_app): a worker starts without importing Django and the app again (~0.8 CPU-s each
when it did), and a fresh fork after a worker's restart answers at once. PRELOAD_APP=0 loads
the app in each worker (the check below then fails: each worker spends what the master did)."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from bench.heartbeat import children, cpu_seconds
from tests import plain_http, spawn

from .conftest import ROOT, make_group, poll, running_gunicorn

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


def test_loading_the_app_loads_the_url_conf_so_a_workers_first_request_imports_no_view(tmp_path: Path):
    """What the master loads (coordinator_project.wsgi) includes the URL conf and every view
    module behind it: forked workers inherit them instead of each importing them at its first
    request (~0.13 CPU-s per worker, and that much more latency on a fresh worker's first
    heartbeat after a restart)."""
    views = ["coordinator_project.urls", "assignments.views", "groups.views", "drf_spectacular.views"]
    code = f"import json, sys, coordinator_project.wsgi; print(json.dumps([m for m in {views!r} if m in sys.modules]))"
    env = dict(os.environ, DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", SECRET_KEY="test-key")
    done = spawn.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == views, done.stdout


def test_a_worker_of_the_shipped_config_runs_with_the_collector_settled(transactional_db: None, tmp_path: Path):
    """Decision 0027: post_worker_init settles the worker's collector (webserver.collector):
    what the app loaded is frozen and full passes are ten times rarer than CPython's default."""
    from webserver.collector import FULL_PASS_EVERY

    with running_gunicorn(workers=1, ROOT_URLCONF="bench.urls", PROMETHEUS_MULTIPROC_DIR=str(tmp_path)) as server:
        r = plain_http.get(f"{server.url}/bench/collector", timeout=30)
        assert r.status_code == 200, r.text
        state = r.json()
        assert state["pid"] != server.process.pid, state  # a worker answered, not the master
        assert state["threshold"][2] == FULL_PASS_EVERY, state
        assert state["frozen"] > 10_000, state  # Django, DRF and the app's modules
