"""A real browser against the admin: log in, read the assignment matrix, fence a member.

Headless Chromium (selenium) talks to pytest-django's live server on the test database;
the members heartbeat over HTTP against the same server. Screenshots land in
var/screenshots/ (or $RSC_SCREENSHOT_DIR); with RSC_UPDATE_DOCS_SCREENSHOTS=1 the ones used by
the docs (DOCS_SCREENSHOTS) are also copied to docs/.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import Permission, User
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

from groups.models import Event, Group
from members.models import Member
from tests import plain_http
from tests.integration.conftest import make_group
from tests.redis_keys import delete_stream_keys

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]

ROOT = Path(__file__).resolve().parents[2]
DOCS_SCREENSHOTS = (
    "admin-matrix.png", "admin-fenced.png", "admin-dashboard.png", "admin-group.png", "admin-reshard.png",
    "admin-matrix-large.png",
)
PASSWORD = "browser-test-password"
WAIT_S = 15


class HttpMember:
    """A well-behaved member over real HTTP (C1–C5)."""

    def __init__(self, base: str, key: str, member_id: str) -> None:
        self.url = f"{base}/api/v1/groups/g1/heartbeat"
        self.headers = {"Authorization": f"Bearer {key}"}
        self.member_id = member_id
        self.epoch, self.metadata_epoch = 0, 1
        self.owned: list[str] = []
        self.revoked: list[str] = []

    def beat(self) -> httpx.Response:
        body: dict[str, Any] = {"memberId": self.member_id, "memberEpoch": self.epoch,
                                "clientId": f"host-{self.member_id}/pid-1"}
        if self.epoch > 0:
            body.update(metadataEpoch=self.metadata_epoch, ownedShards=self.owned,
                        revokingShards=[{"shard": s, "state": "REVOKED"} for s in self.revoked])
        r = plain_http.post(self.url, json=body, headers=self.headers, timeout=10)
        if r.status_code == 200:
            out = r.json()
            a = out["assignment"]
            self.epoch, self.metadata_epoch = out["memberEpoch"], out["metadata"]["metadataEpoch"]
            self.revoked = a["revokingShards"]  # nothing in flight here: REVOKED on the next beat
            self.owned = [s for s in self.owned if s in a["assignedShards"]]
            if out["status"] == "OK":
                self.owned = sorted(set(self.owned) | set(a["assignedShards"]))
        return r


def screenshot_dir() -> Path:
    path = Path(os.environ.get("RSC_SCREENSHOT_DIR") or ROOT / "var" / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def shoot(driver: Any, name: str) -> Path:
    path = screenshot_dir() / name
    # The whole page, not just the viewport: widen/lengthen the window to the document.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1760, min(max(int(height) + 120, 700), 2400))
    driver.save_screenshot(str(path))
    if os.environ.get("RSC_UPDATE_DOCS_SCREENSHOTS") == "1" and name in DOCS_SCREENSHOTS:
        shutil.copyfile(path, ROOT / "docs" / name)
    return path


def test_operator_reads_the_matrix_and_fences_a_member(browser: Any, live_server: Any):
    fx = make_group(shards=6)
    user = User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    for app, codename in (("groups", "view_group"), ("groups", "view_event"), ("members", "view_member"),
                          ("members", "fence_member")):
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    members = [HttpMember(live_server.url, fx.key, m) for m in ("alpha", "bravo", "charlie")]
    for _ in range(4):  # join, rebalance, revoke, converge
        for m in members:
            assert m.beat().status_code == 200
    group = Group.objects.get(name="g1")
    assert {m.status for m in Member.objects.filter(group=group)} == {"STABLE"}

    wait = WebDriverWait(browser, WAIT_S)
    matrix_url = f"{live_server.url}/admin/groups/group/{group.pk}/matrix/"
    browser.get(f"{live_server.url}/admin/login/?next=/admin/groups/group/{group.pk}/matrix/")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(ec.presence_of_element_located((By.ID, "assignment-matrix")))
    assert browser.current_url == matrix_url
    for m in members:
        row = browser.find_element(By.ID, f"member-{m.member_id}")
        assert row.find_element(By.CLASS_NAME, "member-state").text == "STABLE"
        assert len(row.find_elements(By.CSS_SELECTOR, "td.cell-granted.target")) == 2
    assert browser.find_element(By.ID, "group-phase").text == "STABLE"
    shoot(browser, "admin-matrix.png")

    # To the members page of this group, through the matrix's link; fence bravo.
    browser.find_element(By.LINK_TEXT, "members page (fence / remove)").click()
    wait.until(ec.presence_of_element_located((By.ID, "result_list")))
    bravo = Member.objects.get(group=group, member_id="bravo")
    browser.find_element(By.CSS_SELECTOR, f"input[name=_selected_action][value='{bravo.pk}']").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("fence_members")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    wait.until(ec.presence_of_element_located((By.ID, "confirm-members")))
    assert "bravo" in browser.find_element(By.ID, "confirm-members").text
    assert Member.objects.get(pk=bravo.pk).status == "STABLE"  # nothing happens before confirming
    browser.find_element(By.ID, "id_reason").send_keys("stuck consumer (browser test)")
    shoot(browser, "admin-confirm.png")
    browser.find_element(By.ID, "confirm-submit").click()
    message = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "ul.messagelist li.success")))
    assert message.text == "Fenced 1 member: g1/bravo."
    row = browser.find_element(By.XPATH, "//tr[.//th[normalize-space()='bravo'] or .//td[normalize-space()='bravo']]")
    assert "FENCED" in row.text
    assert "fenced by operator: stuck consumer (browser test)" in row.text
    shoot(browser, "admin-fenced.png")

    # The core's view: bravo is out, its next heartbeat is FENCED; the others take over its shards.
    fenced = Member.objects.get(pk=bravo.pk)
    assert (fenced.status, fenced.fenced_by) == ("FENCED", "operator")
    assert Event.objects.filter(kind="fenced", member_id="bravo", actor="operator").exists()
    r = members[1].beat()
    assert r.status_code == 409
    assert r.json()["errorCode"] == "FENCED_MEMBER_EPOCH"
    for _ in range(3):
        for m in (members[0], members[2]):
            assert m.beat().status_code == 200
    browser.get(matrix_url)
    wait.until(ec.presence_of_element_located((By.ID, "assignment-matrix")))
    assert not browser.find_elements(By.ID, "member-bravo")
    assert browser.find_element(By.ID, "member-count").text == "2"
    for m in (members[0], members[2]):
        row = browser.find_element(By.ID, f"member-{m.member_id}")
        assert len(row.find_elements(By.CSS_SELECTOR, "td.cell-granted.target")) == 3
    assert "fenced" in browser.find_element(By.ID, "recent-events").text
    shoot(browser, "admin-matrix-after-fence.png")


def _backlog(stream: str, group: str) -> None:
    """Some lag on every shard, two entries pending on shard 0, one poison message in its DLQ."""
    import redis
    from django.conf import settings

    from dataplane.routing import ShardKeys
    from groups.models import Stream

    prefix = Stream.objects.get(name=stream).key_prefix  # the installation's namespace
    r = redis.Redis.from_url(settings.STREAM_REDIS_URL, decode_responses=True)
    for i in range(6):
        keys = ShardKeys(f"{stream}:1:{i}", prefix)
        for n in range(3 + 40 * i):
            r.xadd(keys.stream, {"key": f"k{n}", "n": str(n)})
        r.xgroup_destroy(keys.stream, group)  # made by the coordinator; as if nobody read yet
    k0 = ShardKeys(f"{stream}:1:0", prefix)
    r.xgroup_create(k0.stream, group, id="0")
    r.xreadgroup(group, "c", {k0.stream: ">"}, count=2)
    r.xadd(k0.dlq(group), {"dlq:error": "ValueError: price must be positive", "dlq:deliveries": "5",
                           "dlq:id": "1764700000000-0", "dlq:shard": k0.shard_id, "dlq:group": group,
                           "key": "order-17", "price": "-3"})
    r.close()


def test_operator_reads_backlog_on_dashboard_group_page_and_matrix_then_reshards(browser: Any, live_server: Any):
    from groups import shardstats

    shardstats.clear_cache()
    # Long intervals: the members beat only when the test says so, and must not turn late meanwhile.
    fx = make_group("payments", "g1", shards=6, heartbeat_interval_ms=30_000, session_timeout_ms=120_000)
    User.objects.create_superuser("root", password=PASSWORD)
    members = [HttpMember(live_server.url, fx.key, m) for m in ("alpha", "bravo", "charlie")]
    for _ in range(4):
        for m in members:
            assert m.beat().status_code == 200
    _backlog("payments", "g1")
    group = Group.objects.get(name="g1")
    wait = WebDriverWait(browser, WAIT_S)
    try:
        browser.get(f"{live_server.url}/admin/login/?next=/admin/")
        browser.find_element(By.NAME, "username").send_keys("root")
        browser.find_element(By.NAME, "password").send_keys(PASSWORD)
        browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        dash = wait.until(ec.presence_of_element_located((By.ID, "dashboard-groups")))
        row = dash.find_element(By.XPATH, ".//tr[td/a[normalize-space()='g1']]")
        lag = sum(3 + 40 * i for i in range(6)) - 2
        assert f"{lag:,}" in row.text
        assert "3" in row.text
        assert "Consumer groups" in browser.find_element(By.ID, "content-main").text
        shoot(browser, "admin-dashboard.png")

        row.find_element(By.LINK_TEXT, "g1").click()
        wait.until(ec.presence_of_element_located((By.ID, "member-summary")))
        assert browser.find_element(By.ID, "total-lag").text == f"{lag:,}"
        assert browser.find_element(By.ID, "total-pending").text == "2"
        assert "ValueError: price must be positive" in browser.find_element(By.ID, "dlq-entries").text
        assert "alive" in browser.find_element(By.ID, "summary-alpha").text
        shoot(browser, "admin-group.png")

        browser.find_element(By.CSS_SELECTOR, ".object-tools a[href$='/matrix/']").click()
        wait.until(ec.presence_of_element_located((By.ID, "shard-grid")))
        assert len(browser.find_elements(By.CSS_SELECTOR, "#shard-grid a.t")) == 6
        browser.find_element(By.CSS_SELECTOR, "#shard-filter input[name=lagging]").click()
        Select(browser.find_element(By.CSS_SELECTOR, "#shard-filter select[name=state]")).select_by_value("granted")
        browser.find_element(By.CSS_SELECTOR, "#shard-filter input[type=submit]").click()
        wait.until(ec.url_contains("lagging=1"))
        assert len(browser.find_elements(By.CSS_SELECTOR, "#shard-table tbody tr")) == 6
        shoot(browser, "admin-matrix-filtered.png")

        # The stream page's Reshard button, then the matrix explains what the reshard waits for.
        browser.find_element(By.CSS_SELECTOR, "#matrix-summary a").click()
        browser.find_element(By.ID, "reshard-button").click()
        browser.find_element(By.NAME, "shards").send_keys("12")
        browser.find_element(By.ID, "reshard-submit").click()
        message = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "ul.messagelist li.success")))
        assert "version 2 with 12 shards" in message.text
        from groups.sweeps import run_all_sweeps

        run_all_sweeps()  # seal v1
        for _ in range(2):
            for m in members:
                assert m.beat().status_code == 200
        browser.get(f"{live_server.url}/admin/groups/group/{group.pk}/matrix/")
        panel = wait.until(ec.presence_of_element_located((By.ID, "reshard-status")))
        assert "sealed shards still to drain" in panel.text
        assert "wait for their parents" in panel.text
        assert "version_sealed" in browser.find_element(By.ID, "recent-events").text
        shoot(browser, "admin-reshard.png")
    finally:
        delete_stream_keys("payments")
        shardstats.clear_cache()


def test_matrix_of_1000_members_and_4096_shards_is_readable(browser: Any, live_server: Any):
    import redis
    from django.conf import settings

    from bench.bigroup import build_settled_group, drop_backlog
    from groups import shardstats

    shardstats.clear_cache()
    r = redis.Redis.from_url(settings.STREAM_REDIS_URL)
    group = build_settled_group("large", "big", 1000, 4096, backlog=r)
    User.objects.create_superuser("root", password=PASSWORD)
    try:
        browser.get(f"{live_server.url}/admin/login/?next=/admin/groups/group/{group.pk}/matrix/")
        browser.find_element(By.NAME, "username").send_keys("root")
        browser.find_element(By.NAME, "password").send_keys(PASSWORD)
        browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        WebDriverWait(browser, 60).until(ec.presence_of_element_located((By.ID, "shard-grid")))
        assert not browser.find_elements(By.ID, "assignment-matrix")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#member-summary tbody tr")) == 100
        assert len(browser.find_elements(By.CSS_SELECTOR, "#shard-table tbody tr")) == 100
        # The page fits a screen's width: no 4,096-column table to scroll through.
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= 1800, width
        shoot(browser, "admin-matrix-large.png")
    finally:
        drop_backlog(r, "large")
        r.close()
        shardstats.clear_cache()
