"""Issue 24.2: `.env.example` lists every setting the coordinator reads from the environment
(settings.py, gunicorn_conf.py, the Celery app, the gunicorn worker class), so an operator sees every knob in one place.
Read from the source, so a setting added without an entry fails here."""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

from coordinator_project.preflight import read_env_file
from tests import spawn

ROOT = Path(__file__).resolve().parents[2]
READERS = ("coordinator_project/settings.py", "coordinator_project/gunicorn_conf.py",
           "coordinator_project/celery.py", "webserver/worker.py")
# Read by the process, not settings an operator sets for the coordinator.
NOT_SETTINGS = {"DJANGO_SETTINGS_MODULE", "RSC_READ_ONLY_COMMAND"}
_READ = re.compile(r'(?:environ\.get|environ\.setdefault|env_int|env_bool|env_float|environ\[)\(?\s*"([A-Z][A-Z0-9_]+)"')


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


def commented_defaults() -> dict[str, str]:
    """The `# NAME=value` lines of settings the coordinator reads, as an operator who
    uncomments them gets them (a note on a setting is on the line above it; see
    test_i24_2_a_commented_setting_uncommented_reads_as_its_value)."""
    names = read_names()
    found = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        m = re.match(r"#\s*([A-Z][A-Z0-9_]+)=(\S*)", line)
        if m and m.group(1) in names:
            found[m.group(1)] = m.group(2)
    return found


def _environment(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in read_names() and k != "RSC_ENV_FILE"}
    # The metrics directory last: its empty default would make the settings' import write its
    # files into the current directory (gunicorn makes a temporary one; this has no gunicorn).
    return {**base, "SECRET_KEY": "k" * 50, "DATABASE_URL": "postgres://u@127.0.0.1:5432/x", **extra,
            "PROMETHEUS_MULTIPROC_DIR": tempfile.gettempdir()}


_DUMP_SETTINGS = ("import json, re, django; from django.conf import settings; django.setup();"
                  " print(json.dumps({k: re.sub(' at 0x[0-9a-f]+', '', repr(getattr(settings, k)))"
                  " for k in dir(settings) if k.isupper()}))")  # without the addresses of lazy objects


def _settings(env: dict[str, str]) -> dict[str, str]:
    done = spawn.run([sys.executable, "-c", _DUMP_SETTINGS], cwd=ROOT, capture_output=True, text=True,
                          env={**env, "DJANGO_SETTINGS_MODULE": "coordinator_project.settings"}, timeout=60)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _gunicorn_config(env: dict[str, str]) -> str:
    done = spawn.run([sys.executable, "-m", "gunicorn", "-c", "coordinator_project/gunicorn_conf.py",
                           "--print-config", "coordinator_project.wsgi"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_i24_2_env_example_shows_the_real_defaults() -> None:
    """An operator who uncomments a line to change it starts from the default the code has:
    the settings (Django's and gunicorn's) with every commented default set equal those
    without any of them."""
    defaults = commented_defaults()
    assert {"WORKER_CLASS", "WORKER_CONNECTIONS", "MAX_SHARDS_PER_STREAM"} <= set(defaults)
    plain, uncommented = _environment(), _environment(**defaults)
    before, after = _settings(plain), _settings(uncommented)
    differ = {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not differ, f"Django settings differ with .env.example's defaults set: {differ}"
    before_g, after_g = _gunicorn_config(plain).splitlines(), _gunicorn_config(uncommented).splitlines()
    differ_g = sorted(set(before_g) ^ set(after_g))
    assert not differ_g, f"gunicorn's config differs with .env.example's defaults set: {differ_g}"


def test_i24_2_a_commented_setting_uncommented_reads_as_its_value() -> None:
    """Uncommenting `# NAME=value` must set NAME to that value: the env file format (ours and
    systemd's) takes everything after `=` and expands nothing, so a note after the value or a
    `${REDIS_URL}` would become part of the setting."""
    names = read_names()
    wrong = []
    for line in (ROOT / ".env.example").read_text().splitlines():
        m = re.match(r"#\s*([A-Z][A-Z0-9_]+)=(.*)$", line)
        if m and m.group(1) in names:
            value = m.group(2).strip()
            if " " in value or "${" in value or "$(" in value:
                wrong.append(line)
    assert not wrong, wrong

