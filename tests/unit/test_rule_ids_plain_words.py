"""Issue 24.6: the admin and the command lines speak plain words; a rule id (R9, C1, L2, §11) is
only a suffix to them, e.g. "one owner per shard (R9)" or "(rule L1)", never the text itself
("L1 session expiry", "§11: members read nothing").

Two checks: every string an operator can see in the sources of the admin, the API's schema
help, the manage.py commands, the member library and its CLI, and the admin's templates; and the
help each manage.py command and each `rsc-dataplane` command prints, as argparse renders it.

A rule id is accepted when it is in parentheses that hold nothing after it but other ids, and at
least two plain words come before the parentheses.
"""
from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULE_ID = re.compile(r"(?<![\w-])(?:R[0-9]+[bs]?|C[1-6]|L[1-3]s?|§[0-9]+)(?![\w])")
# What may follow an id inside its parentheses: more ids ("C1–C6", "R7, R8", "§9 and §10").
_ONLY_IDS_TO_CLOSE = re.compile(
    r"(?:\s*(?:[,;/–-]|\band\b|\bor\b)?\s*(?:R[0-9]+[bs]?|C[1-6]|L[1-3]s?|§[0-9]+)(?![\w]))*\s*\)"
)
_WORD = re.compile(r"[A-Za-z][a-z]{2,}")

OPERATOR_SOURCES = [
    "groups/admin.py", "groups/admin_base.py", "groups/admin_keys.py", "members/admin.py",
    "assignments/admin.py", "groups/models.py", "members/models.py", "assignments/models.py",
    "groups/views.py", "groups/stream_views.py", "assignments/views.py", "assignments/serializers.py",
    "groups/describe.py", "groups/dashboard.py", "assignments/matrix.py", "groups/api_errors.py",
    "groups/errors.py", "coordination/engine.py", "coordinator_project/preflight.py",
    "groups/management/commands/*.py", "members/management/commands/*.py", "dataplane/*.py",
    "dataplane/cli/*.py", "dataplane/runtime/*.py",
]


def bare_rule_ids(text: str) -> list[str]:
    """Each rule id in `text` that is not a suffix to plain words, with its surroundings."""
    found = []
    for m in RULE_ID.finditer(text):
        opening = text.rfind("(", 0, m.start())
        inside = opening >= 0 and ")" not in text[opening:m.start()]
        suffix = inside and _ONLY_IDS_TO_CLOSE.match(text, m.end()) is not None
        # Plain words before the parentheses (other parenthesised ids do not count as words).
        before = RULE_ID.sub(" ", text[max(0, opening - 80):opening]) if inside else ""
        if not (suffix and len(_WORD.findall(before)) >= 2):
            found.append(" ".join(text[max(0, m.start() - 50):m.end() + 30].split()))
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(n.body[0].value) for n in ast.walk(tree)
        if isinstance(n, owners) and n.body and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }


def _is_sql(text: str) -> bool:
    return bool(re.search(r"\b(SELECT|UPDATE|INSERT|WITH)\b.*\b(FROM|SET|INTO|AS)\b", text, re.S))


def test_i24_6_rule_ids_in_operator_strings_are_suffixes_to_plain_words():
    files = sorted({p for pattern in OPERATOR_SOURCES for p in ROOT.glob(pattern)})
    assert len(files) > 50  # the patterns still find the sources
    bare = []
    for path in files:
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                    and not _is_sql(node.value)):
                bare += [f"{path.relative_to(ROOT)}:{node.lineno}: {s}" for s in bare_rule_ids(node.value)]
    templates = sorted((ROOT / "templates").rglob("*.html"))
    assert templates
    for path in templates:
        bare += [f"{path.relative_to(ROOT)}: {s}" for s in bare_rule_ids(path.read_text())]
    assert not bare, "rule ids without plain words before them:\n" + "\n".join(bare)


def _rendered_help(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    helps = [(parser.prog, parser.format_help())]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                helps += _rendered_help(sub)
    return helps


def test_i24_6_rendered_help_of_every_command_gives_rule_ids_as_suffixes():
    from django.core.management import get_commands, load_command_class

    from dataplane.cli import build_parser

    helps = _rendered_help(build_parser())
    ours = {name: app for name, app in get_commands().items() if app in ("groups", "members", "assignments")}
    assert {"sweep", "fence_member", "alter_group", "pause_group"} <= set(ours)
    for name, app in sorted(ours.items()):
        helps.append((name, load_command_class(app, name).create_parser("manage.py", name).format_help()))
    bare = [f"{prog}: {s}" for prog, text in helps for s in bare_rule_ids(" ".join(text.split()))]
    assert not bare, "rule ids without plain words before them:\n" + "\n".join(bare)


@pytest.mark.parametrize(("text", "ok"), [
    ("one owner per shard (R9)", True),
    ("a silent member is expired (rule L1)", True),
    ("read nothing (stream admin key; §11)", True),
    ("the member's rules (C1–C6)", True),
    ("Undo with resume_group. (PROTOCOL §11)", True),
    ("L1 session expiry, L2 rebalance timeout", False),
    ("periodic work (L1 session expiry, L2 rebalance timeout)", False),
    ("§11: members hold their shards", False),
    ("(R9)", False),
    ("took its place (PROTOCOL §9 R1s)", True),
    ("R9 violated", False),
])
def test_i24_6_the_check_tells_a_suffix_from_a_bare_id(text: str, ok: bool):
    assert (bare_rule_ids(text) == []) is ok


def test_i24_6_metric_help_texts_give_rule_ids_as_suffixes():
    """The HELP line of every coordinator metric (what an operator reads on /metrics and in
    Grafana) follows the same rule: plain words first, the rule id in parentheses."""
    import importlib

    from prometheus_client.metrics import MetricWrapperBase

    helps = {}
    for name in ("coordinator_project.metrics", "assignments.fastpath", "members.selectors",
                 "groups.describe", "groups.dashboard", "webserver.worker"):
        module = importlib.import_module(name)
        for metric in vars(module).values():
            if isinstance(metric, MetricWrapperBase):
                helps.update({family.name: family.documentation for family in metric.describe()})
    assert "rsc_stamp_lag_seconds" in helps  # the modules registered their metrics
    bare = [f"{name}: {s}" for name, text in sorted(helps.items()) for s in bare_rule_ids(text)]
    assert not bare, "metric help with bare rule ids:\n" + "\n".join(bare)
