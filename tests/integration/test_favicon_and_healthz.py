"""/favicon.ico (every admin page's browser asks for it) and /healthz's run id (issue 12)."""
from __future__ import annotations

import pytest
from django.test import Client


def test_favicon_is_served_with_a_long_cache():
    r = Client().get("/favicon.ico")
    assert r.status_code == 200
    assert r["Content-Type"] == "image/x-icon"
    body = b"".join(r.streaming_content)
    assert body[:4] == b"\x00\x00\x01\x00"
    assert len(body) > 100
    assert "max-age=86400" in r["Cache-Control"]
    assert Client().post("/favicon.ico").status_code == 405


@pytest.mark.django_db
def test_admin_login_page_and_its_favicon_both_answer():
    c = Client()
    assert c.get("/admin/login/").status_code == 200
    assert c.head("/favicon.ico").status_code == 200


def test_healthz_reports_the_run_id_make_run_set(monkeypatch: pytest.MonkeyPatch):
    assert Client().get("/healthz").json() == {"status": "ok"}
    monkeypatch.setenv("RSC_RUN_ID", "abc123")
    assert Client().get("/healthz").json() == {"status": "ok", "runId": "abc123"}
