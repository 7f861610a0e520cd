"""Run by test_sqlite_quickstart.py in a subprocess with DATABASE_URL unset (SQLite)."""
from __future__ import annotations

import os
import sys
from datetime import timedelta

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator_project.settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from groups.services import create_api_key, create_group, create_stream  # noqa: E402
from groups.sweeps import run_all_sweeps  # noqa: E402
from members.models import Member  # noqa: E402

assert settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"), settings.DATABASES
call_command("migrate", verbosity=0)
create_stream("orders", 4)
create_group("billing", "orders", session_timeout_ms=30_000)
key = create_api_key(group="billing")
client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")


def hb(body: dict) -> dict:
    r = client.post("/api/v1/groups/billing/heartbeat", body, content_type="application/json")
    assert r.status_code in (200, 409), (r.status_code, r.content)
    return r.json()


a = hb({"memberId": "a", "memberEpoch": 0})
assert a["status"] == "OK", a
assert len(a["assignment"]["assignedShards"]) == 4, a
b = hb({"memberId": "b", "memberEpoch": 0})
assert len(b["assignment"]["pendingShards"]) == 2, b
ra = hb({"memberId": "a", "memberEpoch": a["memberEpoch"], "metadataEpoch": 1,
         "ownedShards": a["assignment"]["assignedShards"]})
assert ra["status"] == "REVOKE_PENDING", ra
revoked = ra["assignment"]["revokingShards"]
ra = hb({"memberId": "a", "memberEpoch": ra["memberEpoch"], "metadataEpoch": 1,
         "ownedShards": ra["assignment"]["assignedShards"],
         "revokingShards": [{"shard": s, "state": "REVOKED"} for s in revoked]})
assert ra["status"] == "OK", ra
rb = hb({"memberId": "b", "memberEpoch": b["memberEpoch"], "metadataEpoch": 1, "ownedShards": []})
assert rb["assignment"]["assignedShards"] == sorted(revoked), rb
stale = hb({"memberId": "b", "memberEpoch": rb["memberEpoch"], "metadataEpoch": 1,
            "ownedShards": ra["assignment"]["assignedShards"]})
assert stale["errorCode"] == "FENCED_MEMBER_EPOCH", stale

# L1 on SQLite: the sweep's candidate query and the locked pass.
Member.objects.filter(member_id="b").update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))
swept = run_all_sweeps()
assert swept["liveness"]["expired"] == {"billing": ["b"]}, swept
gone = hb({"memberId": "b", "memberEpoch": rb["memberEpoch"], "metadataEpoch": 1})
assert gone["errorCode"] == "UNKNOWN_MEMBER_ID", gone

# A reshard on SQLite (seal markers go to REDIS_URL).
call_command("reshard", "orders", "--shards", "2", verbosity=0)
run_all_sweeps()
doc = client.get("/api/v1/groups/billing").json()
assert doc["streamState"] in ("SEALING", "DRAINING"), doc
print("sqlite flow ok")
sys.exit(0)
