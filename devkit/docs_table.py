"""Figures measured by a run, written into a doc between two markers (`make bench`, `make chaos`)."""

from __future__ import annotations

from pathlib import Path


def rewrite_between(doc: Path, name: str, body: str) -> None:
    """Replace what lies between `<!-- NAME:results:start -->` and `<!-- NAME:results:end -->`."""
    start, end = f"<!-- {name}:results:start -->", f"<!-- {name}:results:end -->"
    head, rest = doc.read_text().split(start, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{start}\n{body}\n{end}{tail}")
