"""Issue 24.3: an operator's mistake gives one line naming the problem and the fix, and a
non-zero exit, never a traceback. Each case runs the real command in a subprocess."""
from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from groups.models import Group
from groups.services import create_group, create_stream
from tests import plain_http, spawn

from .conftest import ROOT, live_database_url, poll, running_gunicorn

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True)]

PYTHON = sys.executable


def run(argv: list[str], *, env: dict[str, str] | None = None, drop: tuple[str, ...] = (),
        timeout: float = 60, shell: bool = False) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in drop}
    base["DATABASE_URL"] = live_database_url()
    return spawn.run(
        argv if not shell else " ".join(argv), cwd=ROOT, env={**base, **(env or {})},
        capture_output=True, text=True, timeout=timeout, shell=shell,
        executable="/bin/bash" if shell else None,
    )


def one_line_error(p: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert p.returncode != 0, (p.stdout, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


NO_SECRET = ("SECRET_KEY", "DEBUG")


def test_i24_3_secret_key_unset_manage_py_prints_one_line():
    p = run([PYTHON, "manage.py", "check"], drop=NO_SECRET)
    line = one_line_error(p, "SECRET_KEY is not set", "secrets.token_urlsafe")
    assert line.startswith("error: ")
    assert p.returncode == 2


def test_i24_3_secret_key_unset_gunicorn_master_stops_with_one_line():
    p = run([PYTHON, "-m", "gunicorn", "-c", "coordinator_project/gunicorn_conf.py", "-b", "127.0.0.1:0",
             "coordinator_project.wsgi"], drop=NO_SECRET, timeout=30)
    one_line_error(p, "gunicorn: error: SECRET_KEY is not set")


@pytest.mark.parametrize("program", ["worker", "beat"])
def test_i24_3_secret_key_unset_celery_prints_one_line(program):
    p = run([PYTHON, "-m", "celery", "-A", "coordinator_project", program, "-l", "warning"],
            drop=NO_SECRET, timeout=30)
    one_line_error(p, "celery: error: SECRET_KEY is not set")


def test_i24_1_read_only_commands_need_no_secret_key():
    create_stream("ro", 2)
    create_group("ro-g", "ro")
    for argv in (["describe_group", "ro-g"], ["list_groups"], ["list_streams"], ["describe_stream", "ro"]):
        p = run([PYTHON, "manage.py", *argv], drop=NO_SECRET)
        assert p.returncode == 0, (argv, p.stderr)
        assert "ro" in p.stdout
    # A command that writes still needs it.
    p = run([PYTHON, "manage.py", "create_stream", "ro2", "--shards", "1"], drop=NO_SECRET)
    one_line_error(p, "SECRET_KEY")


def test_i24_3_unknown_database_url_scheme():
    p = run([PYTHON, "manage.py", "list_groups"], env={"DATABASE_URL": "mongodb://db.example/x"})
    one_line_error(p, "error: DATABASE_URL has an unknown scheme mongodb://", "postgres://")
    p = run([PYTHON, "-m", "gunicorn", "-c", "coordinator_project/gunicorn_conf.py", "-b", "127.0.0.1:0",
             "coordinator_project.wsgi"], env={"DATABASE_URL": "mysql2://x/y"}, timeout=30)
    one_line_error(p, "gunicorn: error: DATABASE_URL has an unknown scheme mysql2://")


def test_i24_3_database_unreachable():
    p = run([PYTHON, "manage.py", "list_groups"],
            env={"DATABASE_URL": "postgres://postgres@127.0.0.1:1/nope", "DB_CONNECT_TIMEOUT": "2"})
    line = one_line_error(p, "cannot use the database PostgreSQL 127.0.0.1:1/nope", "Connection refused",
                          "check DATABASE_URL")
    assert p.returncode == 3, line


def test_i24_3_celery_with_the_database_unreachable():
    p = run([PYTHON, "-m", "celery", "-A", "coordinator_project", "beat", "-l", "warning"],
            env={"DATABASE_URL": "postgres://postgres@127.0.0.1:1/nope", "CELERY_NAMESPACE": ""}, timeout=30)
    one_line_error(p, "celery: error: cannot use the database", "check DATABASE_URL")


def _server_url(name: str) -> str:
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{name}"


def test_i24_3_database_missing():
    name = f"rsc_missing_{uuid.uuid4().hex[:8]}"
    p = run([PYTHON, "manage.py", "list_groups"], env={"DATABASE_URL": _server_url(name)})
    one_line_error(p, f"database '{name}' does not exist", f"createdb {name}", "manage.py migrate")


@pytest.fixture
def empty_database() -> Iterator[str]:
    name = f"rsc_empty_{uuid.uuid4().hex[:8]}"
    admin = _server_url("postgres")
    with psycopg.connect(admin.replace("postgres://", "postgresql://"), autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _server_url(name)
    finally:
        with psycopg.connect(admin.replace("postgres://", "postgresql://"), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("argv", [["list_groups"], ["create_stream", "s", "--shards", "2"],
                                  ["describe_group", "g"]])
def test_i24_3_database_not_migrated(empty_database, argv):
    p = run([PYTHON, "manage.py", *argv], env={"DATABASE_URL": empty_database})
    one_line_error(p, "is not migrated: run manage.py migrate")


def test_i24_3_web_tier_on_a_database_not_migrated_answers_503_naming_migrate(empty_database, tmp_path):
    """gunicorn started before `manage.py migrate`: every API request answers 503
    COORDINATOR_UNAVAILABLE with Retry-After and the fix, never a 500 with a traceback; the
    log says it in one throttled line, not one traceback per request."""
    log = tmp_path / "gunicorn.log"
    with running_gunicorn(log_file=log, DATABASE_URL=empty_database) as server:
        headers = {"Authorization": "Bearer rsc_not_a_key"}
        started = time.monotonic()
        answers = [
            plain_http.post(f"{server.url}/api/v1/groups/g/heartbeat", headers=headers, timeout=10,
                       json={"memberId": "m1", "memberEpoch": 0, "streamName": "s"})
            for _ in range(5)
        ] + [plain_http.get(f"{server.url}/api/v1/groups/g", headers=headers, timeout=10)]
        elapsed = time.monotonic() - started
        for r in answers:
            assert r.status_code == 503, r.text
            assert r.json()["errorCode"] == "COORDINATOR_UNAVAILABLE", r.text
            assert "run manage.py migrate" in r.json()["errorMessage"], r.text
            assert r.headers["Retry-After"]
        r = plain_http.get(f"{server.url}/readyz", timeout=10)
        assert r.status_code == 503, r.text
        assert "migrate" in r.json()["checks"]["database"], r.text
    text = log.read_text()
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if "not migrated" in line]
    # At most one line per worker (two) per 10 s the six requests took: one per request
    # (six) fails this whenever they took under 20 s; none fails it too.
    assert lines, text
    assert len(lines) <= 2 * (1 + int(elapsed // 10)), (elapsed, text)
    assert len(lines) < len(answers) or elapsed >= 20, (elapsed, text)
    assert "run manage.py migrate" in lines[0], lines[0]


def _database_error(sql: str) -> Exception:
    from django.db import DatabaseError, transaction

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)
    except DatabaseError as exc:
        return exc
    raise AssertionError(f"{sql!r} did not fail")


def test_i24_3_a_missing_column_in_a_migrated_database_is_a_bug_not_a_missing_migrate():
    """A missing table is always a database not migrated (the code reads only tables its
    migrations create); a missing column only while migrations are pending: in a fully
    migrated database it is a bug, and keeps its 500 and traceback."""
    from coordinator_project.migration_state import is_not_migrated

    assert is_not_migrated(_database_error("SELECT 1 FROM rsc_no_such_table"))
    assert not is_not_migrated(_database_error("SELECT no_such_column FROM groups_group"))
    assert not is_not_migrated(_database_error("SELECT 1/0"))


def test_i24_3_redis_unreachable_where_a_command_needs_it():
    create_stream("rd", 2)
    p = run([PYTHON, "manage.py", "reshard", "rd", "--shards", "3"],
            env={"REDIS_URL": "redis://127.0.0.1:1/0", "STREAM_REDIS_URL": "redis://127.0.0.1:1/0"})
    one_line_error(p, "STREAM_REDIS_URL", "Connection refused")


def test_i24_3_celery_beat_with_redis_unreachable_says_so_in_one_line_per_attempt(tmp_path: Path) -> None:
    """Beat with REDIS_URL down: Celery retries the broker (a supervisor's outage is not a
    configuration error), and says why in one line per attempt; the installation identity it
    cannot publish at start is one line too, not a 40-line traceback."""
    log = tmp_path / "beat.log"
    down = "redis://127.0.0.1:1/0"
    env = {**os.environ, "DATABASE_URL": live_database_url(), "REDIS_URL": down, "STREAM_REDIS_URL": down}
    with log.open("w") as out:
        beat = spawn.Popen([PYTHON, "-m", "celery", "-A", "coordinator_project", "beat", "-l", "warning",
                                 "--schedule", str(tmp_path / "schedule")],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        assert poll(lambda: "beat: Connection error" in log.read_text(), 60), log.read_text()
    finally:
        beat.terminate()
        beat.wait(20)
    text = log.read_text()
    assert "Traceback" not in text, text
    identity = [line for line in text.splitlines() if "installation identity" in line]
    assert len(identity) == 1, text
    assert "Connection refused; check STREAM_REDIS_URL" in identity[0], identity[0]


def test_i24_3_output_piped_into_head_exits_quietly():
    stream = create_stream("bp", 1)
    # A line per group, ~300 KiB: more than a pipe's buffer (64 KiB) and head's one read (GNU
    # head reads up to 128 KiB) together, so the command is surely still writing when head
    # has gone. (One big write cut short by the closed pipe ends quietly in any case.)
    # Rows only (list_groups reads nothing else): the service would take a minute here.
    Group.objects.bulk_create(Group(name=f"bp-{i:04d}", stream=stream) for i in range(2500))
    pipeline = [PYTHON, "manage.py", "list_groups", "|", "head", "-1", ";", "exit", "${PIPESTATUS[0]}"]
    p = run(pipeline, shell=True)  # noqa: S604 - the tests' own pipeline
    assert p.stdout.startswith("GROUP ")  # the header row
    assert p.stdout.count("\n") == 1
    assert "Traceback" not in p.stderr
    assert "BrokenPipe" not in p.stderr, p.stderr
    assert p.returncode == 141  # 128 + SIGPIPE, as a shell tool stopped by the pipe


def _members_before_newest_column() -> tuple[str, str] | None:
    """(the members migration before the newest one that adds a column every group read
    loads, that one). A column read only with members (issue 25.7's library_version, read by
    describe for the page's members) is not met by list_members on an empty group."""
    from assignments.rows import MEMBER_COLUMNS

    files = sorted((ROOT / "members" / "migrations").glob("0*.py"))
    for older, newer in reversed(list(itertools.pairwise(files))):
        text = newer.read_text()
        added = re.findall(r"migrations\.AddField\(\s*model_name='member',\s*name='(\w+)'", text)
        if any(name in MEMBER_COLUMNS for name in added):
            return older.stem, newer.stem
    return None


def _admin_execute(sql: str) -> None:
    admin = _server_url("postgres")
    with psycopg.connect(admin.replace("postgres://", "postgresql://"), autocommit=True) as c:
        c.execute(sql)


@pytest.fixture(scope="module")
def older_release_template() -> Iterator[tuple[str, str]]:
    """A database migrated, with a group and a member, then members rolled back before its
    newest column: what an upgrade without `migrate` leaves. (Database name, the missing
    migration.) Built once per module and cloned per test: each build is a full migrate
    and a rollback (~10 s of subprocesses), the clone a file copy."""
    found = _members_before_newest_column()
    if found is None:
        pytest.skip("no members migration adds a column to roll back")
    older, newer = found
    name = f"rsc_older_{uuid.uuid4().hex[:8]}"
    _admin_execute(f'CREATE DATABASE "{name}"')
    try:
        env = {"DATABASE_URL": _server_url(name)}
        done = run([PYTHON, "manage.py", "migrate", "--noinput"], env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        # The rows, as the commands and a member's join write them (while the column exists),
        # then the rollback: one Django start-up instead of four.
        setup = ("from django.core.management import call_command;"
                 " from coordination.model import MemberStatus; from groups.models import Group;"
                 " from members.models import Member;"
                 " call_command('create_stream', 'up', '--shards', '2');"
                 " call_command('create_group', 'upg', '--stream', 'up');"
                 " Member.objects.create(group=Group.objects.get(name='upg'), member_id='m1',"
                 " status=MemberStatus.STABLE);"
                 f" call_command('migrate', 'members', {older!r}, '--noinput')")
        done = run([PYTHON, "manage.py", "shell", "-c", setup], env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        yield name, newer
    finally:
        _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def older_release_database(older_release_template: tuple[str, str]) -> Iterator[tuple[str, str]]:
    """A fresh copy of the older-release database (URL, the missing migration): one test
    migrates it."""
    template, newer = older_release_template
    name = f"rsc_older_{uuid.uuid4().hex[:8]}"
    _admin_execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield _server_url(name), newer
    finally:
        _admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_i24_3_database_of_an_older_release_says_run_migrate(older_release_database):
    """An upgrade without `migrate`: the tables exist but lack this release's columns."""
    url, newer = older_release_database
    p = run([PYTHON, "manage.py", "list_members", "upg"], env={"DATABASE_URL": url})
    one_line_error(p, "lacks migrations of this release", f"members.{newer}", "run manage.py migrate")
    assert p.returncode == 3


def test_i24_3_web_tier_on_an_older_release_database_is_not_ready(older_release_database):
    """Every heartbeat would be a 500 there: /readyz answers 503 naming the fix, so a load
    balancer keeps the node out, and 200 once `manage.py migrate` ran (no restart)."""
    url, newer = older_release_database
    made = run([PYTHON, "manage.py", "create_api_key", "--group", "upg"], env={"DATABASE_URL": url})
    assert made.returncode == 0, made.stderr
    headers = {"Authorization": f"Bearer {made.stdout.split()[-1]}"}
    join = {"memberId": "m2", "memberEpoch": 0, "streamName": "up"}
    with running_gunicorn(workers=1, DATABASE_URL=url) as server:
        r = plain_http.get(f"{server.url}/readyz", timeout=10)
        assert r.status_code == 503, r.text
        assert f"members.{newer}" in r.json()["checks"]["database"]
        assert "run manage.py migrate" in r.json()["checks"]["database"]
        # A join reads the member columns the older database lacks: 503 naming the fix, not 500.
        r = plain_http.post(f"{server.url}/api/v1/groups/upg/heartbeat", headers=headers, json=join, timeout=10)
        assert r.status_code == 503, r.text
        assert "run manage.py migrate" in r.json()["errorMessage"], r.text
        done = run([PYTHON, "manage.py", "migrate", "--noinput"], env={"DATABASE_URL": url}, timeout=300)
        assert done.returncode == 0, done.stderr
        r = plain_http.get(f"{server.url}/readyz", timeout=10)
        assert r.status_code == 200, r.text
        r = plain_http.post(f"{server.url}/api/v1/groups/upg/heartbeat", headers=headers, json=join, timeout=10)
        assert r.status_code == 200, r.text


def test_i24_3_a_metrics_directory_that_does_not_exist(tmp_path):
    """PROMETHEUS_MULTIPROC_DIR from a shared env file, on a host (or after a reboot) where the
    directory is not there yet: commands make it, as gunicorn does; one that cannot be made is one
    line naming the setting."""
    missing = tmp_path / "run" / "rsc-metrics"
    p = run([PYTHON, "manage.py", "list_streams"], env={"PROMETHEUS_MULTIPROC_DIR": str(missing)})
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert missing.is_dir()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    p = run([PYTHON, "manage.py", "list_streams"], env={"PROMETHEUS_MULTIPROC_DIR": str(blocker / "metrics")})
    one_line_error(p, "PROMETHEUS_MULTIPROC_DIR=", "cannot be made", "writable directory")
    assert p.returncode == 2
