"""groups.vacuum: `manage.py migrate` says, in one warning line, when PostgreSQL will not vacuum
the tables every heartbeat updates (autovacuum or track_counts off, or a table's own
autovacuum_enabled = false)."""
from __future__ import annotations

import logging

import pytest
from django.core.management import call_command
from django.db import connection

from groups.vacuum import busiest_tables, database_vacuum_problem, vacuum_problem


def test_vacuum_problem_names_each_thing_that_is_off_and_nothing_when_all_is_on():
    assert vacuum_problem("on", "on", []) is None
    line = vacuum_problem("off", "on", [])
    assert line is not None
    assert "(autovacuum = off)" in line
    assert "\n" not in line
    line = vacuum_problem("on", "off", ["members_member"])
    assert line is not None
    assert "(track_counts = off; autovacuum_enabled = false on members_member)" in line


def _server_settings() -> tuple[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum'), current_setting('track_counts')")
        return cursor.fetchone()


@pytest.mark.django_db
@pytest.mark.needs_postgres
def test_the_database_check_reads_the_server_settings_and_each_tables_own():
    autovacuum, track_counts = _server_settings()
    assert database_vacuum_problem() == vacuum_problem(autovacuum, track_counts, [])
    members, slots, _ = busiest_tables()
    with connection.cursor() as cursor:  # rolled back with the test
        cursor.execute(f"ALTER TABLE {slots} SET (autovacuum_enabled = off)")
        cursor.execute(f"ALTER TABLE {members} SET (autovacuum_enabled = false)")
    assert database_vacuum_problem() == vacuum_problem(autovacuum, track_counts, sorted([members, slots]))


@pytest.mark.django_db
@pytest.mark.needs_postgres
def test_migrate_logs_the_line_once_when_vacuum_is_off(caplog: pytest.LogCaptureFixture):
    members = busiest_tables()[0]
    with connection.cursor() as cursor:  # off for one table, whatever the server's setting
        cursor.execute(f"ALTER TABLE {members} SET (autovacuum_enabled = false)")
    with caplog.at_level(logging.WARNING, logger="groups.vacuum"):
        call_command("migrate", verbosity=0)
    lines = [r.getMessage() for r in caplog.records if r.name == "groups.vacuum"]
    assert lines == [database_vacuum_problem()], lines
    assert f"autovacuum_enabled = false on {members}" in lines[0]

