"""Issue 24.1: the commands `make run` prints work as printed in the user's shell (no SECRET_KEY,
no DEBUG there): it writes var/run.env, which manage.py reads through RSC_ENV_FILE. A second run
never suggests a reshard to the count the stream already has, and revokes the previous run's
demo keys instead of piling them up (24.8)."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sqlite.cleanup import delete_namespace_keys

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import run as make_run  # noqa: E402  (scripts/run.py)

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
USER_SHELL_DROPS = ("SECRET_KEY", "DEBUG", "DATABASE_URL", "SQLITE_PATH", "DJANGO_SETTINGS_MODULE", "RSC_ENV_FILE")


@pytest.fixture
def supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[make_run.Supervisor]:
    for name in USER_SHELL_DROPS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SQLITE_PATH", str(tmp_path / "coordinator.sqlite3"))
    monkeypatch.delenv("RSC_ADMIN_PASSWORD", raising=False)
    sup = make_run.Supervisor(make_run.parse_args(["--var-dir", str(tmp_path / "var"), "--redis-url", REDIS_URL]))
    yield sup
    delete_namespace_keys(tmp_path / "coordinator.sqlite3", REDIS_URL)


def setup_run(sup: make_run.Supervisor, var: Path) -> dict[str, object]:
    var.mkdir(exist_ok=True)
    sup.write_env_file(var)
    sup.manage("migrate", "--noinput", "-v0")
    return json.loads(sup.manage("demo_setup"))


def in_users_shell(command: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in USER_SHELL_DROPS}
    return subprocess.run(["/bin/sh", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_i24_1_the_printed_try_command_works_as_printed_and_a_second_run_suggests_another_count(
    supervisor: make_run.Supervisor, tmp_path: Path,
):
    var = tmp_path / "var"
    first = setup_run(supervisor, var)
    command = supervisor.try_command(first)
    assert command.startswith(f"RSC_ENV_FILE={var / 'run.env'} .venv/bin/python manage.py reshard demo-orders --shards 6")
    done = in_users_shell(command)
    assert done.returncode == 0, done.stderr
    assert "demo-orders" in done.stdout
    assert "Traceback" not in done.stderr
    assert (var / "run.env").stat().st_mode & 0o777 == 0o600  # it holds the admin password

    second = setup_run(supervisor, var)
    again = supervisor.try_command(second)
    assert "--shards 6" not in again  # the stream has 6 (or is getting them)
    assert second["adminPassword"] == first["adminPassword"]  # the login of the first run still works
    # The first run's demo keys are revoked: runs do not pile up live keys.
    with sqlite3.connect(tmp_path / "coordinator.sqlite3") as conn:
        demo_keys = conn.execute("SELECT revoked_at FROM groups_apikey WHERE name IN ('demo member', 'demo producer')"
                                 ).fetchall()
    assert len(demo_keys) == 4
    assert sum(1 for (revoked,) in demo_keys if revoked is None) == 2


def test_i24_1_env_file_errors_are_one_line(tmp_path: Path):
    bad = tmp_path / "bad.env"
    bad.write_text("DEBUG=1\nthis is not a setting\n")
    for path in (bad, tmp_path / "missing.env"):
        p = in_users_shell(f"RSC_ENV_FILE={path} .venv/bin/python manage.py list_groups")
        assert p.returncode == 2
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, p.stderr
        assert str(path) in lines[0]
