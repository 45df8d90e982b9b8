"""Forgetting turns: a person forgets what they said (a turn, or a whole session), and the words go.

At once (`TurnForgetting.forget`), the job on disk first (below), the tombstone last:
- transcript.db: each turn keeps a tombstone (which turn, when, by whom) and its row loses its words;
- memory.db: the turn's episode loses its text and its vector, the learnings that came from it (and
  the summary of its session, which may repeat it) are deleted with their pending actions, and
  the audit keeps no word of them; free pages zeroed (secure_delete), the FTS index merged, the WAL
  emptied;
- recall: the vectors become zeros in the vector store (which then never returns nor adds them) and
  the documents leave the word index, which is then written anew in the background, so that no
  segment on disk keeps their words;
- the boot prompt: memory-file lines that came from the turns are left out of it until the daemon
  has rewritten the files;
- meanwhile no turn starts: the caller holds the agent's turns (the console, with the runtime's
  `holding_turns`), since the agent could search for, or be reminded of, what is being forgotten.

Then the memory daemon's next pass (`rewrite_files`, on the daemon's task, the memory files' one
writer) takes those lines out of the curated files (a new version, source `forget`), out of every
older version and every batch's record (a note stands where they were), and out of the backups
(older memory.db copies kept by `memory rebuild`, the v1 data kept by `migrate-v1`), each of which
keeps a note that a forget removed text. The deploy's files (soul.md, os.md) are never touched.
Which lines came from a turn is decided after the forget answers, by a task of its own (the pass
skips a job being decided and decides one left undecided; a new session's boot prompt waits for
the current files' part alone, 10 s at most; a stop gives it the flush's budget, then cancels it): those most of whose words it said
(`came_from`, a pure rule), and, with the dense retriever on, those the curator reworded, whose
embedding is close to the turn's or to a learning drawn from it (the learnings keep the turn they
came from) and closer to it by a margin than to any kept turn or learning recall finds near the
line (`reworded`, chosen on bench/forget_lines.py's labelled set); either way, not a line a kept
turn or learning near it says as well (`kept_holds`); a line that check can't judge (the search
fails) stays until it can. `forget_jobs` in memory.db holds the turns' ids and the sha256 of each
line found, never a word: first the lines the words find, undecided, then the decided lines; a job
left undecided is decided at the pass. The job goes on disk before any store loses the words, and the
transcript's tombstone is written last: a forget a kill cuts short is run again at the next start
(`resume`), from the words the transcript (or memory.db) still holds. The turns' words stay in memory only, for lines a batch
under way writes before the pass, which get the same check.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import re
import shutil
import sqlite3
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..database import checkpoint, marks, transaction
from ..db_worker import Worker
from ..errors import log_expected
from ..fsutil import atomic_write
from ..logs import get_logger
from ..paths import Layout
from ..text import utc
from .files import CURATED, MemoryFiles
from .forgetting import record
from .memory_store import MemoryDB
from .recall import episodes as ep
from .recall.learnings import STOPWORDS
from .recall.service import PURGE_KEY
from .schema import FORGOTTEN
from .transcript_store import Observation, TranscriptDB

log = get_logger(__name__)

FORGET_PASS = "forget"  # the reason a forget wakes the daemon with: its file pass alone, backoff or not
REMOVED = "(text removed here: a person forgot the turn it came from, on {day})"
AUDIT_REMOVED = "(its text was removed when a person forgot the turn it came from)"

# ---------------------------------------------------------------- which lines came from the turns (pure)

_WORD = re.compile(r"\w+", re.UNICODE)
# Search's stop words, and the words every memory file says of whoever it is about: they tell nothing
# of where a line came from.
COMMON_WORDS = STOPWORDS | {"user", "person", "agent", "sprite"}


# Characters folded by one call into the regular expression engine, which holds the GIL throughout:
# an 8 MB turn's words in one call held it (and so the event loop, while a thread folds them) 170 ms.
FOLD_CHUNK = 65_536


def content_words(text: str) -> set[str]:
    """The words that carry meaning, folded: case, plural s, common words left out."""
    out = set()
    for chunk in _chunks(text):
        for word in _WORD.findall(unicodedata.normalize("NFKC", chunk).casefold()):
            if len(word) < 2 or word in COMMON_WORDS:
                continue
            out.add(word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word)
    return out


def _chunks(text: str) -> Iterable[str]:
    """`text` in pieces of about FOLD_CHUNK characters, cut after a space (a word is never cut, unless
    one runs past a whole piece)."""
    start = 0
    while len(text) - start > FOLD_CHUNK:
        end = text.rfind(" ", start + 1, start + FOLD_CHUNK) + 1 or start + FOLD_CHUNK
        yield text[start:end]
        start = end
    yield text[start:]


def turn_text(obs: Observation) -> str:
    """What a turn said, for its words: the message, the answer, each tool call's input and output."""
    parts = [obs.user_message, obs.agent_response]
    with contextlib.suppress(ValueError, TypeError):
        for call in json.loads(obs.tool_calls_json):
            if isinstance(call, dict):
                parts += [str(call.get("input", "")), str(call.get("output", ""))]
    return "\n".join(parts)


def came_from(line: str, forgotten: set[str]) -> bool:
    """A file line came from the forgotten turns when more than half of its meaningful words were
    in them ("- Lives in: Lisbon" after "I live in Lisbon"); a heading, a note or a line of common
    words alone never does."""
    if not meaningful(line):
        return False
    words = content_words(line)
    return bool(words) and len(words & forgotten) * 2 > len(words)


