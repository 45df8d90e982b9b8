"""The invariants counted at the end of each scenario, with the server stopped cleanly: nothing
lost or duplicated, no completed turn recorded as cut short, each turn curated exactly once, both databases intact, every curated file
plain text within its limits, no temp-file debris and no CLI left running."""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chaos.turns import MARKER, Reconciled, TurnLog, reconcile
from devkit.processes import workspace_clis
from sprite_os.memory.capture.journal import STOPPED_NOTE, journal_path, read_state
from sprite_os.memory.files import SPECS, limit_error
from sprite_os.memory.memory_store import Batch, MemoryDB
from sprite_os.memory.schema import PENDING, PROCESSED
from sprite_os.memory.transcript_store import TranscriptDB
from sprite_os.paths import Layout

APPLIED = ("committed", "applied", "done")  # a batch whose learnings were stored
DEBRIS_SUFFIXES = (".tmp", ".temp", "~")


@dataclass(frozen=True)
class Invariants:
    turns: Reconciled
    observations: int
    pending: int
    stale: int
    curated_once: int  # observations with exactly one learning naming their marker
    learning_duplicates: list[str]  # markers with more than one learning
    batch_duplicates: list[int]  # observation ids in more than one applied batch
    integrity: dict[str, str]
    bad_files: list[str]
    debris: list[str]
    orphans: list[int]

    def failures(self) -> list[str]:
        t = self.turns
        out = []
        if t.lost:
            out.append(f"{len(t.lost)} acknowledged turns lost: {t.lost[:5]}")
        if t.cut_short:
            out.append(f"{len(t.cut_short)} completed turns recorded as cut short: {t.cut_short[:5]}")
        if t.duplicated:
            out.append(f"{len(t.duplicated)} turns recorded twice: {t.duplicated[:5]}")
        if t.unknown:
            out.append(f"{t.unknown} observations with no marker sent")
        if self.pending or self.stale:
            out.append(f"not curated: {self.pending} pending, {self.stale} stale")
        if self.curated_once != self.observations:
            out.append(f"curated once: {self.curated_once} of {self.observations}")
        if self.learning_duplicates:
            out.append(f"duplicate learnings (a batch ran twice): {self.learning_duplicates[:5]}")
        if self.batch_duplicates:
            out.append(f"observations in two applied batches: {self.batch_duplicates[:5]}")
        if bad := {db: r for db, r in self.integrity.items() if r != "ok"}:
            out.append(f"integrity_check: {bad}")
        if self.bad_files:
            out.append(f"bad memory files: {self.bad_files}")
        if self.debris:
            out.append(f"temp-file debris: {self.debris[:5]}")
        if self.orphans:
            out.append(f"orphaned CLIs: {self.orphans}")
        return out

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["failures"] = self.failures()
        return out


def integrity(db: Path) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return "; ".join(str(r[0]) for r in conn.execute("PRAGMA integrity_check").fetchall())
    except sqlite3.Error as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


def bad_files(layout: Layout) -> list[str]:
    out = []
    for name in SPECS:
        path = layout.memory_dir / name
        if not path.exists():
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            out.append(f"{name}: not UTF-8 ({exc})")
            continue
        if (error := limit_error(name, text)) is not None:
            out.append(error)
        if any(ord(ch) < 32 and ch not in "\t\n" for ch in text):
            out.append(f"{name}: a control character")
    return out


def debris(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name.endswith(DEBRIS_SUFFIXES))


def curated_twice(batches: list[Batch]) -> list[int]:
    """The turns more than one applied batch curated. A batch that left a turn pending (only learnings its reply
    dropped cited it: past the bound, or cut off at the reply's end) carried it without curating it: the next batch curates it, once."""
    carried = Counter(i for b in batches if b.status in APPLIED for i in b.observation_ids)
    left = Counter(i for b in batches if b.status in APPLIED for i in b.left_pending)
    return sorted(i for i, n in carried.items() if n - left[i] > 1)


def check(workspace: Path, log: TurnLog) -> Invariants:
    """Count everything; the server must be stopped (the databases are read whole)."""
    layout = Layout(workspace)
    transcript = TranscriptDB(layout.transcript_db)
    try:
        observations = list(transcript.iter_all())
    finally:
        transcript.close()
    memory = MemoryDB(layout.memory_db)
    try:
        learned = memory.all_learnings()
        batches = memory.recent_batches(1_000_000)
    finally:
        memory.close()
    marker_of = {o.id: m.group(0) for o in observations if (m := MARKER.search(o.user_message))}
    recorded = Counter(marker_of.values())
    stopped = frozenset(marker_of[o.id] for o in observations if o.id in marker_of and STOPPED_NOTE in o.agent_response)
    learnings = Counter(m.group(0) for x in learned if (m := MARKER.search(x.content)))
    return Invariants(
        turns=reconcile(log, recorded, stopped),
        observations=len(observations),
        pending=sum(o.processed == PENDING for o in observations),
        stale=sum(o.processed not in (PENDING, PROCESSED) for o in observations),
        curated_once=sum(1 for o in observations if o.id in marker_of and learnings[marker_of[o.id]] == 1),
        learning_duplicates=sorted(m for m, n in learnings.items() if n > 1),
        batch_duplicates=curated_twice(batches),
        integrity={"transcript.db": integrity(layout.transcript_db), "memory.db": integrity(layout.memory_db)},
        bad_files=bad_files(layout),
        debris=debris(workspace),
        orphans=workspace_clis(workspace))


def recorded_now(workspace: Path) -> set[str]:
    """The markers transcript.db holds, read while the server runs; empty while it is locked."""
    conn = sqlite3.connect(f"file:{Layout(workspace).transcript_db}?mode=ro", uri=True, timeout=1)
    try:
        return {m.group(0) for (text,) in conn.execute("SELECT user_message FROM observations")
                if (m := MARKER.search(text))}
    except sqlite3.Error:
        return set()
    finally:
        conn.close()


def journal_holds(workspace: Path, marker: str) -> bool:
    """Whether the turn journal's state, as a start reads it (read_state), read while the server runs,
    holds the turn whose message carries `marker`: from then on a kill -9 leaves that turn to be recorded
    at the next start."""
    try:
        entries = read_state(journal_path(Layout(workspace)))
    except OSError:
        return False
    return any(marker in e.observation.user_message for e in entries or [])


def pending_now(workspace: Path) -> int:
    """Observations not yet curated, read while the server runs (WAL lets a reader in)."""
    conn = sqlite3.connect(f"file:{Layout(workspace).transcript_db}?mode=ro", uri=True, timeout=30)
    try:
        return int(conn.execute("SELECT count(*) FROM observations WHERE processed = ?", (PENDING,)).fetchone()[0])
    except sqlite3.Error:
        return -1  # locked or not there yet: ask again
    finally:
        conn.close()
