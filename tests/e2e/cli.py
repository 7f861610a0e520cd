"""Running ``python -m dataplane`` as a subprocess from a directory outside the repository,
with a clean environment (no RSC_* or REDIS_URL inherited from the test run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import spawn

from .conftest import ROOT


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSC_") and k != "REDIS_URL"}
    # This checkout's package (the shared test virtualenv need not have it installed).
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run_cli(
    args: list[str], cwd: Path, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return spawn.run(
        [sys.executable, "-m", "dataplane", *args],
        cwd=cwd,
        env=cli_env(**env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a clear failure (no traceback, nothing else)."""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    return lines[0]
