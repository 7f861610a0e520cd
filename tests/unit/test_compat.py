"""Issue 23.6: what the coordinator takes from its libraries' private attributes still works.

Each compat module's `problems()` names what an upgrade removed, and each function is checked
for the behaviour the coordinator relies on, so an upgrade that changes one fails here, by
name, instead of somewhere in a heartbeat under load.
"""
from __future__ import annotations

import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from prometheus_client import CollectorRegistry, Histogram
from rest_framework.request import Request

from coordinator_project.compat import django as compat_django
from coordinator_project.compat import drf as compat_drf
from coordinator_project.compat import prometheus_client as compat_prometheus
from coordinator_project.compat import psycopg as compat_psycopg
from coordinator_project.compat import psycopg_pool as compat_psycopg_pool
from webserver import compat as compat_gunicorn


@pytest.mark.parametrize("module", [compat_django, compat_drf, compat_prometheus, compat_psycopg_pool,
                                    compat_psycopg, compat_gunicorn],
                         ids=lambda m: m.__name__)
def test_i23_6_nothing_a_compat_module_relies_on_is_gone(module):
    assert module.problems() == []


@pytest.mark.django_db  # close() sends request_finished, which checks the connections
def test_i23_6_django_runs_an_added_closer_after_its_own_when_the_response_closes():
    response = HttpResponse(b"x")
    order = []
    response._resource_closers.append(lambda: order.append("django's"))
    compat_django.add_closer(response, lambda: order.append("ours"))
    response.close()
    assert order == ["django's", "ours"]


def test_i23_6_django_logs_no_second_line_for_a_response_marked_logged():
    import logging

    from django.utils.log import log_response

    # A logger of the test's own, outside the logging tree: what is checked is log_response's
    # reading of the flag, and the suite's shared django.request logger (its throttle, other
    # tests' configuration, server threads still running in this process) twice swallowed the
    # control line in CI. logging.disable() would still silence it, so it is lifted meanwhile.
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.Logger("compat-check", logging.WARNING)
    logger.addHandler(handler)
    disabled = logging.root.manager.disable
    logging.disable(logging.NOTSET)
    try:
        response = HttpResponse(status=404)
        compat_django.mark_logged(response)
        log_response("Not Found: %s", "/x", response=response, logger=logger)
        assert records == []
        log_response("Not Found: %s", "/x", response=HttpResponse(status=404), logger=logger)
        assert len(records) == 1  # the control: an unmarked response is logged
    finally:
        logging.disable(disabled)


@pytest.mark.django_db(transaction=True)
def test_i23_6_django_tells_the_outermost_transaction_apart():
    from django.db import connection, transaction

    with transaction.atomic():
        assert compat_django.outermost_transaction(connection)
        with transaction.atomic():
            assert not compat_django.outermost_transaction(connection)


def test_i23_6_drf_gives_the_django_request_and_the_parsed_body_only_once_parsed():
    raw = RequestFactory().post("/", data=b'{"memberId": "a"}', content_type="application/json")
    from rest_framework.parsers import JSONParser

    request = Request(raw, parsers=[JSONParser()])
    assert compat_drf.http_request(request) is raw
    assert compat_drf.parsed_data(request) is None  # not parsed: not read for a log line
    assert request.data == {"memberId": "a"}
    assert compat_drf.parsed_data(request) == {"memberId": "a"}
    assert compat_drf.parsed_data(None) is None


def test_i23_6_prometheus_histogram_takes_bulk_observations_as_observe_would():
    buckets = (0.1, 1.0)
    one_by_one = Histogram("a_seconds", "a", buckets=buckets, registry=CollectorRegistry())
    bulk = Histogram("a_seconds", "a", buckets=buckets, registry=CollectorRegistry())
    values = [0.05, 0.5, 0.5, 3.0]
    for v in values:
        one_by_one.observe(v)
    compat_prometheus.add_observations(bulk, sum(values), [1, 2, 1])

    def series(h: Histogram) -> list:
        return [(s.name, s.labels, s.value) for m in h.collect() for s in m.samples if not s.name.endswith("_created")]

    assert series(bulk) == series(one_by_one)
    with pytest.raises(ValueError, match="bucket counts"):
        compat_prometheus.add_observations(bulk, 1.0, [1, 2])


def test_i23_6_a_name_an_upgrade_removed_is_reported(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(compat_psycopg_pool, "POOL_METHODS", (*compat_psycopg_pool.POOL_METHODS, "_gone"))
    assert compat_psycopg_pool.problems() == ["psycopg_pool.ConnectionPool._gone is gone"]
    from prometheus_client import Histogram as H

    monkeypatch.setattr(H, "_metric_init", lambda self: None)  # as if _sum and _buckets were renamed
    assert len(compat_prometheus.problems()) == 2
    monkeypatch.setattr(compat_gunicorn, "RESPONSE_METHODS", (*compat_gunicorn.RESPONSE_METHODS, "_gone"))
    monkeypatch.setattr(compat_gunicorn, "RESPONSE_ATTRIBUTES", (*compat_gunicorn.RESPONSE_ATTRIBUTES, "gone"))
    assert compat_gunicorn.problems() == ["gunicorn.http.wsgi.Response._gone is gone",
                                          "a gunicorn.http.wsgi.Response has no gone"]
    from psycopg import _queries

    monkeypatch.delattr(_queries, "MAX_CACHED_STATEMENT_PARAMS")
    assert compat_psycopg.problems() == ["psycopg._queries.MAX_CACHED_STATEMENT_PARAMS is gone"]
    assert compat_psycopg.cached_query_bounds() == (_queries.MAX_CACHED_STATEMENT_LENGTH, 50)  # the fallback


PRIVATE = {"_resource_closers", "atomic_blocks", "_has_been_logged", "_full_data", "_request", "_sum",
           "_buckets"}


def test_i23_6_those_private_attributes_are_read_only_in_the_compat_modules():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = []
    for app in ("assignments", "groups", "members", "coordinator_project", "webserver"):
        for path in sorted((root / app).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if "migrations" in path.parts or rel.startswith("coordinator_project/compat/"):
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if (isinstance(node, ast.Attribute) and node.attr in PRIVATE
                        and ast.unparse(node.value) != "self"):  # a class's own attribute
                    found.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    assert found == []
