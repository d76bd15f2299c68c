"""Every relative link in README.md and docs/*.md names a file or folder of the repository."""

from __future__ import annotations

import re

from conftest import ROOT

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)  # fenced code blocks
CODE = re.compile(r"`[^`\n]*`")  # inline code spans
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target "title")


def relative_links(text: str) -> list[str]:
    """The targets of the Markdown links in `text` that point into the repository (no URL, no bare anchor)."""
    prose = CODE.sub("", FENCE.sub("", text))
    targets = [m.group(1) for m in LINK.finditer(prose)]
    return [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", t, re.I)]


def test_relative_links_point_at_files_that_exist():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in relative_links(page.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0].split("?", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_links_are_found_outside_code_only():
    text = "[a](docs/x.md) [b](https://e.org) [c](#top) `[d](no.md)`\n```\n[e](no.md)\n```\n[f](../y.md#s)"
    assert relative_links(text) == ["docs/x.md", "../y.md#s"]
