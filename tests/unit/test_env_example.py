"""Issue 24.2: `.env.example` lists every setting the coordinator reads from the environment
(settings.py, gunicorn_conf.py, the Celery app), so an operator sees every knob in one place.
Read from the source, so a setting added without an entry fails here."""
from __future__ import annotations

import re
from pathlib import Path

from coordinator_project.preflight import read_env_file

ROOT = Path(__file__).resolve().parents[2]
READERS = ("coordinator_project/settings.py", "coordinator_project/gunicorn_conf.py",
           "coordinator_project/celery.py")
# Read by the process, not settings an operator sets for the coordinator.
NOT_SETTINGS = {"DJANGO_SETTINGS_MODULE", "RSC_READ_ONLY_COMMAND"}
_READ = re.compile(r'(?:environ\.get|environ\.setdefault|env_int|env_bool|environ\[)\(?\s*"([A-Z][A-Z0-9_]+)"')


def read_names() -> set[str]:
    names: set[str] = set()
    for path in READERS:
        names |= set(_READ.findall((ROOT / path).read_text()))
    return names - NOT_SETTINGS


def listed_names() -> set[str]:
    names = set()
    for line in (ROOT / ".env.example").read_text().splitlines():
        found = re.match(r"#?\s*([A-Z][A-Z0-9_]+)=", line)
        if found:
            names.add(found.group(1))
    return names


def test_i24_2_env_example_lists_every_setting_the_coordinator_reads():
    names = read_names()
    assert len(names) > 40  # the pattern still finds them
    missing = sorted(names - listed_names())
    assert not missing, f".env.example lacks {missing}"


def test_i24_2_env_example_is_a_valid_env_file():
    values = read_env_file(str(ROOT / ".env.example"))
    assert set(values) == {"SECRET_KEY", "DATABASE_URL", "REDIS_URL"}  # the rest are commented defaults
