"""docs/ARCHITECTURE.md's rule → function → tests table stays true (issue 23.10).

Every test the table names must exist: a `file.py::test_name` (or `::test_prefix_*`, or
`::name` after a file named earlier in the cell) must match a test function in that file,
and a file or directory must exist. Every dotted name of a coordinator or data-plane module
in the implementation column (`coordination.engine.r1_join`, `dataplane.membership.Membership._fence`)
must be defined there. Read from the source (AST), so no module is imported.
"""
from __future__ import annotations

import ast
import fnmatch
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE_HEADING = "## Rules → implementation → tests"
PACKAGES = ("coordination", "assignments", "groups", "members", "coordinator_project", "dataplane")


def table_rows() -> list[list[str]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows[1:]]


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


@cache
def defs_in(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    return frozenset(n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))


def find_file(name: str) -> Path | None:
    for base in (ROOT / "tests", ROOT):
        if (base / name).exists():
            return base / name
    return None


def missing_tests(cell: str) -> list[str]:
    missing, current = [], None
    for span in code_spans(cell):
        file_part, _, test = span.partition("::")
        if file_part:
            if not re.fullmatch(r"[\w./-]+(\.py|/)", file_part):
                continue  # not a path (e.g. `lint-imports`)
            current = find_file(file_part)
            if current is None:
                missing.append(f"{span}: no file {file_part}")
                continue
        if not test:
            continue
        if current is None or current.is_dir():
            missing.append(f"{span}: no file named before it")
            continue
        if not fnmatch.filter(defs_in(current), test):
            missing.append(f"{span}: nothing in {current.relative_to(ROOT)} matches {test}")
    return missing


def module_path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    return path if path.exists() else None


@cache
def module_names(module: str) -> tuple[frozenset[str], dict[str, str]] | None:
    """The names a module defines at top level (and `Class.method`), and the names it imports
    from this repository's modules (name → its dotted origin); None if there is no such module."""
    path = module_path(module)
    if path is None:
        return None
    names: set[str] = set()
    imported: dict[str, str] = {}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}.{item.name}")
                elif isinstance(item, ast.AnnAssign | ast.Assign):
                    targets = [item.target] if isinstance(item, ast.AnnAssign) else item.targets
                    names.update(f"{node.name}.{t.id}" for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                parts = package.split(".")
                source = ".".join([*parts[: len(parts) - node.level + 1], source]).strip(".")
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{source}.{alias.name}"
    return frozenset(names), imported


def defined(dotted: str, depth: int = 0) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest module prefix that exists
        found = module_names(".".join(parts[:cut]))
        if found is None:
            continue
        names, imported = found
        attr = parts[cut:]
        if ".".join(attr) in names or (len(attr) == 1 and module_path(dotted) is not None):
            return True
        origin = imported.get(attr[0])
        return origin is not None and depth < 5 and defined(".".join([origin, *attr[1:]]), depth + 1)
    return module_path(dotted) is not None


def missing_functions(cell: str) -> list[str]:
    missing = []
    for span in code_spans(cell):
        name = re.split(r"[ (]", span, maxsplit=1)[0]
        if not re.fullmatch(r"[A-Za-z_][\w.]*", name) or name.split(".")[0] not in PACKAGES or "." not in name:
            continue
        if not defined(name):
            missing.append(name)
    return missing


def test_the_rule_table_is_where_this_test_reads_it() -> None:
    rows = table_rows()
    assert len(rows) > 40
    assert all(len(r) == 3 for r in rows), rows[:3]


def test_every_test_the_rule_table_names_exists() -> None:
    problems = [f"{row[0][:40]}: {m}" for row in table_rows() for m in missing_tests(row[2])]
    assert problems == []


def test_every_function_the_rule_table_names_exists() -> None:
    problems = [f"{row[0][:40]}: {m}" for row in table_rows() for m in missing_functions(row[1])]
    assert problems == []


def test_the_checks_find_a_missing_test_and_a_missing_function() -> None:
    assert missing_tests("`unit/test_engine_rules.py::test_r1_*`, `::test_no_such_test_anywhere`") == [
        "::test_no_such_test_anywhere: nothing in tests/unit/test_engine_rules.py matches test_no_such_test_anywhere"]
    assert missing_tests("`unit/test_gone.py`") == ["unit/test_gone.py: no file unit/test_gone.py"]
    assert missing_functions("`coordination.engine.r1_join`, `coordination.engine.r99_nothing`") == [
        "coordination.engine.r99_nothing"]
