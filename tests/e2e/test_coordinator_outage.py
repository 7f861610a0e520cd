"""Issue 27.11, end to end: the coordinator (gunicorn) stopped longer than the session timeout,
while nothing expired anybody, then started again on the same address. Real member processes
(``python -m dataplane consume``) lose their session locally and abort their shards; on the
way back each asks at its last epoch holding nothing and resumes its assignment: no member
rejoins at epoch 0, no shard moves, nothing is lost."""

from __future__ import annotations

import time
from urllib.parse import urlparse

import pytest
from django.utils import timezone

from groups.models import Event
from members.models import Member
from tests.integration.conftest import running_gunicorn

from .conftest import Ledger, World, wait_for

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]

SESSION_MS = 3000
LAPSED = "session timeout without an accepted heartbeat"


def test_i27_11_no_member_rejoins_after_a_coordinator_outage_longer_than_the_session(
    world: World, tmp_path
) -> None:
    world.create(4, heartbeat_interval_ms=250, session_timeout_ms=SESSION_MS, rebalance_timeout_ms=20_000)
    members = {"a", "b"}
    for mid in sorted(members):
        world.start_cli_member(mid)
    world.wait(lambda: world.stable_with(members), 30, "2 members STABLE")
    owners = world.owners()
    epochs = {m["memberId"]: m["memberEpoch"] for m in world.describe()["members"]}
    settled_at = Event.objects.filter(group__name=world.group).order_by("-id").values_list("id", flat=True)[0]

    keys = [f"k{i}" for i in range(40)]
    ledger = Ledger()
    producer = world.producer()
    ledger.send(producer, ledger.items(keys, 200))

    def handled(n: int) -> bool:
        world.results.poll()
        return len(world.results.first) >= n

    world.wait(lambda: handled(200), 30, "phase 1 handled")

    # The outage: no sweeps run (nothing expires anybody), only the members' clocks run.
    port = urlparse(world.server.url).port
    stopped_at = time.monotonic()
    world.server.process.terminate()
    world.server.process.wait(10)
    wait_for(lambda: all(LAPSED in world.members[m].log_text() for m in members), 30,
             "every member's local session lapse", diag=world.diag)
    assert time.monotonic() - stopped_at >= SESSION_MS / 1000

    with running_gunicorn(port=port, workers=1, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus-2")):
        restarted_at = timezone.now()
        # Before any sweep: each member's first answer decides (resumed, or rejoined), and
        # the sweeps start only once every member's heartbeat since the restart is recorded
        # (this test is about the member; the coordinator's own L1 grace is not its subject).
        wait_for(lambda: all(("resuming its assignment" in world.members[m].log_text()
                              or "rejoined" in world.members[m].log_text()) for m in members),
                 30, "every member answered after the restart", diag=world.diag)
        wait_for(lambda: Member.objects.filter(group__name=world.group, member_id__in=members,
                                               last_heartbeat_at__gte=restarted_at).count() == len(members),
                 30, "every member's heartbeat since the restart recorded", diag=world.diag)
        world.wait(lambda: world.stable_with(members), 30, "2 members STABLE after the outage")
        ledger.send(producer, ledger.items(keys, 200, start=200))
        world.wait(lambda: handled(400), 30, "phase 2 handled")
        world.wait(lambda: world.total_pending() == 0, 30, "no pending entries left")

        kinds = list(Event.objects.filter(group__name=world.group, id__gt=settled_at)
                     .values_list("kind", flat=True))
        assert not {"joined", "rejoined", "expired", "fenced", "left", "rebalanced"} & set(kinds), kinds
        for m in members:
            assert "rejoined" not in world.members[m].log_text(), world.members[m].log_text()[-3000:]
        assert world.owners() == owners
        assert {m["memberId"]: m["memberEpoch"] for m in world.describe()["members"]} == epochs
        world.assert_nothing_lost(ledger)
        world.assert_key_order(ledger)
