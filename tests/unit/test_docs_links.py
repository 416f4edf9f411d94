"""Every relative link in the docs resolves: README.md, ARCHITECTURE.md, docs/ and the benchmarks'
pointer page. A link to a repository path must name a file or directory that exists (inside the
repository), and a ``#anchor`` must match a heading of its target page, as GitHub makes anchors
from headings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Pages written on other branches, linked from here before they merge: a link to one is checked
# once the page exists, and passes while it does not.
PENDING = {
    ROOT / "docs" / "operating" / "reliability-multihost.md",
}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`[^`]*`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "tests" / "bench" / "README.md"]
    return found + sorted((ROOT / "docs").rglob("*.md"))


def unfenced(text: str) -> str:
    """The text with fenced code blocks blanked out (line numbers kept)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return "\n".join(lines)


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every markdown link on the page, a link cut over lines included."""
    text = CODE_SPAN.sub(lambda m: "\n" * m.group().count("\n"), unfenced(page.read_text()))
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in unfenced(page.read_text()).splitlines():
        if m := HEADING.match(line):
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(
    page: Path, root: Path = ROOT, pending: frozenset[Path] = frozenset()
) -> list[str]:
    """``page:line: target (why)`` for every relative link that does not resolve."""
    out = []
    for lineno, target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(root)}:{lineno}: {target}"
        if not dest.is_relative_to(root):
            out.append(f"{where} (outside the repository)")
        elif not dest.exists():
            if dest not in pending:
                out.append(f"{where} (no such path)")
        elif anchor:
            if dest.suffix != ".md":
                out.append(f"{where} (an anchor into a file that is not markdown)")
            elif anchor not in anchors(dest):
                out.append(f"{where} (no heading makes #{anchor})")
    return out


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page: Path) -> None:
    assert broken_links(page, pending=frozenset(PENDING)) == []


def test_every_page_of_docs_is_reachable_from_the_readme() -> None:
    """Following links from README.md reaches ARCHITECTURE.md and every page under docs/."""
    seen: set[Path] = set()
    todo = [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or not page.exists() or page.suffix != ".md":
            continue
        seen.add(page)
        for _, target in links(page):
            path_part = target.partition("#")[0]
            if path_part and not re.match(r"[a-z][a-z0-9+.-]*:", target):
                todo.append((page.parent / path_part).resolve())
    wanted = {ROOT / "ARCHITECTURE.md", *(ROOT / "docs").rglob("*.md")}
    unreached = sorted(str(p.relative_to(ROOT)) for p in wanted - seen)
    assert unreached == []


def test_the_check_sees_a_broken_path_and_a_broken_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## The `up` command\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Home\n\n[fine](docs/a.md#the-up-command) [self](#home) [web](https://example.com)\n"
        "`[in code](nowhere.md)`\n```\n[in a block](nowhere.md)\n```\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#the-down-command) [up](../x.md) [cut over\n"
        "two lines](docs/c.md)\n"
    )
    found = broken_links(page, root=tmp_path)
    assert [f.rsplit("(", 1)[1] for f in found] == [
        "no such path)",
        "no heading makes #the-down-command)",
        "outside the repository)",
        "no such path)",
    ]
    assert found[-1].startswith("README.md:8: docs/c.md")
