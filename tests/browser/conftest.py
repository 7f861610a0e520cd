"""Headless Chromium for the admin browser test (Debian's chromium + chromium-driver).

If the browser is missing, the setup installs it the way the CI script does (apt-get, as
root); if that is impossible the tests skip and say why.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Flags that work in this (root, no GPU, no network access needed) environment.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1440,1000",
)


def _have_browser() -> bool:
    return os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)


def _install_browser() -> str | None:
    """Install chromium + chromium-driver with apt-get; returns why not, or None on success."""
    if _have_browser():
        return None
    if shutil.which("apt-get") is None:
        return "chromium is not installed and apt-get is not available"
    if os.geteuid() != 0:
        return "chromium is not installed and installing it needs root (apt-get install chromium chromium-driver)"
    # Each xdist worker's session asks: one installs while the others wait, then find it.
    with open(Path(tempfile.gettempdir()) / "rsc-chromium-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return None if _have_browser() else _apt_install()


def _apt_install() -> str | None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"]):
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"could not install chromium ({' '.join(cmd)}: {exc})"
        if done.returncode != 0:
            return f"could not install chromium ({' '.join(cmd)} exited {done.returncode}: {done.stderr[-300:]})"
    return None if _have_browser() else "chromium-driver installed but /usr/bin/chromium(driver) still missing"


@pytest.fixture(scope="session")
def chromium_available() -> None:
    reason = _install_browser()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def browser(chromium_available: None, tmp_path: Path) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")  # fresh profile per test
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