def words_of(texts: Iterable[str]) -> set[str]:
    """The words of all the texts (`content_words`)."""
    out: set[str] = set()
    for text in texts:
        out |= content_words(text)
    return out


def lines_from(lines: dict[str, str], forgotten: set[str]) -> set[str]:
    """The lines (hash: text) that came from the forgotten words (`came_from`): their hashes."""
    return {h for h, text in lines.items() if came_from(text, forgotten)}


def kept_holds(line: str, kept: Sequence[str]) -> bool:
    """Whether a kept turn or learning near the line (`kept`: what recall finds) says most of its words
    too: then the line is as much that turn's, and it stays, however much of it the forgotten turns
    said (precision first: a kept fact removed is removed from every version, for good). "- Father's
    birthday: 9 May" stays after forgetting "My mother's birthday is on 3 May" when another turn said
    the father's; so does a fact two turns said, when one of them is forgotten."""
    return any(came_from(line, content_words(text)) for text in kept)


def meaningful(line: str) -> bool:
    """A line that can have come from a turn: not empty, not a heading, not a forget's note."""
    text = line.strip()
    return bool(text) and not text.startswith("#") and not text.startswith(REMOVED.split(":", 1)[0])


# The meaning rule (multilingual-e5-small passages' cosine). A line counts as the curator's rewording of
# a forgotten turn (or of a learning drawn from it) when its cosine to them is at least DENSE_THRESHOLD
# and exceeds its cosine to every kept turn and learning near it by DENSE_MARGIN: a line another, kept
# turn still says stays. Chosen on bench/forget_lines.py's tuning part (near misses on the same subject
# included) for precision 1.0; docs/memory.md gives both parts' precision and recall.
DENSE_THRESHOLD = 0.87
DENSE_MARGIN = 0.03


def reworded(to_forgotten: float, to_kept: float, threshold: float = DENSE_THRESHOLD,
             margin: float = DENSE_MARGIN) -> bool:
    """Whether a line whose nearest forgotten anchor is at cosine `to_forgotten`, and nearest kept turn
    or learning at `to_kept` (-1 when none is known), came from the forgotten turns."""
    return to_forgotten >= threshold and to_forgotten - to_kept > margin


def nearest(anchors: np.ndarray, lines: np.ndarray) -> list[float]:
    """For each line's vector (rows of `lines`), its cosine to the nearest anchor; -1 with no anchor.
    Vectors are unit length: the dot is the cosine."""
    if not len(anchors) or not len(lines):
        return [-1.0] * len(lines)
    return [float(s) for s in (lines @ anchors.T).max(axis=1)]


def line_hash(line: str) -> str:
    return hashlib.sha256(line.strip().encode()).hexdigest()


def without(text: str, hashes: set[str], note: str | None = None) -> str:
    """`text` without the lines whose hash is in `hashes`; with `note`, one note stands for each run
    of removed lines."""
    out: list[str] = []
    removing = False
    for line in text.splitlines(keepends=True):
        if line.strip() and line_hash(line) in hashes:
            if note is not None and not removing:
                out.append(note + "\n")
            removing = True
            continue
        removing = False
        out.append(line)
    return "".join(out)


# ---------------------------------------------------------------- memory.db


@dataclass
class Purged:
    learning_ids: list[int]
    contents: list[str]  # what those drawn from the turns said, for finding the file lines written from them


def purge_memory(db: MemoryDB, turns: Sequence[Observation]) -> Purged:
    """Delete from memory.db what came from these turns: their episodes' text and vectors, the
    learnings cited from them and their sessions' summaries, those learnings' actions; the audit
    keeps no word of them. Returns which learnings were deleted."""
    ids, sessions = [o.id for o in turns], sorted({o.session_id for o in turns})
    # A turn not indexed yet gets its episode now, without text: the indexer may hold the turn as it was
    # read before the forget, and adding an episode leaves a known one as it is.
    ep.add(db.conn, [ep.Episode(o.id, o.session_id, o.sequence_num, o.timestamp, "") for o in turns])
    with transaction(db.conn) as c:
        found = c.execute(
            f"SELECT id, content, type FROM learnings WHERE source_observation_id IN ({marks(ids)}) "
            f"OR (type = 'SUMMARY' AND session_id IN ({marks(sessions)}))", [*ids, *sessions]).fetchall()
        learning_ids = [lid for lid, _, _ in found]
        c.execute(f"UPDATE episodes SET text = '' WHERE id IN ({marks(ids)})", list(ids))
        c.execute(f"DELETE FROM episode_vectors WHERE id IN ({marks(ids)})", list(ids))
        c.execute(f"DELETE FROM pending_actions WHERE source_learning_id IN ({marks(learning_ids)})", learning_ids)
        c.execute(f"UPDATE memory_audit SET detail = ? WHERE learning_id IN ({marks(learning_ids)})",
                  [AUDIT_REMOVED, *learning_ids])
        c.execute(f"DELETE FROM learnings WHERE id IN ({marks(learning_ids)})", learning_ids)
    tidy(db.conn)
    # A session's summary goes too (it may repeat the turn), but it speaks of the session's other turns
    # as well: what it says is no sign of where a line came from.
    return Purged(learning_ids, [content for _, content, kind in found if kind != "SUMMARY"])


def tidy(conn: sqlite3.Connection) -> None:
    """After deleting words: the FTS index merged (its segments keep a deleted row's words until
    then), the WAL emptied."""
    conn.execute("INSERT INTO learnings_fts(learnings_fts) VALUES ('optimize')")
    checkpoint(conn)


