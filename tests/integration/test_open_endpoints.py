"""Issue 27.10: `check --deploy` is clean of drf-spectacular's W001 (the API key is described to
the schema), and what answers without a key is what docs/SECURITY.md "Endpoints without a key"
says: /healthz, /readyz and the OpenAPI schema are open by default, /metrics is open until
METRICS_TOKEN is set, and SERVE_API_SCHEMA=0 takes the schema out."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest
from django.test import Client
from django.test.utils import override_settings

from tests import spawn

from .conftest import ROOT, live_database_url

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(databases=["default", "liveness"])]

# What an operator sets in production behind a TLS-terminating proxy (docs/OPERATING.md).
# HSTS for subdomains and preload are the domain owner's choice (SECURITY.md); set here so
# that the check has nothing left to say.
PRODUCTION_TLS = {"SECURE_HSTS_SECONDS": "31536000", "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
                  "SECURE_HSTS_PRELOAD": "1", "SECURE_SSL_REDIRECT": "1", "SECURE_COOKIES": "1",
                  "SECURE_PROXY_SSL_HEADER": "1"}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if k not in {"SECRET_KEY", "DEBUG", "DJANGO_SETTINGS_MODULE", *PRODUCTION_TLS}}
    return spawn.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**base, "DATABASE_URL": live_database_url(), "DEBUG": "0",
             "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "coordinator.example", **env},
    )


def test_i27_10_check_deploy_has_no_spectacular_w001_and_no_warning_with_the_production_tls_settings():
    production = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION_TLS)
    assert production.returncode == 0, production.stdout + production.stderr
    assert "W001" not in production.stdout + production.stderr
    # Without TLS settings (plain HTTP on loopback, the default) only the TLS warnings remain.
    plain = manage("check", "--deploy")
    assert plain.returncode == 0, plain.stderr
    found = {line.split(")")[0].split("(")[-1] for line in (plain.stdout + plain.stderr).splitlines()
             if line.startswith("?: (")}
    assert found <= {"security.W004", "security.W008", "security.W012", "security.W016"}, found


def test_i27_10_the_schema_describes_the_bearer_api_key():
    r = Client().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert r.status_code == 200
    schema = json.loads(r.content)
    assert schema["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    heartbeat = schema["paths"]["/api/v1/groups/{group}/heartbeat"]["post"]
    assert {"apiKey": []} in heartbeat["security"]


def test_i27_10_health_readiness_schema_and_metrics_answer_without_a_key_by_default():
    c = Client()
    assert c.get("/healthz").status_code == 200
    assert c.get("/readyz").status_code in (200, 503)  # its answer is the database's state, not a 401
    assert c.get("/api/schema/").status_code == 200
    assert c.get("/api/docs/").status_code == 200
    assert c.get("/metrics").status_code == 200
    # The API itself never does.
    r = c.get("/api/v1/groups/g1")
    assert r.status_code == 401
    assert r.json()["errorCode"] == "AUTHENTICATION_FAILED"


@override_settings(METRICS_TOKEN="s3cret")
def test_i27_10_metrics_token_closes_metrics_only():
    c = Client()
    assert c.get("/metrics").status_code == 401
    assert c.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
    assert c.get("/readyz").status_code in (200, 503)
    assert c.get("/api/schema/").status_code == 200


def test_i27_10_serve_api_schema_0_takes_the_schema_and_its_ui_out():
    probe = ("from django.test import Client; c = Client(); "
             "print(c.get('/api/schema/').status_code, c.get('/api/docs/').status_code, c.get('/healthz').status_code)")
    off = manage("shell", "-c", probe, SERVE_API_SCHEMA="0", ALLOWED_HOSTS="testserver")
    assert off.returncode == 0, off.stderr
    assert off.stdout.split()[-3:] == ["404", "404", "200"]


def test_operation_ids_are_the_published_ones_whether_or_not_the_schema_is_served():
    # The prefix they leave out is stated (SCHEMA_PATH_PREFIX), not guessed from the paths the
    # URLconf holds: without /api/schema/ (SERVE_API_SCHEMA=0) the guess was /api/v1/.
    probe = ("import json; from drf_spectacular.generators import SchemaGenerator; "
             "s = SchemaGenerator().get_schema(None, True); "
             "print(json.dumps(s['paths']['/api/v1/groups/{group}/heartbeat']['post']['operationId']))")
    for serve in ("1", "0"):
        done = manage("shell", "-c", probe, SERVE_API_SCHEMA=serve)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1]) == "v1_groups_heartbeat_create", serve
