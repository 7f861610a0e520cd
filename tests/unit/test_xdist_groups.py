"""Tests that share what one machine has once, or a module fixture that is costly to build, run
on one xdist worker (tests/conftest.py, XDIST_GROUPS)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import XDIST_GROUPS, xdist_group_of

TESTS = Path(__file__).resolve().parents[1]


def test_every_grouped_fixture_is_still_defined_under_that_name():
    """A renamed fixture would leave its tests spread over the workers, silently."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in TESTS.rglob("*.py"))
    missing = [name for name in XDIST_GROUPS
               if not re.search(rf"^def {re.escape(name)}\(|^    def {re.escape(name)}\(", source, re.M)
               and not (TESTS / name).is_dir()]
    assert missing == []


def test_every_collected_test_of_a_grouped_fixture_carries_its_group(request: pytest.FixtureRequest):
    wrong = []
    for item in request.session.items:
        group = xdist_group_of(item)
        marks = [m.kwargs.get("name", m.args[0] if m.args else None) for m in item.iter_markers("xdist_group")]
        if group is not None and group not in marks:
            wrong.append((item.nodeid, group, marks))
    assert wrong == []
