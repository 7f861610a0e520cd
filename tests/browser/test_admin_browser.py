"""A real browser against the admin: log in, read the assignment matrix, fence a member.

Headless Chromium (selenium) talks to pytest-django's live server on the test database;
the members heartbeat over HTTP against the same server. Screenshots land in
var/screenshots/ (or $RSC_SCREENSHOT_DIR); with RSC_UPDATE_DOCS_SCREENSHOTS=1 the two used by
the docs are also copied to docs/admin-matrix.png and docs/admin-fenced.png.
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
from tests.integration.conftest import make_group

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]

ROOT = Path(__file__).resolve().parents[2]
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
        r = httpx.post(self.url, json=body, headers=self.headers, timeout=10)
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
    if os.environ.get("RSC_UPDATE_DOCS_SCREENSHOTS") == "1" and name in ("admin-matrix.png", "admin-fenced.png"):
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
    assert "FENCED" in row.text and "fenced by operator: stuck consumer (browser test)" in row.text
    shoot(browser, "admin-fenced.png")

    # The core's view: bravo is out, its next heartbeat is FENCED; the others take over its shards.
    fenced = Member.objects.get(pk=bravo.pk)
    assert (fenced.status, fenced.fenced_by) == ("FENCED", "operator")
    assert Event.objects.filter(kind="fenced", member_id="bravo", actor="operator").exists()
    r = members[1].beat()
    assert r.status_code == 409 and r.json()["errorCode"] == "FENCED_MEMBER_EPOCH"
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