class Job(msgspec.Struct, frozen=True):
    id: int
    created_at: float
    observation_ids: list[int]
    sessions: list[str]
    line_hashes: list[str]
    decided: bool = True  # False: the lines the words found, not yet checked against what is kept


def add_job(db: MemoryDB, ids: Sequence[int], sessions: Sequence[str], hashes: set[str], now: float) -> int:
    """A job whose lines are the words' first guess: undecided until `set_job_lines`. Written before any
    store loses the words, with recall's flag that the index must be written anew: a forget cut short
    anywhere after this is finished at the next start (`TurnForgetting.resume`)."""
    with transaction(db.conn) as c:
        cur = c.execute("INSERT INTO forget_jobs (created_at, observation_ids, sessions, line_hashes, decided) "
                        "VALUES (?, ?, ?, ?, 0)", (now, json.dumps(list(ids)), json.dumps(list(sessions)),
                                                   json.dumps(sorted(hashes))))
        c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, '1')", (PURGE_KEY,))
    return int(cur.lastrowid or 0)


def left_over(db: MemoryDB, ids: Sequence[int]) -> dict[int, list[str]]:
    """Of these forgotten turns, those memory.db still holds words of (a forget cut short by a kill, under
    the order of steps before the job went first): each one's episode text and its learnings' contents."""
    out: dict[int, list[str]] = {}
    for i in range(0, len(ids), 500):
        part = list(ids[i:i + 500])
        for oid, text in db.conn.execute(
                f"SELECT id, text FROM episodes WHERE text != '' AND id IN ({marks(part)})", part):
            out.setdefault(oid, []).append(text)
        for oid, content in db.conn.execute(
                f"SELECT source_observation_id, content FROM learnings WHERE type != 'SUMMARY' "
                f"AND source_observation_id IN ({marks(part)})", part):
            out.setdefault(oid, []).append(content)
    return out


def being_forgotten(db: MemoryDB, ids: Sequence[int]) -> list[int]:
    """Which of these turns a forget job names (a forget under way, its tombstone not yet written)."""
    wanted = set(ids)
    return sorted({i for job in jobs(db) for i in job.observation_ids if i in wanted})


def set_job_lines(db: MemoryDB, job_id: int, hashes: set[str]) -> None:
    """The job's lines, once decided (they replace the words' first guess)."""
    db.conn.execute("UPDATE forget_jobs SET line_hashes = ?, decided = 1 WHERE id = ?",
                    (json.dumps(sorted(hashes)), job_id))


def decide_current(db: MemoryDB, job_id: int, checked: set[str], found: set[str]) -> None:
    """An undecided job's current files' lines decided (`checked`, of which `found` came from the turns):
    they replace the words' guess there, for the boot prompt and for its pass if it is decided there."""
    row = db.conn.execute("SELECT line_hashes FROM forget_jobs WHERE id = ? AND decided = 0", (job_id,)).fetchone()
    if row is not None:
        db.conn.execute("UPDATE forget_jobs SET line_hashes = ? WHERE id = ?",
                        (json.dumps(sorted((set(json.loads(row[0])) - checked) | found)), job_id))


def jobs(db: MemoryDB) -> list[Job]:
    found = db.conn.execute("SELECT id, created_at, observation_ids, sessions, line_hashes, decided FROM forget_jobs "
                            "ORDER BY id").fetchall()
    return [Job(r[0], r[1], json.loads(r[2]), json.loads(r[3]), json.loads(r[4]), bool(r[5])) for r in found]


def hidden_lines(db: MemoryDB) -> set[str]:
    """The hashes of file lines a pending job may remove (an undecided job's first guess included): the
    boot prompt leaves them out now."""
    return {h for job in jobs(db) for h in job.line_hashes}


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


def finish_job(db: MemoryDB, job: Job, turns: int, now: float) -> None:
    with transaction(db.conn) as c:
        c.execute("DELETE FROM forget_jobs WHERE id = ?", (job.id,))
    record(db, "forget_turns", now, detail=f"{turns} turn{'s' if turns != 1 else ''} of "
           f"{', '.join(job.sessions)}: their words removed from the files, their history and backups")
    tidy(db.conn)


# ---------------------------------------------------------------- the files and their history


def file_candidates(files: MemoryFiles) -> dict[str, str]:
    """Every meaningful line of the curated files and their versions, once each: its hash, its text. The
    deploy's files (soul.md, os.md: templates bootstrap installs) say nothing a person said: never."""
    out: dict[str, str] = {}
    for name in CURATED:
        texts = [files.read(name)]
        for version in files.history(name):
            with contextlib.suppress(OSError):
                texts.append(version.text)
        out.update((line_hash(line), line.strip()) for text in texts for line in text.splitlines() if meaningful(line))
    return out


def _backup_files(layout: Layout) -> list[Path]:
    """Memory files kept by `migrate-v1` (v1's memory/*.md) under `.os/backup/`."""
    return [p for p in (layout.os_dir / "backup").glob("*/memory/*.md") if p.is_file() and not p.is_symlink()]


def backup_candidates(layout: Layout) -> dict[str, str]:
    """Every meaningful line of the backups' memory files (v1's, kept by `migrate-v1`): hash, text."""
    out: dict[str, str] = {}
    for path in _backup_files(layout):
        text = path.read_text(encoding="utf-8", errors="replace")
        out.update((line_hash(line), line.strip()) for line in text.splitlines() if meaningful(line))
    return out


