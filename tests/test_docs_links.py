"""Every relative link in README.md and docs/*.md leads somewhere: the file exists, and an
anchor names a heading (or an ``<a id>``) of the page it points into, as GitHub renders it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.scenarios import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    found: set[str] = set(re.findall(r'<a id="([^"]+)"', text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def _links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    return [target for target in LINK.findall(text)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: ...


def test_slugs_follow_github() -> None:
    assert _slug("Horizontal federations (FedTree)") == "horizontal-federations-fedtree"
    assert _slug("SimFL (`simfl`)") == "simfl-simfl"
    assert _slug("A party's own policy") == "a-partys-own-policy"
    assert _slug("Vertical SecureBoost (`vertical_secureboost`)") == \
        "vertical-secureboost-vertical_secureboost"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        into = (page.parent / path).resolve() if path else page
        if not into.exists():
            broken.append(f"{target}: no file {into}")
        elif anchor and into.suffix == ".md" and anchor not in _anchors(into):
            broken.append(f"{target}: no heading #{anchor} in {into.name}")
    assert not broken, "\n".join(broken)
