"""Forgetting turns: a person forgets what they said (a turn, or a whole session), and the words go.

At once (`TurnForgetting.forget`):
- transcript.db: each turn keeps a tombstone (which turn, when, by whom) and its row loses its words;
- memory.db: the turn's episode loses its text and its vector, the learnings that came from it (and
  the summary of its session, which may repeat it) are deleted with their pending actions, and
  the audit keeps no word of them; free pages zeroed (secure_delete), the FTS index merged, the WAL
  emptied;
- recall: the vectors become zeros in the vector store (which then never returns nor adds them) and
  the documents leave the word index, which is then written anew in the background, so that no
  segment on disk keeps their words;
- the boot prompt: memory-file lines that came from the turns are left out of it until the daemon
  has rewritten the files.

Then the memory daemon's next pass (`rewrite_files`, on the daemon's task, the memory files' one
writer) takes those lines out of the curated files (a new version, source `forget`), out of every
older version and every batch's record (a note stands where they were), and out of the backups
(older memory.db copies kept by `memory rebuild`, the v1 data kept by `migrate-v1`), each of which
keeps a note that a forget removed text. The deploy's files (soul.md, os.md) are never touched.
Which lines came from a turn is decided at the forget: those most of whose words it said
(`came_from`, a pure rule), and, with the dense retriever on, those the curator reworded, whose
embedding is close to the turn's or to a learning drawn from it (the learnings keep the turn they
came from) and closer to it by a margin than to any kept turn or learning recall finds near the
line (`reworded`, chosen on bench/forget_lines.py's labelled set); either way, not a line a kept
turn or learning near it says as well (`kept_holds`). `forget_jobs` in memory.db holds
the turns' ids and the sha256 of each line found, never a word; the turns' words stay in memory
only, for lines a batch under way writes before the pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import shutil
import sqlite3
import time
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..database import checkpoint, marks, transaction
from ..db_worker import Worker
from ..fsutil import atomic_write
from ..logs import get_logger
from ..paths import Layout
from ..text import utc
from .files import CURATED, MemoryFiles
from .forgetting import record
from .memory_store import MemoryDB
from .recall import episodes as ep
from .recall.learnings import STOPWORDS
from .transcript_store import Observation, TranscriptDB

log = get_logger(__name__)

REMOVED = "(text removed here: a person forgot the turn it came from, on {day})"
AUDIT_REMOVED = "(its text was removed when a person forgot the turn it came from)"

# ---------------------------------------------------------------- which lines came from the turns (pure)

_WORD = re.compile(r"\w+", re.UNICODE)
# Search's stop words, and the words every memory file says of whoever it is about: they tell nothing
# of where a line came from.
COMMON_WORDS = STOPWORDS | {"user", "person", "agent", "sprite"}


def content_words(text: str) -> set[str]:
    """The words that carry meaning, folded: case, plural s, common words left out."""
    out = set()
    for word in _WORD.findall(unicodedata.normalize("NFKC", text).casefold()):
        if len(word) < 2 or word in COMMON_WORDS:
            continue
        out.add(word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word)
    return out


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
    return bool(text) and not text.startswith("#") and not text.startswith("(text removed here")


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


def lines_to_remove(text: str, forgotten: set[str]) -> set[str]:
    return {line_hash(line) for line in text.splitlines() if came_from(line, forgotten)}


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


def add_job(db: MemoryDB, ids: Sequence[int], sessions: Sequence[str], hashes: set[str], now: float) -> int:
    cur = db.conn.execute("INSERT INTO forget_jobs (created_at, observation_ids, sessions, line_hashes) "
                          "VALUES (?, ?, ?, ?)", (now, json.dumps(list(ids)), json.dumps(list(sessions)),
                                                  json.dumps(sorted(hashes))))
    return int(cur.lastrowid or 0)


def set_job_lines(db: MemoryDB, job_id: int, hashes: set[str]) -> None:
    """The job's lines, once decided (they replace the words' first guess)."""
    db.conn.execute("UPDATE forget_jobs SET line_hashes = ? WHERE id = ?", (json.dumps(sorted(hashes)), job_id))


def jobs(db: MemoryDB) -> list[Job]:
    found = db.conn.execute("SELECT id, created_at, observation_ids, sessions, line_hashes FROM forget_jobs "
                            "ORDER BY id").fetchall()
    return [Job(r[0], r[1], json.loads(r[2]), json.loads(r[3]), json.loads(r[4])) for r in found]


def hidden_lines(db: MemoryDB) -> set[str]:
    """The hashes of file lines a pending job will remove: the boot prompt leaves them out now."""
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


def backup_lines(layout: Layout, forgotten: set[str]) -> set[str]:
    found: set[str] = set()
    for path in _backup_files(layout):
        found |= lines_to_remove(path.read_text(encoding="utf-8", errors="replace"), forgotten)
    return found


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


Purge = Callable[[Sequence[int], Sequence[int]], Awaitable[None]]  # recall, without these turns and learnings
Embed = Callable[[Sequence[str]], Awaitable["np.ndarray | None"]]  # passages' unit vectors; None: no dense model
# For each line (its text; whether by meaning too, or by words alone), what the kept turns and
# learnings nearest to it say (recall's search, which no longer finds the forgotten ones).
KeptNear = Callable[[Sequence[tuple[str, bool]]], Awaitable[list[list[str]]]]
LINES_EMBEDDED_AT_ONCE = 64  # on the embedder's thread, between its other work
# Line vectors kept in memory between forgets (1.5 KiB each): embedding a line costs ~20 ms, and a
# person often forgets several turns one after the other while the person waits for each answer.
LINE_VECTORS_KEPT = 5_000
Apply = Callable[[Callable[[MemoryDB], Any]], Awaitable[Any]]  # MemoryDaemon.apply


@dataclass
class TurnForgetting:
    """Owns forgetting: the at-once part for whoever asks (the console), the file pass for the daemon."""

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
    # job id -> the turns' words and the lines already judged at the forget, in memory only
    _words: dict[int, tuple[set[str], set[str]]] = field(default_factory=dict)
    _line_vectors: dict[str, np.ndarray] = field(default_factory=dict)  # line hash -> its vector, in memory only
    _deciding: set[int] = field(default_factory=set)  # jobs whose lines are being decided: the pass waits

    async def forget(self, ids: Iterable[int], by: str) -> Forgotten:
        now = self.clock()
        wanted = list(ids)
        turns = await self.transcript.call(lambda t: t.forget(wanted, now, by))
        if not turns:
            return Forgotten([], 0, now)
        done = [o.id for o in turns]
        sessions = sorted({o.session_id for o in turns})
        purged = await self.apply(lambda m: purge_memory(m, turns))
        words: set[str] = set()
        for o in turns:  # the turns' own words: a learning may also name things from other turns
            words |= content_words(turn_text(o))
        candidates = await asyncio.to_thread(file_candidates, self.files)
        candidates.update(await self.memory.call(_batch_candidates))
        backups = await asyncio.to_thread(backup_lines, self.layout, words)
        # The words are gone from the transcript: the job goes on disk at once, with the lines the words
        # find, so that a forget cut short (a stop, a kill, an error in what follows) still takes those
        # out; the meaning's lines and the kept-turn check then decide the job's final lines.
        by_words = {h for h, text in candidates.items() if came_from(text, words)}
        job = await self.apply(lambda m: add_job(m, done, sessions, by_words | backups, now))
        self._deciding.add(job)
        try:
            await self.purge_recall(done, purged.learning_ids)  # recall's search finds only kept turns from here
            hashes = await self._found(by_words, [turn_text(o) for o in turns] + purged.contents, candidates)
            await self.apply(lambda m: set_job_lines(m, job, hashes | backups))
        finally:
            self._deciding.discard(job)
        self._words[job] = (words, set(candidates))
        log.info("turns_forgotten", turns=len(done), learnings=len(purged.learning_ids), lines=len(hashes), by=by)
        self.wake_daemon("forget")
        return Forgotten(turns, len(purged.learning_ids), now)

    async def rewrite_files(self) -> int:
        """The daemon's pass: each pending job's lines out of the files, their history, the batches'
        records and the backups. Returns the jobs done."""
        pending = [job for job in await self.memory.call(jobs) if job.id not in self._deciding]
        for job in pending:
            kept = self._words.pop(job.id, None)
            hashes = set(job.line_hashes)
            if kept is not None:  # lines written since the forget (a batch already under way), by their words
                words, judged = kept
                later = await asyncio.to_thread(file_candidates, self.files)
                later.update(await self.memory.call(_batch_candidates))
                hashes |= {h for h, text in later.items() if h not in judged and came_from(text, words)}
            note = REMOVED.format(day=utc(job.created_at, "%Y-%m-%d"))
            changed = await asyncio.to_thread(strip_files, self.files, hashes, note)
            await self.memory.call(lambda m, h=hashes: strip_batches(m, h))  # type: ignore[misc]
            backups = await asyncio.to_thread(purge_backups, self.layout, job.observation_ids, job.sessions, hashes,
                                              note)
            await self.memory.call(lambda m, j=job: finish_job(m, j, len(j.observation_ids), self.clock()))  # type: ignore[misc]
            log.info("forget_files_rewritten", job=job.id, files=changed, backups=backups)
        return len(pending)

    async def _vectors(self, texts: Sequence[str]) -> np.ndarray | None:
        if self.embed is None or not texts:
            return None
        try:
            step = LINES_EMBEDDED_AT_ONCE
            parts = [await self.embed(texts[i:i + step]) for i in range(0, len(texts), step)]
        except Exception as exc:  # the model failed: the words still find what they find
            log.error("forget_embedding_failed", error=type(exc).__name__)
            return None
        if any(p is None for p in parts):
            return None
        return np.concatenate([p for p in parts if p is not None])

    async def _found(self, by_words: set[str], anchor_texts: Sequence[str], candidates: dict[str, str]) -> set[str]:
        """The candidate lines (hash: text) that came from the forgotten turns: most of their words are
        the turns' (`by_words`, found by `came_from`), or, with the dense retriever, the curator reworded them (close to the
        turns and their learnings, `anchor_texts`, and closer to them than to what is kept: `reworded`);
        and no kept turn or learning near the line says it as well (`kept_holds`)."""
        scored = await self._scored(list(candidates.items()), anchor_texts)
        check = [h for h in candidates if h in by_words or (h in scored and scored[h][0] >= DENSE_THRESHOLD)]
        if not check:
            return set()
        near = await self._kept_near([(candidates[h], h not in by_words) for h in check])
        if near is None:  # the search failed: the words' lines go as the words say, the meaning's stay
            return by_words
        to_kept = await self._kept_scores(near, np.stack([scored[h][1] for h in check])) if scored \
            else [-1.0] * len(check)
        out = set()
        for h, found, kept in zip(check, near, to_kept, strict=True):
            came = h in by_words or (h in scored and reworded(scored[h][0], kept))
            if came and not kept_holds(candidates[h], found):
                out.add(h)
        for h in out:  # they leave every file: no forget needs them again
            self._line_vectors.pop(h, None)
        log.info("forget_lines_found", candidates=len(candidates), checked=len(check), by_words=len(by_words),
                 found=len(out))
        return out

    async def _scored(self, todo: list[tuple[str, str]], anchor_texts: Sequence[str]
                      ) -> dict[str, tuple[float, np.ndarray]]:
        """With the dense retriever, each line of `todo` (hash, text): its cosine to the nearest anchor
        and its vector; without it (or when it fails), nothing."""
        anchors = await self._vectors(anchor_texts) if todo else None
        if anchors is None:
            return {}
        known = self._line_vectors
        new = [(h, text) for h, text in todo if h not in known]
        fresh = await self._vectors([text for _, text in new]) if new else np.zeros((0, anchors.shape[1]))
        if fresh is None:
            return {}
        found = {h: fresh[i] for i, (h, _) in enumerate(new)}
        vectors = np.stack([found[h] if h in found else known[h] for h, _ in todo]).astype(np.float32)
        if len(known) + len(found) > LINE_VECTORS_KEPT:
            known.clear()
        if len(found) <= LINE_VECTORS_KEPT:
            known.update(found)
        scores = nearest(anchors, vectors)
        return {h: (scores[i], vectors[i]) for i, (h, _) in enumerate(todo)}

    async def _kept_near(self, lines: Sequence[tuple[str, bool]]) -> list[list[str]] | None:
        if self.kept_near is None:
            return [[] for _ in lines]
        try:
            return await self.kept_near(lines)
        except Exception as exc:
            log.error("forget_kept_search_failed", error=type(exc).__name__)
            return None

    async def _kept_scores(self, near: Sequence[Sequence[str]], vectors: np.ndarray) -> list[float]:
        """Each line's cosine to the nearest of the kept turns and learnings found for it (`near`); +1
        when they can't be embedded (precision first: a line that can't be checked stays)."""
        texts = [text for found in near for text in found]
        kept = await self._vectors(texts) if texts else np.zeros((0, vectors.shape[1]), dtype=np.float32)
        if kept is None:
            return [1.0] * len(near)
        out, at = [], 0
        for i, found in enumerate(near):
            out.append(nearest(kept[at:at + len(found)], vectors[i:i + 1])[0])
            at += len(found)
        return out


def _batch_candidates(db: MemoryDB) -> dict[str, str]:
    out: dict[str, str] = {}
    for (updates,) in db.conn.execute("SELECT file_updates FROM batches WHERE file_updates != '{}'"):
        with contextlib.suppress(ValueError, TypeError):
            for text in json.loads(updates).values():
                out.update((line_hash(line), line.strip()) for line in text.splitlines() if meaningful(line))
    return out