def current_lines(files: MemoryFiles) -> set[str]:
    """The hashes of the curated files' meaningful lines as they are now."""
    return {line_hash(line) for name in CURATED for line in files.read(name).splitlines() if meaningful(line)}


def strip_files(files: MemoryFiles, hashes: set[str], note: str) -> list[str]:
    """The curated files without those lines (each a new version, `forget`), then every version of
    them rewritten in place with a note where the lines were. Returns the files changed."""
    changed = []
    for name in CURATED:
        text = files.read(name)
        kept = without(text, hashes)
        if kept != text:
            files.write(name, kept, "forget")
            changed.append(name)
    for name in CURATED:
        files.redact_history(name, lambda old: without(old, hashes, note))
    return changed


# ---------------------------------------------------------------- backups


def _purge_copy(path: Path, ids: Sequence[int], sessions: Sequence[str], hashes: set[str], note: str) -> bool:
    """An older copy of memory.db (kept by `memory rebuild`) or v1's agent.db (kept by `migrate-v1`):
    the same rows removed, the file rewritten without free pages (VACUUM), and a note left in it."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA secure_delete=ON")
        tables = {r for (r,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "observations" in tables:  # v1's agent.db: its turns, under the same ids
            conn.execute("DROP TRIGGER IF EXISTS observations_append_only")
            conn.execute(f"UPDATE observations SET user_message = '', tool_calls_json = '[]', agent_response = '' "
                         f"WHERE id IN ({marks(ids)})", list(ids))
        if "learnings" in tables:
            gone = [r for (r,) in conn.execute(
                f"SELECT id FROM learnings WHERE source_observation_id IN ({marks(ids)}) "
                f"OR (type = 'SUMMARY' AND session_id IN ({marks(sessions)}))", [*ids, *sessions])]
            if "pending_actions" in tables:
                conn.execute(f"DELETE FROM pending_actions WHERE source_learning_id IN ({marks(gone)})", gone)
            if "memory_audit" in tables:
                conn.execute(f"UPDATE memory_audit SET detail = ? WHERE learning_id IN ({marks(gone)})",
                             [AUDIT_REMOVED, *gone])
            conn.execute(f"DELETE FROM learnings WHERE id IN ({marks(gone)})", gone)
            if "learnings_fts" in tables:
                conn.execute("INSERT INTO learnings_fts(learnings_fts) VALUES ('rebuild')")
        if "episodes" in tables:
            conn.execute(f"DELETE FROM episodes WHERE id IN ({marks(ids)})", list(ids))
        if "episode_vectors" in tables:
            conn.execute(f"DELETE FROM episode_vectors WHERE id IN ({marks(ids)})", list(ids))
        if "batches" in tables:
            for bid, updates in conn.execute("SELECT id, file_updates FROM batches").fetchall():
                with contextlib.suppress(ValueError, TypeError):
                    files = json.loads(updates or "{}")
                    conn.execute("UPDATE batches SET file_updates = ? WHERE id = ?",
                                 (json.dumps({n: without(t, hashes, note) for n, t in files.items()}), bid))
        conn.execute("CREATE TABLE IF NOT EXISTS forget_notes (at REAL NOT NULL, note TEXT NOT NULL)")
        conn.execute("INSERT INTO forget_notes (at, note) VALUES (?, ?)", (time.time(), note))
        conn.execute("VACUUM")
        return True
    except sqlite3.DatabaseError as exc:
        log.error("forget_backup_unreadable", path=str(path), error=str(exc)[:200])
        return False
    finally:
        conn.close()


def purge_backups(layout: Layout, ids: Sequence[int], sessions: Sequence[str], hashes: set[str], note: str) -> int:
    """Every backup under `.os/`: older memory.db copies, v1's data and files. Returns how many changed."""
    done = 0
    copies = [*layout.memory_dir.glob("memory.db.before-rebuild-*"), *(layout.os_dir / "backup").glob("*/agent.db")]
    for path in copies:
        if path.is_file() and not path.is_symlink() and _purge_copy(path, ids, sessions, hashes, note):
            for suffix in ("-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            done += 1
    for md in _backup_files(layout):
        text = md.read_text(encoding="utf-8", errors="replace")
        if (kept := without(text, hashes, note)) != text:
            atomic_write(md, kept.encode("utf-8"))
            done += 1
    for aside in layout.memory_dir.glob("index.*"):  # a recall index set aside (broken, or mid-swap): derived data
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside, ignore_errors=True)
            done += 1
    return done


# ---------------------------------------------------------------- the whole of it


@dataclass
class Forgotten:
    turns: list[Observation]  # as they were recorded (the caller uses their ids, sessions and numbers)
    learnings: int
    at: float
    # Whether the current session holds them otherwise (its boot prompt a line the words find, or auto-recall
    # one of the turns or a learning from it): its context must let go of them too.
    in_context: bool = False


