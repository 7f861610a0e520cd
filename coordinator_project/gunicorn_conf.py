"""Gunicorn settings: `gunicorn -c coordinator_project/gunicorn_conf.py coordinator_project.wsgi`.

It sets up prometheus_client's multiprocess mode, so /metrics sums the heartbeat counters
of every worker whichever worker answers the scrape. The environment variable must be set
before prometheus_client is first imported, which is why it happens here, in the master,
before any worker forks or loads the app. Command-line flags override the defaults below.

Named gunicorn_conf.py rather than gunicorn's usual gunicorn.conf.py: a name with two dots is
not a module to import-linter, which skipped it with a warning on every `make test`; as a
module it is checked (.importlinter: the config imports no Django in the master). Issue 24.8.
"""
from __future__ import annotations

import gc
import glob
import importlib.util
import os
import resource
import tempfile
from pathlib import Path
from typing import Any

# The app is loaded once, in the master, and each worker is a fork of it (preload_app): a
# worker's start was ~0.8 CPU-s of importing Django and the app, paid again at every restart
# of a worker; forked, it is ~0.1 CPU-s, and the loaded code's pages are shared. On gevent
# workers the master then patches the standard library first, before anything imports it
# (the app must bind to the cooperative socket, threading and time, as a worker's own load
# did). PRELOAD_APP=0 loads the app in each worker instead, after its own patching.
_WORKER_CLASS = os.environ.get("WORKER_CLASS", "webserver.worker.GuardedGeventWorker")  # see worker_class
preload_app = os.environ.get("PRELOAD_APP", "1") != "0"
if preload_app and "gevent" in _WORKER_CLASS.lower():
    from gevent import monkey

    # Once: a reload (SIGHUP) reads this file again in the patched master, where a second
    # patch_all() would walk every object again, Django's lazy settings among them.
    if not monkey.is_module_patched("threading"):
        monkey.patch_all()

# Issue 24.3: a missing SECRET_KEY or an unknown DATABASE_URL scheme stops the master with one
# line, before any worker forks (each worker printed a 128-line traceback, forever).
# preflight.py is loaded by its path, not as coordinator_project.preflight: importing the
# package would load the Celery app (and ssl, redis, kombu) in the master, before the gevent
# worker monkey-patches, and those modules would then block the worker instead of yielding.
_spec = importlib.util.spec_from_file_location("rsc_preflight", Path(__file__).with_name("preflight.py"))
if _spec is None or _spec.loader is None:
    raise ImportError("coordinator_project/preflight.py is missing beside gunicorn_conf.py")
_preflight = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_preflight)
_preflight.exit_on_environment_problem("gunicorn")

# 2 workers on 2 cores: 3 or 4 gevent workers measured lower (bench/RESULTS.md, the freshness
# read study of 2026-12-03); override with WEB_CONCURRENCY / -w.
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
bind = os.environ.get("BIND", f"127.0.0.1:{os.environ.get('PORT', '8000')}")
# Issue 8.2: gevent workers read each request in a greenlet of their own, so slow or idle
# clients hold a greenlet, never the worker (4 such clients froze both sync workers).
# psycopg 3 cooperates with gevent's monkey-patching (psycopg >= 3.1.14). WORKER_CLASS=sync
# restores the old setup (e.g. to compare in bench/heartbeat.py). The SQLite quick start runs
# gevent too; sqlite3 waits for its lock without yielding, so a transaction that does network
# I/O (a seal step started from the admin writes Redis) can hold up the worker's other
# requests up to SQLite's busy timeout. PostgreSQL (psycopg) waits cooperatively.
# Issue 27.1: the gevent worker with connection shedding, a per-address cap and JSON refusals
# (webserver/worker.py). WORKER_CLASS=gevent is the stock one.
worker_class = _WORKER_CLASS
# Slots per worker. Every member keeps one connection: 2 workers x 3,500 carry the ~6,000
# members a node is sized for (docs/OPERATING.md) with room for probes, producers and the
# admin. Each slot is a file descriptor: the worker raises its soft limit below (LimitNOFILE).
worker_connections = int(os.environ.get("WORKER_CONNECTIONS", "3500"))
# Under gevent, each request's line and headers must arrive within `keepalive` seconds or the
# connection is closed (gunicorn's AsyncWorker reads them under gevent.Timeout(keepalive)):
# the read timeout for slow clients, and the idle timeout between keep-alive requests.
keepalive = int(os.environ.get("HTTP_READ_TIMEOUT", "5"))
timeout = int(os.environ.get("WORKER_TIMEOUT", "30"))  # a worker silent this long is restarted
# gunicorn's control interface (gunicornc) listens on ~/.gunicorn/gunicorn.ctl by default: every
# master on a host would share one socket. Off unless GUNICORN_CONTROL_SOCKET names this
# master's own path (issue 24.2).
control_socket = os.environ.get("GUNICORN_CONTROL_SOCKET", "")
control_socket_disable = not control_socket
if "gevent" in worker_class.lower():
    # Greenlets share a worker: Django's per-greenlet connections go through a pool instead
    # of one persistent connection per thread (settings: DB_POOL).
    os.environ.setdefault("DB_POOL", "1")

if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    # One fresh directory per master: two servers on one host never mix their counters.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="rsc-prometheus-")
_multiproc_dir = os.environ["PROMETHEUS_MULTIPROC_DIR"]
os.makedirs(_multiproc_dir, exist_ok=True)


def on_starting(server: Any) -> None:
    # Counters of a previous run in a reused directory would be summed in: start from zero.
    for path in glob.glob(os.path.join(_multiproc_dir, "*.db")):
        os.remove(path)


def child_exit(server: Any, worker: Any) -> None:
    # Imported only now, after PROMETHEUS_MULTIPROC_DIR is set above.
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def pre_fork(server: Any, worker: Any) -> None:
    """With the app loaded in the master: no database connection or pool crosses the fork
    (loading opens none; this makes sure), and the loaded objects leave the collector's
    generations before the fork (issue 11.4, below), so a collection in a worker never
    touches, and so never copies, the pages it shares with the master."""
    if not preload_app:
        return
    from coordinator_project.dbpool import close_pools

    close_pools()
    gc.freeze()


def post_worker_init(worker: Any) -> None:
    # Issue 23.1/23.6: this worker's process state starts fresh (nothing inherited from the
    # master), and what depends on the worker class is chosen now, not sniffed per request:
    # on gevent workers the shared group reads coalesce ready requests.
    from coordinator_project.process_state import PROCESS

    PROCESS.start(cooperative=any(cls.__name__ == "GeventWorker" for cls in type(worker).__mro__))
    # A slot per connection plus the database, Redis and log descriptors: raise the soft limit
    # of open files as far as the hard one allows (the usual soft default is 1,024).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = worker_connections + max(32, worker_connections // 10) + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard))
    # Issue 8.1: while this worker accepts heartbeats, it stamps the intake beacon (L1/L2).
    from members.intake import start_beacon

    start_beacon()
    # Issue 11.4: the loaded app's objects (Django, DRF, modules) never become garbage; out of
    # the collector's generations, a full collection no longer walks them. Measured under
    # gevent, where a pause stalls every request of the worker: 150-270 ms → mostly 10-35 ms.
    # Decision 0027: full passes, 60-120 ms over a 10,000-member snapshot, are ten times rarer.
    from webserver.collector import settle

    settle()


def worker_exit(server: Any, worker: Any) -> None:
    # Issue 23.1: pending last-seen stamps written, heartbeat tallies folded, clients closed.
    from coordinator_project.process_state import PROCESS

    PROCESS.close()
