"""Issue 8.7: a missing SECRET_KEY is fatal, TLS settings by environment, log lines cannot be
forged with control characters, and the API docs load nothing from a CDN."""
from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys

import pytest
from django.conf import settings
from django.test import Client

from coordinator_project.logging import JsonFormatter, TextFormatter
from tests import spawn

from .conftest import ROOT, GroupFixture

FORGED = "g1\n2026-01-01 00:00:00 CRITICAL forged line\x1b[2J\u2028"


def run_settings(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG"}}
    return spawn.run(
        [sys.executable, "-c", "import django; django.setup()\n" + code],
        cwd=ROOT, env={**base, "DJANGO_SETTINGS_MODULE": "coordinator_project.settings", **env},
        capture_output=True, text=True, timeout=60,
    )


def test_secret_key_unset_with_debug_off_refuses_to_start():
    refused = run_settings("", DEBUG="0")
    assert refused.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY is not set (and DEBUG is off)" in refused.stderr
    assert run_settings("", DEBUG="1").returncode == 0  # the quick start keeps its dev key
    assert run_settings("", DEBUG="0", SECRET_KEY="k" * 50).returncode == 0


SECURITY_PROBE = """
import json
from django.test import Client
c = Client()
plain = c.get("/healthz")
redirect = c.get("/api/docs/")
https = c.get("/healthz", headers={"X-Forwarded-Proto": "https"})
print(json.dumps({"plain": plain.status_code, "redirect": [redirect.status_code, redirect.get("Location")],
                  "hsts": https.get("Strict-Transport-Security"),
                  "cookies": [__import__("django.conf").conf.settings.SESSION_COOKIE_SECURE,
                              __import__("django.conf").conf.settings.CSRF_COOKIE_SECURE]}))
"""


def test_production_security_settings_switch_on_by_environment():
    on = run_settings(SECURITY_PROBE, SECRET_KEY="k" * 50, SECURE_HSTS_SECONDS="31536000",
                      SECURE_SSL_REDIRECT="1", SECURE_COOKIES="1", SECURE_PROXY_SSL_HEADER="1")
    assert on.returncode == 0, on.stderr
    seen = json.loads(on.stdout.strip().splitlines()[-1])
    assert seen["plain"] == 200  # probes stay on plain HTTP (SECURE_REDIRECT_EXEMPT)
    assert seen["redirect"] == [301, "https://testserver/api/docs/"]
    assert seen["hsts"] == "max-age=31536000"  # only on HTTPS, as seen through the proxy header
    assert seen["cookies"] == [True, True]
    off = run_settings(SECURITY_PROBE, SECRET_KEY="k" * 50)
    seen = json.loads(off.stdout.strip().splitlines()[-1])
    assert seen["redirect"][0] == 200
    assert seen["hsts"] is None
    assert seen["cookies"] == [False, False]


def _formatted(formatter: logging.Formatter, logger: str, emit: object) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    log = logging.getLogger(logger)
    log.addHandler(handler)
    try:
        emit()  # type: ignore[operator]
    finally:
        log.removeHandler(handler)
    return stream.getvalue()


@pytest.mark.django_db
def test_control_characters_in_names_never_reach_the_log_raw(orders: GroupFixture):
    text = TextFormatter(settings.LOGGING["formatters"]["text"]["format"])
    url = "/api/v1/groups/" + FORGED.replace("\n", "%0A").replace("\x1b", "%1B").replace("\u2028", "%E2%80%A8")
    out = _formatted(text, "coordinator.heartbeat", lambda: Client().post(
        url + "/heartbeat", {"memberId": "a", "memberEpoch": 0}, content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {orders.key}"))
    assert "heartbeat rejected INVALID_REQUEST" in out  # a control character is no group name
    lines = out.splitlines()
    assert len(lines) == 1, out
    assert not lines[0].startswith("2026-01-01"), out
    assert "\x1b" not in out
    assert "\u2028" not in out
    assert r"g1\n2026-01-01 00:00:00 CRITICAL forged line\x1b[2J\u2028" in out
    # The JSON format escapes them too (json.dumps), message and fields alike.
    out = _formatted(JsonFormatter(), "coordinator.test", lambda: logging.getLogger("coordinator.test").warning(
        "group=%s", FORGED, extra={"group": FORGED}))
    assert len(out.splitlines()) == 1
    assert "\x1b" not in out
    assert "\u2028" not in out
    assert json.loads(out)["group"] == FORGED


def test_text_formatter_leaves_the_record_unchanged_for_other_handlers():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "name=%s", (FORGED,), None)
    TextFormatter("%(message)s").format(record)
    assert record.getMessage() == "name=" + FORGED


def test_api_docs_load_swagger_ui_from_local_static_files_not_a_cdn():
    c = Client()
    page = c.get("/api/docs/").content.decode()
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page)
    bundle = [a for a in assets if a.endswith("swagger-ui-bundle.js")]
    assert bundle, assets
    assert all(a.startswith("/static/drf_spectacular_sidecar/") for a in bundle), assets
    assert not re.search(r"https?://", " ".join(assets)), assets
    assert "cdn" not in page.lower()
    assert c.get(bundle[0]).status_code == 200  # and it is served
