"""Issue 24.7: every shell and Python block of README.md, docs/*.md and dataplane/README.md is
either run by a test against a real stack (`<!-- docs-test: run: <test file> -->` before it; that
test reads the block from the doc itself) or skipped with a marker that says why
(`<!-- docs-test: skip: <reason> -->`). A new block without either fails here."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "dataplane" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^( *)```(sh|bash|shell|console|python|py)\s*$", re.M)
_MARK = re.compile(r"^ *<!-- docs-test: (run|skip): (.+?) -->\s*$")


def blocks() -> list[tuple[str, int, str | None]]:
    """(doc, line, the marker line before the block or None) for every shell/Python block."""
    found = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        text = doc.read_text()
        for m in _FENCE.finditer(text):
            number = text[:m.start()].count("\n")  # 0-based line of the fence
            before = lines[number - 1] if number > 0 else ""
            found.append((str(doc.relative_to(ROOT)), number + 1, before if _MARK.match(before) else None))
    return found


def test_i24_7_every_shell_and_python_block_is_run_or_says_why_not():
    found = blocks()
    assert len(found) > 10  # the pattern still finds them
    unmarked = [f"{doc}:{line}" for doc, line, mark in found if mark is None]
    assert not unmarked, f"run these blocks in a test (docs-test: run) or say why not (docs-test: skip): {unmarked}"


def test_i24_7_run_markers_name_a_test_that_reads_that_doc():
    for doc, line, mark in blocks():
        assert mark is not None
        kind, what = _MARK.match(mark).groups()  # type: ignore[union-attr]
        if kind == "skip":
            assert len(what) > 15, f"{doc}:{line}: say why it is not run"
            continue
        test = ROOT / what.split()[0]  # the test file, then what it puts in (placeholders, hosts)
        assert test.exists(), f"{doc}:{line}: no test {what}"
        assert Path(doc).name in test.read_text(), f"{doc}:{line}: {what} does not read {doc}"


def test_i24_7_every_code_block_is_fenced_and_names_its_language():
    """A shell command in an indented block or a fence without a language would escape the two
    checks above: every code block is fenced and says what it holds (`text` for a diagram or
    an output)."""
    from markdown_it import MarkdownIt  # CommonMark's own reading of what a code block is

    parser = MarkdownIt("commonmark")
    hidden = []
    for doc in DOCS:
        for token in parser.parse(doc.read_text()):
            if token.type == "code_block" or (token.type == "fence" and not token.info.strip()):
                line = token.map[0] + 1 if token.map else 0
                hidden.append(f"{doc.relative_to(ROOT)}:{line}: {token.content.splitlines()[0][:60]!r}")
    assert not hidden, f"fence these blocks with their language (sh, python, text, ...): {hidden}"
