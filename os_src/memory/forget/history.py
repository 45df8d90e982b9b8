"""The curated memory files, their versions and the batches' records of what they wrote: their lines,
as a forget judges them, and the forgotten lines taken out of each. The deploy's files (soul.md, os.md:
templates bootstrap installs) say nothing a person said: never."""

from __future__ import annotations

import contextlib
import json

from ...database import transaction
from ...errors import FileChanged
from ..files import CURATED, MemoryFiles, sha
from ..memory_store import MemoryDB
from .lines import meaningful_lines, without


def file_candidates(files: MemoryFiles) -> tuple[dict[str, str], set[str]]:
    """Every meaningful line of the curated files and their versions, once each (its hash, its text),
    and the hashes of the files' lines as they are now: each file read once."""
    current = current_texts(files)
    out = dict(current)
    for name in CURATED:
        for version in files.history(name):
            with contextlib.suppress(OSError):
                out.update(meaningful_lines(version.text))
    return out, set(current)


def strip_files(files: MemoryFiles, hashes: set[str], note: str) -> list[str]:
    """The curated files without those lines (each a new version, `forget`), then every version of
    them rewritten in place with a note where the lines were; again while a current file has one of the
    lines back (a person's rollback, meanwhile, to a version not yet rewritten). Returns the files changed."""
    changed = [name for name in CURATED if _strip_current(files, name, hashes)]
    while True:
        for name in CURATED:
            files.redact_history(name, lambda old: without(old, hashes, note))
        if not (again := [name for name in CURATED if _strip_current(files, name, hashes)]):
            return changed
        changed += [name for name in again if name not in changed]


def _strip_current(files: MemoryFiles, name: str, hashes: set[str]) -> bool:
    """The current file without those lines, as a new version (`forget`). True if it had any."""
    while True:
        text = files.read(name)
        kept = without(text, hashes)
        if kept == text:
            return False
        try:  # written only over the text it was made from: a person's Save meanwhile is read again
            files.write(name, kept, "forget", expect=sha(text))
        except FileChanged:
            continue
        return True


def current_texts(files: MemoryFiles) -> dict[str, str]:
    """The curated files' meaningful lines as they are now: hash, text."""
    out: dict[str, str] = {}
    for name in CURATED:
        out.update(meaningful_lines(files.read(name)))
    return out


def batch_candidates(db: MemoryDB) -> dict[str, str]:
    out: dict[str, str] = {}
    for (updates,) in db.conn.execute("SELECT file_updates FROM batches WHERE file_updates != '{}'"):
        with contextlib.suppress(ValueError, TypeError):
            for text in json.loads(updates).values():
                out.update(meaningful_lines(text))
    return out


def strip_batches(db: MemoryDB, hashes: set[str]) -> int:
    """Each batch's record of the files it wrote, without those lines (a batch not yet applied will
    write its record as the file: no note in it)."""
    changed = 0
    with transaction(db.conn) as c:
        for bid, updates in c.execute("SELECT id, file_updates FROM batches WHERE file_updates != '{}'").fetchall():
            files = json.loads(updates)
            kept = {name: without(text, hashes) for name, text in files.items()}
            if kept != files:
                c.execute("UPDATE batches SET file_updates = ? WHERE id = ?", (json.dumps(kept), bid))
                changed += 1
    return changed
