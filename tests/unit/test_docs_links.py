"""Issue 24.6: the docs link the protocol inside the repository, and every relative link in
README.md, docs/*.md and dataplane/README.md reaches a file of the repository (a clone has
nothing beside it)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "dataplane" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_i24_6_every_relative_link_in_the_docs_reaches_a_file_of_the_repository():
    broken = []
    for doc in DOCS:
        for target in _LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_i24_6_readmes_link_the_protocol_in_the_repository():
    assert "(docs/PROTOCOL.md)" in (ROOT / "README.md").read_text()
    assert "(../docs/PROTOCOL.md)" in (ROOT / "dataplane" / "README.md").read_text()
    protocol = (ROOT / "docs" / "PROTOCOL.md").read_text()
    for rule in ("R1b", "R1s", "R2s", "L1s", "C1", "C6", "L2", "R9", "## 11. Group pause"):
        assert rule in protocol, rule
