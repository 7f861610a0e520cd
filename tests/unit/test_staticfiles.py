"""collectstatic compresses a static file again only when it changed (make run collects at
every start; coordinator_project/staticfiles.py)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.core.management import call_command

ADMIN_CSS = Path("admin") / "css" / "base.css"


def test_collectstatic_compresses_a_file_again_only_when_its_copy_changed(settings: Any, tmp_path: Path):
    settings.STATIC_ROOT = str(tmp_path)
    call_command("collectstatic", interactive=False, verbosity=0)
    source, compressed = tmp_path / ADMIN_CSS, tmp_path / f"{ADMIN_CSS}.gz"
    assert compressed.stat().st_mtime == source.stat().st_mtime  # WhiteNoise's own convention
    # A stand-in for the compressed copy, with the source's time: a second run keeps it.
    compressed.write_bytes(b"kept")
    os.utime(compressed, (source.stat().st_atime, source.stat().st_mtime))
    call_command("collectstatic", interactive=False, verbosity=0)
    assert compressed.read_bytes() == b"kept"
    # The collected copy changed (a newer time than its compressed copy): compressed again.
    os.utime(source, (source.stat().st_atime, source.stat().st_mtime + 10))
    call_command("collectstatic", interactive=False, verbosity=0)
    assert compressed.read_bytes() != b"kept"
    assert compressed.stat().st_mtime == source.stat().st_mtime