Purge = Callable[[Sequence[int], Sequence[int]], Awaitable[None]]  # recall, without these turns and learnings
Embed = Callable[[Sequence[str]], Awaitable["np.ndarray | None"]]  # passages' unit vectors; None: no dense model
# For each line (its text; whether by meaning too, or by words alone), what the kept turns and
# learnings nearest to it say (recall's search, which no longer finds the forgotten ones).
KeptNear = Callable[[Sequence[tuple[str, bool]]], Awaitable[list[list[str]]]]
LINES_EMBEDDED_AT_ONCE = 64  # on the embedder's thread, between its other work
# Of each text a forget embeds (a forgotten turn, a kept one near a line), its first characters: as
# many as a turn's vector in recall holds (episodes.EMBED_CHARS). The model reads all it is given, in
# time linear in its length: an 8 MB turn held the embedder's thread for hours (and a stop, for ever).
EMBEDDED_CHARS = ep.EMBED_CHARS
# Line vectors kept in memory between forgets (1.5 KiB each), the least recently used let go first:
# embedding a line costs ~20 ms, and a person often forgets several turns one after the other.
LINE_VECTORS_KEPT = 5_000
KEPT_CHECK_TIMEOUT = 120.0  # seconds the kept-turn search may take before it counts as failed
# A decision whose kept-turn check failed is tried again after these pauses (seconds), the last again and
# again until one succeeds (with no new turn, nothing else would try it); its lines stay in the files
# (out of the boot prompt) meanwhile.
DECIDE_RETRIES = (2.0, 10.0, 60.0, 300.0)
Apply = Callable[[Callable[[MemoryDB], Any]], Awaitable[Any]]  # MemoryDaemon.apply
# Whether the current session holds lines (their hashes), lines the turns' words find, or turns (their ids)
# in its context.
Holds = Callable[[set[str], set[str], Sequence[int]], bool]


class CheckFailed(Exception):
    """The kept-turn check could not be made: no line it would judge leaves."""


@dataclass
class Lines:
    """The lines a forget judges, by hash. `files`: the curated files', their versions' and the batches'
    records' (the meaning judges them too); `backups`: v1's memory files' (the words alone); `current`:
    those in the curated files as they are now."""

    files: dict[str, str]
    backups: dict[str, str]
    current: set[str]

    def texts(self) -> dict[str, str]:
        return {**self.backups, **self.files}

    def split(self) -> tuple[Lines, Lines]:
        """The current files' lines, and the others (their history, the batches' records, the backups)."""
        now = self.current
        return (Lines({h: t for h, t in self.files.items() if h in now}, {}, now),
                Lines({h: t for h, t in self.files.items() if h not in now},
                      {h: t for h, t in self.backups.items() if h not in now}, now))


@dataclass
class _Decision:
    """What a forget keeps in memory (never on disk) until the daemon's pass: the turns' words, what
    they and their learnings said (the meaning's anchors), the lines judged and the words' guess."""

    words: set[str]
    anchors: list[str]
    lines: Lines
    by_words: set[str]


