"""Docs that can't drift: what the README and docs/ name exists, and nothing cites a ticket.

A reader can open a file a page names, and follow its links; a module that moves or goes makes
this fail until the page says where it went. Code, comments and docs say the reason for a thing,
never "issue 12" or "seed 002": a reader can't open those.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "tests" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TICKETS = re.compile(r"\b[Ii]ssues? #?\d+\b|\b[Ss]eeds? #?\d+\b|\(issue \d|\b[Tt]he (?:issue|seed)'s\b|seeds/000")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A source file's path in backticks: `os_src/memory/loader.py`, `memory/loader.py`, `tests/test_x.py::name`
# (not a workspace's files: `.os/...`, a release's `src/...`).
PATH = re.compile(r"`((?!src/|current/|releases/)(?:[\w-]+/)+[\w.-]+\.(?:py|js|html|css))(?:::\w+)?`")
ROOTS = (REPO, REPO / "os_src", REPO / "os_src" / "memory", REPO / "devkit")  # where a page's path may start


def tracked() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / n for n in names.splitlines() if (REPO / n).is_file()]


def test_nothing_cites_an_issue_or_a_seed_by_number() -> None:
    found = []
    for path in tracked():
        if path.suffix in (".png", ".bin", ".lock", ".gz") or path == Path(__file__):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(REPO)}:{n}: {line.strip()[:80]}"
                  for n, line in enumerate(text.splitlines(), 1) if TICKETS.search(line)]
    assert found == [], "say the reason instead"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_and_file_a_page_names_exists(page: Path) -> None:
    text = page.read_text()
    missing = [f"link {target}" for target in LINK.findall(text)
               if not target.startswith(("http://", "https://", "mailto:")) and not (page.parent / target).exists()]
    missing += [f"file {name}" for name in PATH.findall(text)
                if not any((root / name).exists() for root in ROOTS) and "<" not in name and "*" not in name]
    assert missing == []


def test_the_architecture_tree_names_every_module() -> None:
    """docs/architecture.md's tree is where a newcomer looks for a module: each one is there."""
    page = (REPO / "docs" / "architecture.md").read_text()
    tree = page.split("## The tree", 1)[1].split("```", 2)[1]
    named = set(re.findall(r"[\w]+\.py\b", tree))
    modules = {p.name for p in (REPO / "os_src").rglob("*.py") if not p.name.startswith("__")}
    assert sorted(modules - named) == []
