"""The README's and docs' links, and the code's references to docs/design.md, resolve.

Relative Markdown links (``[text](path)``, an ``#anchor`` aside) must name a file
of the repository; every ``docs/design.md §N`` a source comment cites must be a
section of that document; and the README links every page of docs/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_SECTION = re.compile(r"docs/design\.md §§?([\d., ]+)")


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_relative_links_resolve(doc: Path) -> None:
    targets = [t.split("#", 1)[0] for t in _LINK.findall(doc.read_text("utf-8"))]
    local = [t for t in targets if t and "://" not in t]
    missing = [t for t in local if not (doc.parent / t).exists()]
    assert not missing, f"{doc.name} links to {missing}"


def test_the_readme_links_every_page_of_docs() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert [p for p in pages if f"](docs/{p})" not in readme] == []


def test_design_sections_cited_in_the_code_exist() -> None:
    design = (ROOT / "docs" / "design.md").read_text("utf-8")
    sections = set(re.findall(r"^## (\d+)\.", design, re.MULTILINE))
    cited: set[str] = set()
    for path in [*ROOT.glob("ckpt_core/**/*.py"), *ROOT.glob("service/**/*.py")]:
        for match in _SECTION.findall(path.read_text("utf-8")):
            cited |= {part.split(".")[0] for part in re.split(r"[, ]+", match) if part.strip(".")}
    assert cited, "the code cites docs/design.md sections"
    assert cited <= sections, f"cited {sorted(cited - sections)}, which docs/design.md lacks"