@dataclass
class TurnForgetting:
    """Owns forgetting: the at-once part for whoever asks (the console), the decision of which file
    lines go (a task of its own), the file pass for the daemon."""

    layout: Layout
    transcript: Worker[TranscriptDB]
    memory: Worker[MemoryDB]
    files: MemoryFiles
    purge_recall: Purge
    wake_daemon: Callable[[str], None]
    apply: Apply  # memory.db's one writer, for the changes made outside the daemon's pass
    clock: Callable[[], float] = time.time
    embed: Embed | None = None  # the dense retriever's, to find reworded lines; None: by words alone
    kept_near: KeptNear | None = None  # what still supports a line; None: the threshold alone decides
    retries: Sequence[float] = DECIDE_RETRIES
    holds: Holds = lambda lines, words, ids: False
    _decisions: dict[int, _Decision] = field(default_factory=dict)  # job id -> in memory only, until its pass
    # line hash -> its vector, in memory only, least recently used first
    _line_vectors: OrderedDict[str, np.ndarray] = field(default_factory=OrderedDict)
    # the jobs being decided (None: until recall has lost the words), which the pass leaves alone
    _deciding: dict[int, asyncio.Task[None] | None] = field(default_factory=dict)
    _stopping: bool = False
    _current: dict[int, asyncio.Event] = field(default_factory=dict)  # set once a job's current lines are decided
    _taking_out: int = 0  # forgets taking words out now (their jobs may be on disk, not yet in `_deciding`)
    # Decisions take turns (in order, the current files' parts first as they come): forgets in a row then
    # embed each line once, the next finding the vectors the one before kept.
    _one_at_a_time: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def forget(self, ids: Iterable[int], by: str) -> Forgotten:
        """The words out of every store at once, and the job that takes the file lines out on disk; the
        lines are then decided by a task of their own (`decided` waits for it). A turn forgotten already
        whose words memory.db still holds (a forget cut short) is taken out again. The caller holds the
        agent's turns meanwhile."""
        now = self.clock()
        wanted = list(ids)
        turns = await self.transcript.call(lambda t: t.get(wanted))
        old = [o.id for o in turns if o.processed == FORGOTTEN]
        left = await self.memory.call(lambda m: left_over(m, old)) if old else {}
        turns = [o for o in turns if o.processed != FORGOTTEN or o.id in left]
        if not turns:
            return Forgotten([], 0, now)
        texts = await asyncio.to_thread(lambda: [turn_text(o) for o in turns if o.id not in left]) + [
            t for o in turns for t in left.get(o.id, [])]
        job, decision, learnings = await self._take_out(turns, texts, now, by, None)
        self._start_decision(job, decision)
        log.info("turns_forgotten", turns=len(turns), learnings=learnings, by_words=len(decision.by_words), by=by)
        return Forgotten(turns, learnings, now, self.holds(decision.by_words, decision.words, [o.id for o in turns]))

    async def resume(self) -> int:
        """At start, before any turn: finish the forgets a stop or kill cut short. A job whose turns still
        have their words in the transcript (its tombstone is written last) has every step run again, and
        so has a forgotten turn memory.db still holds words of (cut short under the order of steps
        before); each step is idempotent. Returns the forgets finished."""
        done = 0
        for job in await self.memory.call(jobs):
            turns = await self.transcript.call(lambda t, j=job: t.get(j.observation_ids))  # type: ignore[misc]
            if any(o.processed != FORGOTTEN for o in turns):
                await self._resumed(turns, [turn_text(o) for o in turns if o.processed != FORGOTTEN], job.id)
                done += 1
        old = await self.transcript.call(lambda t: t.forgotten_ids())
        if left := await self.memory.call(lambda m: left_over(m, old)):
            turns = await self.transcript.call(lambda t: t.get(sorted(left)))
            await self._resumed(turns, [text for texts in left.values() for text in texts], None)
            done += 1
        return done

    async def _resumed(self, turns: list[Observation], texts: list[str], job: int | None) -> None:
        job, decision, learnings = await self._take_out(turns, texts, self.clock(), "a forget cut short", job)
        self._start_decision(job, decision)
        log.warning("forget_resumed", job=job, turns=len(turns), learnings=learnings)

    async def _take_out(self, turns: list[Observation], texts: list[str], now: float, by: str,
                        job: int | None) -> tuple[int, _Decision, int]:
        """The steps, in an order a kill may cut anywhere: the job on disk first (the turns, the lines the
        words find, undecided; recall's flag set), then memory.db, then recall, and the transcript's
        tombstones last, so that until then a start finds the words and runs every step again."""
        done = [o.id for o in turns]
        sessions = sorted({o.session_id for o in turns})
        self._taking_out += 1  # the pass leaves undecided jobs alone meanwhile: this one may be among them
        try:
            # A whole session's tool outputs are megabytes: their words, and the lines they find, off the loop.
            words = await asyncio.to_thread(words_of, list(texts))
            lines = await self._lines()
            by_words = await asyncio.to_thread(lines_from, lines.texts(), set(words))
            if job is None:
                job = await self.apply(lambda m: add_job(m, done, sessions, by_words, now))
            self._deciding[job] = None  # the pass leaves it alone: it is decided once recall has lost the words
            try:
                purged = await self.apply(lambda m: purge_memory(m, turns))
                await self.purge_recall(done, purged.learning_ids)  # recall's search finds only kept turns from here
                fresh = [o.id for o in turns if o.processed != FORGOTTEN]
                if fresh:
                    await self.transcript.call(lambda t: t.forget(fresh, now, by))
            except BaseException:
                del self._deciding[job]  # the next start, or the daemon's pass, finishes it
                raise
        finally:
            self._taking_out -= 1
        decision = _Decision(words, texts + purged.contents, lines, by_words)
        self._decisions[job] = decision
        return job, decision, len(purged.learning_ids)

    def _start_decision(self, job: int, decision: _Decision) -> None:
        self._current[job] = asyncio.Event()
        self._deciding[job] = asyncio.create_task(self._decide(job, decision), name=f"forget-decide-{job}")

    async def decided(self, budget: float) -> bool:
        """Wait, at most `budget` seconds, for the forgets deciding their lines. True if none is left."""
        running = [task for task in self._deciding.values() if task is not None]
        if not running:
            return True
        _, pending = await asyncio.wait(running, timeout=budget)
        return not pending

    async def stop(self, budget: float) -> None:
        """A stop lets the decisions under way finish within `budget` seconds (the turns' words, which
        judge the lines a batch writes after the forget, and the meaning's anchors are in memory only:
        the shutdown's last pass uses them), then cancels the rest: their jobs are on disk, undecided,
        and the daemon's pass at the next start decides them by the words the job found."""
        try:
            if not await self.decided(budget):
                log.warning("forget_decision_cut_short", budget=budget, jobs=len(self._deciding))
        finally:  # even when the stop cuts this wait itself (nothing left of its share): cancelled all the same
            self._stopping = True  # the shutdown's last pass leaves undecided jobs to the next start
            running = [task for task in self._deciding.values() if task is not None]
            for task in running:
                task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _decide(self, job: int, decision: _Decision) -> None:
        """The current files' lines first (tens of them: a new session's boot waits for those alone, and
        the boot prompt leaves out what they find from then on), then the rest: their history, the
        batches' records, the backups."""
        now, rest = decision.lines.split()
        found_now: set[str] | None = None
        try:
            pauses = itertools.chain(self.retries, itertools.repeat(self.retries[-1] if self.retries else DECIDE_RETRIES[-1]))
            for attempt, pause in enumerate(pauses):
                try:
                    if found_now is None:
                        async with self._one_at_a_time:
                            found_now = await self._found(decision.by_words & set(now.files), decision.anchors, now)
                        await self.apply(lambda m, c=set(now.files), f=found_now:  # type: ignore[misc]
                                         decide_current(m, job, c, f))
                        self._current_ready(job)
                    async with self._one_at_a_time:
                        hashes = found_now | await self._found(decision.by_words - set(now.files), decision.anchors,
                                                               rest)
                except CheckFailed as exc:
                    # Precision first: a line the check could not judge stays in the files until it can.
                    log.warning("forget_check_failed", job=job, attempt=attempt + 1, error=str(exc)[:200],
                                lines_kept_for_now=len(decision.by_words), next_try_s=pause)
                    await asyncio.sleep(pause)
                    continue
                await self.apply(lambda m, h=hashes: set_job_lines(m, job, h))  # type: ignore[misc]
                log.info("forget_lines_decided", job=job, lines=len(hashes))
                self.wake_daemon(FORGET_PASS)
                return
        except Exception as exc:  # a database error: the job stays undecided, for the daemon's pass
            log_expected(log, "forget_decision_failed", exc)
        finally:
            self._current_ready(job)
            self._deciding.pop(job, None)

    def _current_ready(self, job: int) -> None:
        if (ready := self._current.pop(job, None)) is not None:
            ready.set()

    async def current_decided(self, budget: float) -> bool:
        """Wait, at most `budget` seconds, until the forgets deciding their lines have decided the current
        files' (what a new session's boot prompt holds). True if none is left."""
        waiting = [asyncio.create_task(ready.wait()) for ready in self._current.values()]
        if not waiting:
            return True
        _, pending = await asyncio.wait(waiting, timeout=budget)
        for task in pending:
            task.cancel()
        return not pending

    async def rewrite_files(self) -> int:
        """The daemon's pass: each pending job's lines out of the files, their history, the batches'
        records and the backups. A job whose decision is under way is left to it (its end wakes the
        daemon again); one left undecided is decided now. Returns the jobs done."""
        done = 0
        for job in await self.memory.call(jobs):
            if job.id in self._deciding or (not job.decided and (self._stopping or self._taking_out)):
                continue
            try:
                hashes = await self._settled(job)
            except CheckFailed as exc:
                log.warning("forget_check_failed", job=job.id, error=str(exc)[:200],
                            lines_kept_for_now=len(job.line_hashes), next_try_s="the daemon's next pass")
                continue
            note = REMOVED.format(day=utc(job.created_at, "%Y-%m-%d"))
            changed = await asyncio.to_thread(strip_files, self.files, hashes, note)
            await self.memory.call(lambda m, h=hashes: strip_batches(m, h))  # type: ignore[misc]
            backups = await asyncio.to_thread(purge_backups, self.layout, job.observation_ids, job.sessions, hashes,
                                              note)
            await self.memory.call(lambda m, j=job: finish_job(m, j, len(j.observation_ids), self.clock()))  # type: ignore[misc]
            self._decisions.pop(job.id, None)
            log.info("forget_files_rewritten", job=job.id, files=changed, backups=backups)
            done += 1
        return done

    async def _settled(self, job: Job) -> set[str]:
        """The lines the pass takes out for `job`: as decided at the forget; for a job left undecided,
        decided now (after a restart, by the words alone: the meaning's anchors were in memory); and the
        lines written since the forget that the turns' words find, with the same kept-turn check.
        CheckFailed: the check could not be made, and the job waits for the next pass."""
        decision = self._decisions.get(job.id)
        hashes = set(job.line_hashes)
        if not job.decided:
            if decision is not None:
                hashes = await self._found(decision.by_words, decision.anchors, decision.lines)
            else:
                now = await self._lines()
                texts = now.texts()
                mine = {h: texts[h] for h in hashes if h in texts}
                hashes = await self._found(set(mine), [], Lines(mine, {}, set()))
            await self.memory.call(lambda m: set_job_lines(m, job.id, hashes))
        else:
            hashes = await self._still_found(hashes)
        if decision is None:
            return hashes
        now = await self._lines()
        judged = decision.lines
        # New since the forget: a line not judged then, or one judged then but written into the current
        # files since (a kept turn may say it now). Only those the words find.
        rewritten = now.current - judged.current
        unjudged = {h: text for h, text in now.texts().items()
                    if h in rewritten or (h not in judged.files and h not in judged.backups)}
        found = await asyncio.to_thread(lines_from, unjudged, set(decision.words))
        new = {h: unjudged[h] for h in found}
        if not new:
            return hashes
        checked = await self._found(set(new), [], Lines(new, {}, set()))
        log.info("forget_later_lines", job=job.id, new=len(new), found=len(checked))
        return (hashes - set(new)) | checked

    async def _still_found(self, hashes: set[str]) -> set[str]:
        """Decided lines still in the current files, checked again against what is kept now: a person may
        have said the fact again since the forget (a kept turn), and then the line stays."""
        texts = await asyncio.to_thread(_current_texts, self.files)
        now = {h: texts[h] for h in hashes if h in texts}
        if not now:
            return hashes
        return (hashes - set(now)) | await self._found(set(now), [], Lines(now, {}, set()))

    async def _lines(self) -> Lines:
        files = await asyncio.to_thread(file_candidates, self.files)
        files.update(await self.memory.call(_batch_candidates))
        backups = await asyncio.to_thread(backup_candidates, self.layout)
        current = await asyncio.to_thread(current_lines, self.files)
        return Lines(files, backups, current)

    async def _vectors(self, texts: Sequence[str], keep: bool = True) -> np.ndarray | None:
        """The texts' vectors: those kept from before, the others embedded (in batches, on the embedder's
        thread) and kept (`keep`: never a forgotten turn's); None without the dense model or when it fails."""
        if self.embed is None or not texts:
            return None
        keys = [line_hash(text) for text in texts]
        cache = self._line_vectors
        todo = list({k: text for k, text in zip(keys, texts, strict=True) if k not in cache}.items())
        step = LINES_EMBEDDED_AT_ONCE
        found: dict[str, np.ndarray] = {}
        try:
            for i in range(0, len(todo), step):
                part = await self.embed([text[:EMBEDDED_CHARS] for _, text in todo[i:i + step]])
                if part is None:
                    return None
                found.update((k, part[j]) for j, (k, _) in enumerate(todo[i:i + step]))
        except Exception as exc:  # the model failed: the words still find what they find
            log.error("forget_embedding_failed", error=type(exc).__name__)
            return None
        out = np.stack([found[k] if k in found else cache[k] for k in keys]).astype(np.float32)
        for k in keys:  # used now: the last to be let go
            if k in cache:
                cache.move_to_end(k)
        if keep:
            cache.update(found)
        while len(cache) > LINE_VECTORS_KEPT:
            cache.popitem(last=False)
        return out

    async def _found(self, by_words: set[str], anchor_texts: Sequence[str], lines: Lines) -> set[str]:
        """The lines (hash: text) that came from the forgotten turns: most of their words are the
        turns' (`by_words`, found by `came_from`), or, with the dense retriever, the curator reworded
        them (close to the turns and their learnings, `anchor_texts`, and closer to them than to what is
        kept: `reworded`); and no kept turn or learning near the line says it as well (`kept_holds`).
        CheckFailed when the kept-turn search fails: no line is taken out unchecked."""
        texts = lines.texts()
        # The words' lines need no vector: the meaning only adds lines, and only the kept-turn check takes away.
        by_meaning = [(h, text) for h, text in lines.files.items() if h not in by_words]
        scored = await self._scored(by_meaning, anchor_texts) if anchor_texts else {}
        check = [h for h in texts if h in by_words or (h in scored and scored[h][0] >= DENSE_THRESHOLD)]
        if not check:
            return set()
        near = await self._kept_near([(texts[h], h not in by_words) for h in check])
        to_kept = await self._kept_scores(near, np.stack([scored[h][1] for h in check if h in scored])
                                          if any(h in scored for h in check) else None, [h in scored for h in check])
        came = [(h, texts[h], found) for h, found, kept in zip(check, near, to_kept, strict=True)
                if h in by_words or (h in scored and reworded(scored[h][0], kept))]
        # Each kept turn's whole text (its tool outputs too) folded into words: off the loop.
        held = await asyncio.to_thread(lambda: [kept_holds(text, found) for _, text, found in came])
        out = {h for (h, _, _), kept in zip(came, held, strict=True) if not kept}
        for h in out:  # they leave every file: no forget needs them again
            self._line_vectors.pop(h, None)
        log.info("forget_lines_found", candidates=len(texts), checked=len(check), by_words=len(by_words),
                 found=len(out))
        return out

    async def _scored(self, todo: list[tuple[str, str]], anchor_texts: Sequence[str]
                      ) -> dict[str, tuple[float, np.ndarray]]:
        """With the dense retriever, each line of `todo` (hash, text): its cosine to the nearest anchor
        and its vector; without it (or when it fails), nothing."""
        anchors = await self._vectors(anchor_texts, keep=False) if todo else None
        if anchors is None:
            return {}
        vectors = await self._vectors([text for _, text in todo])
        if vectors is None:
            return {}
        scores = nearest(anchors, vectors)
        return {h: (scores[i], vectors[i]) for i, (h, _) in enumerate(todo)}

    async def _kept_near(self, lines: Sequence[tuple[str, bool]]) -> list[list[str]]:
        if self.kept_near is None:
            return [[] for _ in lines]
        limit = asyncio.timeout(KEPT_CHECK_TIMEOUT)
        try:
            async with limit:
                return await self.kept_near(lines)
        except TimeoutError as exc:
            if limit.expired():
                raise CheckFailed(f"the kept-turn search took over {KEPT_CHECK_TIMEOUT:g} s") from exc
            raise CheckFailed(f"the kept-turn search gave up: {exc}") from exc  # the word index behind, say
        except Exception as exc:
            raise CheckFailed(f"the kept-turn search failed: {type(exc).__name__}: {exc}") from exc

    async def _kept_scores(self, near: Sequence[Sequence[str]], vectors: np.ndarray | None,
                           scored: Sequence[bool]) -> list[float]:
        """Each line's cosine to the nearest of the kept turns and learnings found for it (`near`), for
        the lines with a vector (`scored`; `vectors` in their order); +1 when they can't be embedded
        (precision first: a line that can't be checked by meaning stays), -1 for the others."""
        if vectors is None or not any(scored):
            return [-1.0] * len(near)
        texts = [text for found, has in zip(near, scored, strict=True) if has for text in found]
        kept = await self._vectors(texts) if texts else np.zeros((0, vectors.shape[1]), dtype=np.float32)
        if kept is None:
            return [1.0 if has else -1.0 for has in scored]
        out, at, row = [], 0, 0
        for found, has in zip(near, scored, strict=True):
            if not has:
                out.append(-1.0)
                continue
            out.append(nearest(kept[at:at + len(found)], vectors[row:row + 1])[0])
            at += len(found)
            row += 1
        return out


def _current_texts(files: MemoryFiles) -> dict[str, str]:
    return {line_hash(line): line.strip() for name in CURATED for line in files.read(name).splitlines()
            if meaningful(line)}


def _batch_candidates(db: MemoryDB) -> dict[str, str]:
    out: dict[str, str] = {}
    for (updates,) in db.conn.execute("SELECT file_updates FROM batches WHERE file_updates != '{}'"):
        with contextlib.suppress(ValueError, TypeError):
            for text in json.loads(updates).values():
                out.update((line_hash(line), line.strip()) for line in text.splitlines() if meaningful(line))
    return out

