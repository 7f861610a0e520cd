"""The quick start's embedded database: the protocol, a sweep and a reshard on SQLite (WAL,
IMMEDIATE transactions), in a subprocess because the test session itself runs on PostgreSQL."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import spawn
from tests.sqlite.cleanup import delete_namespace_keys

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_runs_the_protocol_on_sqlite(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(SQLITE_PATH=str(tmp_path / "coordinator.sqlite3"), PYTHONPATH=str(ROOT),
               LOG_LEVEL="WARNING", REDIS_URL=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    try:
        r = spawn.run([sys.executable, str(Path(__file__).with_name("sqlite_flow.py"))],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    finally:  # its seal markers, under that database's own namespace
        delete_namespace_keys(tmp_path / "coordinator.sqlite3", env["REDIS_URL"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "sqlite flow ok" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    journal = subprocess.run(
        [sys.executable, "-c", "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('PRAGMA journal_mode').fetchone()[0])",
         str(tmp_path / "coordinator.sqlite3")], capture_output=True, text=True)
    assert journal.stdout.strip() == "wal"
