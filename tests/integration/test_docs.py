"""The documentation as a reference: docs/README.md indexes every page and dated report, every relative link in
docs/ and README.md resolves, and no page narrates how the work was done (numbered work sessions, clock
times)."""

import re

import pytest
from helpers.paths import REPO_ROOT

REPO = REPO_ROOT
DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md")) + sorted((DOCS / "reports").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
NARRATION = {
    "a numbered work session": re.compile(r"\bsessions? \d+\b", re.IGNORECASE),
    "a clock time": re.compile(r"\b\d{2}:\d{2}(?::\d{2})?\s*UTC\b"),
}


def test_the_index_lists_every_page_and_report():
    index = (DOCS / "README.md").read_text()
    linked = {(DOCS / m).resolve() for m in LINK.findall(index)}
    missing = [str(p.relative_to(DOCS)) for p in PAGES if p.name != "README.md" and p.resolve() not in linked]
    assert not missing, f"docs/README.md does not link {missing}"


@pytest.mark.parametrize("page", [*PAGES, REPO / "README.md"], ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        if not (page.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: broken links {broken}"


@pytest.mark.parametrize("page", [*PAGES, REPO / "README.md"], ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_narrates_the_work(page):
    lines = page.read_text().splitlines()
    found = [
        f"line {i}: {what}: {line.strip()[:80]}"
        for i, line in enumerate(lines, 1)
        for what, pattern in NARRATION.items()
        if pattern.search(line)
    ]
    assert not found, "\n".join(found)
