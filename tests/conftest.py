"""Shared fixtures. Integration tests need PostgreSQL (DATABASE_URL) and Redis (REDIS_URL)."""
from __future__ import annotations

import gc
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

# Tests that share something one machine has once run on one xdist worker (`make test` runs
# with `--dist loadgroup`): the browser (its session fixture may apt-get install Chromium) and
# the throw-away Redis Cluster (a session fixture: one cluster, not one per worker). So do the
# tests of a module fixture that is costly to build, which every worker that runs one of them
# would build again: the 10,000-member group (~5 CPU-s) and the older release's database (a
# migrate and a rollback, ~10 s of subprocesses).
XDIST_GROUPS = {"browser": "browser", "cluster_url": "redis-cluster", "_big_copy": "describe-paging-big",
                "older_release_template": "older-release-template"}


# The suite is CPU-bound on two cores, and a tenth of an xdist worker's CPU went to the cyclic
# collector walking what lives the whole run: pytest, Django, hypothesis and every test module
# (~200,000 objects). So no pass while the test modules are imported, then all of it frozen
# and full passes rare, as in a web worker (webserver.collector.settle), with young passes every
# 10,000 allocations: a worker's collector CPU in a run went from 3-8 s to under 2 s.
gc.disable()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    import hypothesis  # noqa: F401 - its entry points run now (see below)

    from webserver.collector import settle

    # Imported before the freeze: on import Hypothesis registers trio's PRNG (an entry point),
    # and it checks that PRNG's referrers with gc.get_referrers, which cannot see frozen objects
    # (a run of a few files, where nothing imported Hypothesis yet, warned that it could not).
    gc.collect()
    gc.set_threshold(10_000)
    settle()
    gc.enable()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is None:
        # The process's last test, before the session's fixtures drop the test database: with
        # full passes rare, a connection a test left in a reference cycle could still be open
        # ("database ... is being accessed by other users", seen once at a worker's end).
        gc.collect()


def xdist_group_of(item: pytest.Item) -> str | None:
    """The XDIST_GROUPS group of a test: by a fixture it uses, or by its directory under tests/."""
    names = set(getattr(item, "fixturenames", ())) | {item.nodeid.split("/")[1]}
    return next((group for key, group in XDIST_GROUPS.items() if key in names), None)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("DATABASE_URL", "").startswith("postgres"):
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL (make test does)")
    for item in items:
        if "needs_postgres" in item.keywords:
            item.add_marker(skip)


# A table the flush empties by DELETE holds at most this many rows and bytes (its indexes and
# TOAST included); a bigger one is TRUNCATEd, which also drops what dead rows left behind.
FLUSH_DELETE_MAX_ROWS, FLUSH_DELETE_MAX_BYTES = 1000, 1 << 20


def _flush_nonempty_sql(tables: list[str]) -> str:
    """One statement that empties those of `tables` that hold a row: small ones by DELETE,
    after the same ACCESS EXCLUSIVE lock a TRUNCATE takes (so it waits for whatever still
    writes to them, as before); big ones by TRUNCATE ... CASCADE (a referencing table must go
    in the same TRUNCATE even when it is empty). A TRUNCATE makes a new file for each table,
    index and TOAST relation and drops the old ones: ~50 ms of PostgreSQL's CPU for a handful
    of tables, against ~1 ms to DELETE their rows (docs/decisions/0019). The coordinator's
    foreign keys are checked at commit (Django makes them DEFERRABLE INITIALLY DEFERRED), so
    the DELETEs' order does not matter."""
    names = ", ".join("'" + t.replace("'", "''") + "'" for t in tables)
    return (
        "DO $rsc_flush$ DECLARE t text; n bigint; small text[] := '{}'; big text[] := '{}'; BEGIN"
        f" FOREACH t IN ARRAY ARRAY[{names}]::text[] LOOP"
        " EXECUTE 'SELECT count(*) FROM (SELECT 1 FROM ' || quote_ident(t)"
        f" || ' LIMIT {FLUSH_DELETE_MAX_ROWS + 1}) r' INTO n;"
        f" IF n > {FLUSH_DELETE_MAX_ROWS}"
        f" OR (n > 0 AND pg_total_relation_size(quote_ident(t)::regclass) > {FLUSH_DELETE_MAX_BYTES}) THEN"
        " big := big || quote_ident(t); ELSIF n > 0 THEN small := small || quote_ident(t); END IF; END LOOP;"
        " IF cardinality(big) > 0 THEN EXECUTE 'TRUNCATE ' || array_to_string(big, ', ') || ' CASCADE'; END IF;"
        " IF cardinality(small) > 0 THEN"
        " EXECUTE 'LOCK TABLE ' || array_to_string(small, ', ') || ' IN ACCESS EXCLUSIVE MODE';"
        " FOREACH t IN ARRAY small LOOP EXECUTE 'DELETE FROM ' || t; END LOOP; END IF; END $rsc_flush$;"
    )


# Rows the flush's post_migrate signal writes back at once, the same each time (no test writes
# them): kept, so the signal (content types and permissions only) has nothing to do.
_REFERENCE_TABLES = frozenset({"django_content_type", "auth_permission"})


@pytest.fixture(scope="session", autouse=True)
def _flush_only_tables_with_rows() -> Iterator[None]:
    """Transactional tests end with Django's flush: one TRUNCATE of all 25 tables (and their
    ~100 indexes), each a new file and WAL, ~0.1 s alone and ~0.5-1 s on the loaded suite,
    after each of ~500 tests. Most tests leave a few rows in a handful of tables: emptying only
    those, and the small ones by DELETE (_flush_nonempty_sql), leaves the database as empty as
    before (no sequence reset either way), content types and permissions aside
    (_REFERENCE_TABLES). A flush that resets sequences keeps Django's own statement. The
    flush's post_migrate signal then runs only if content types are gone (it rewrites them and
    the permissions): ~40 SELECTs that find everything in place otherwise."""
    from django.core.management.commands import flush
    from django.db import connections
    from django.db.backends.postgresql.operations import DatabaseOperations

    original = DatabaseOperations.sql_flush
    emit_post_migrate = flush.emit_post_migrate_signal

    def emit_if_emptied(verbosity: int, interactive: bool, db: str, **kwargs: Any) -> None:
        with connections[db].cursor() as cursor:
            cursor.execute("SELECT EXISTS (SELECT 1 FROM django_content_type)")
            if cursor.fetchone()[0]:
                return
        emit_post_migrate(verbosity, interactive, db, **kwargs)

    def sql_flush(self: DatabaseOperations, style: Any, tables: list[str], *, reset_sequences: bool = False,
                  allow_cascade: bool = False) -> list[str]:
        if reset_sequences or not tables:
            return original(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return [_flush_nonempty_sql([t for t in tables if t not in _REFERENCE_TABLES])]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "sql_flush", sql_flush)
        patch.setattr(flush, "emit_post_migrate_signal", emit_if_emptied)
        yield


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """No statement timeout in the test runner itself (issue 8.4 sets one for production).

    Dropping the test database waits up to 5 s for the backends of gunicorn workers a test
    just stopped; a 5 s statement timeout would cancel that DROP. Live servers started by
    the tests read the environment and keep the shipped timeouts.
    """
    from django.conf import settings

    for db in settings.DATABASES.values():
        options = db.get("OPTIONS", {})
        if "statement_timeout" in options.get("options", ""):
            options["options"] = re.sub(r"statement_timeout=\d+", "statement_timeout=0", options["options"])
