"""Workspaces for the recall benchmark, built through Sprite OS's own code and cached in bench/results/cache/recall/.

- small: the generated benchmark (generate.py) imported with `memory import`'s code into
  transcript.db, then `memory rebuild --index`'s code: episodes, the tantivy index, the
  embeddings in the vector store (each turn's vector cached by what it depends on: embedding
  thousands of turns takes minutes).
- scale: N filler turns and N filler learnings (generate.py) written straight into memory.db,
  with the benchmark's turns added as the OLDEST rows (ids below the filler's) or the NEWEST
  (ids above); the same questions are asked of both. The filler is built once and copied.
"""

from __future__ import annotations

import functools
import hashlib
import io
import itertools
import json
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.recall import dialogue, generate
from sprite_os.config import Settings
from sprite_os.memory.importer import ReadReport, apply, chunks, read_turns
from sprite_os.memory.memory_store import MemoryDB, content_key
from sprite_os.memory.recall import episodes as ep
from sprite_os.memory.recall.dense import model_name
from sprite_os.memory.recall.documents import build as build_index
from sprite_os.memory.recall.documents import write_marks
from sprite_os.memory.recall.rebuild import rebuild_recall
from sprite_os.memory.recall.service import index_path, vectors_path
from sprite_os.memory.recall.vectors import VectorReader, VectorWriter
from sprite_os.memory.transcript_store import TranscriptDB

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "bench" / "results" / "cache" / "recall"
FILLER_START = datetime(2019, 1, 1, tzinfo=UTC)
FILLER_END = datetime(2027, 1, 1, tzinfo=UTC)
FILLER_BASE = 100_000  # filler episode ids start here: the oldest placement's benchmark fits below
NEW_BASE = 100_000_000  # the newest placement's benchmark starts here
SEED = 7
DIALOGUE_SEED = 11
# The dialogue benchmark's ten eras: one person's five years of talk, one memory (the headline:
# each era's questions asked of the turns before them); and the two groups of five eras (two and a
# half years each) the figures were measured on before, kept as labelled rows.
DIALOGUE_ERAS = tuple(range(10))
DIALOGUE_GROUPS = ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9))
MODEL = model_name(None)  # the bundled model and what of a turn it embeds, as the server names its vectors
LAYOUT = "store"  # vectors in .os/memory/vectors/ (a workspace cached before kept them in memory.db)


def settings_for(path: Path, **overrides: object) -> Settings:
    return Settings(workspace=path, **overrides)  # type: ignore[arg-type]


Benchmark = tuple[list[generate.Turn], list[generate.Question]]


def benchmark(conversations: int | None = None) -> Benchmark:
    return _first(generate.benchmark(SEED), conversations, "c")


def _first(made: Benchmark, conversations: int | None, prefix: str) -> Benchmark:
    """The first `conversations` conversations of a benchmark (all of them: None)."""
    turns, questions = made
    if conversations is not None:
        keep = {f"{prefix}{c}-" for c in range(conversations)}
        turns = [t for t in turns if t.session[:3] in keep]
        questions = [q for q in questions if q.conversation < conversations]
    return turns, questions


def progress(what: str, done: int, of: int) -> None:
    print(f"  recall bench: {what} {done:,}/{of:,}", file=sys.stderr, flush=True)


def small(conversations: int | None = None) -> tuple[Settings, list[generate.Question], dict[tuple[str, int], int]]:
    """The benchmark as a workspace; returns its settings, the questions and each turn's episode id."""
    turns, questions = benchmark(conversations)
    settings, ids = workspace(f"small-{conversations or 'all'}", turns)
    return settings, questions, ids


@functools.cache  # seeded, so the same every call, and 1.5 s to make: each moment's workspace reads it
def dialogue_benchmark() -> Benchmark:
    """The dialogue benchmark's turns and questions (shared between callers: read them, don't change them)."""
    return dialogue.benchmark(DIALOGUE_SEED)


def dialogue_workspace(eras: Sequence[int]) -> tuple[Settings, list[generate.Question], dict[tuple[str, int], int],
                                                    list[generate.Turn]]:
    """The dialogue benchmark's `eras` (dialogue.py) as one workspace: its settings, questions, each
    turn's episode id, and the turns."""
    turns, questions = dialogue_benchmark()
    keep = {f"d{c}-" for c in eras}
    turns = [t for t in turns if t.session[:3] in keep]
    settings, ids = workspace(f"dialogue-{'-'.join(map(str, eras))}", turns)
    return settings, [q for q in questions if q.conversation in eras], ids, turns


Moment = tuple[Settings, list[generate.Question], dict[tuple[str, int], int], list[generate.Turn]]


def dialogue_moments(eras: Sequence[int]) -> list[Moment]:
    """The dialogue benchmark's `eras` as the memory was when each era's questions are asked: for each
    era, a workspace of the turns (of `eras`) dated before its questions' `asked_at`, and those questions.
    No one's memory holds the turns after a question (they are more distractors: other people's facts
    and chatter; every fact is unique, dialogue.py `_key`), and a word's rarity is the rarity it had
    then, so the memory is cut, not the hits.
    The turns are in time order, so each is a prefix of the whole workspace's: the same episode ids,
    each turn's vector from the cache (the workspace whose prefix is all of them is the whole one)."""
    turns, questions = dialogue_benchmark()
    keep = {f"d{c}-" for c in eras}
    turns = [t for t in turns if t.session[:3] in keep]
    assert all(a.timestamp < b.timestamp for a, b in itertools.pairwise(turns)), "turns out of time order"
    out: list[Moment] = []
    for era in eras:
        asked = [q for q in questions if q.conversation == era]
        moment = {q.asked_at for q in asked}
        assert len(moment) == 1, f"era {era}: questions asked at {len(moment)} moments"
        at = moment.pop()
        then = [t for t in turns if t.timestamp < at]
        settings, ids = workspace(f"dialogue-{'-'.join(map(str, eras))}", then)
        out.append((settings, asked, ids, then))
    return out


def workspace(name: str, turns: Sequence[generate.Turn]) -> tuple[Settings, dict[tuple[str, int], int]]:
    """`turns` imported into a workspace of their own with `memory import`'s code, then indexed and embedded
    with `memory rebuild --index`'s; cached (by name, layout and content) under CACHE, each turn's vector too."""
    digest = hashlib.sha256("\n".join([LAYOUT, MODEL, *(f"{t.session}|{t.turn}|{t.timestamp}|{t.user}|{t.assistant}"
                                                       for t in turns)]).encode()).hexdigest()[:8]
    path = CACHE / f"{name}-{digest}"
    settings = settings_for(path)
    if not (path / "built").exists():
        shutil.rmtree(path, ignore_errors=True)
        settings.layout.ensure()
        transcript = TranscriptDB(settings.layout.transcript_db)
        read = ReadReport()
        made = apply(transcript, read_turns(io.StringIO("".join(json.dumps(asdict(t)) + "\n" for t in turns)), read,
                                            now=max(t.timestamp for t in turns) + 1))
        transcript.close()
        assert not read.bad and made.added == len(turns), (read.bad[:3], made)  # ids 1..n, in order
        _vectors_from_cache(settings, turns)
        rebuild_recall(settings, progress)
        _vectors_to_cache(settings, turns)
        (path / "built").write_text("ok\n")
    ids = {(t.session, t.turn): i for i, t in enumerate(turns, 1)}
    return settings, ids


VECTORS = CACHE / f"vectors-{hashlib.sha256(MODEL.encode()).hexdigest()[:8]}.npz"


def turn_keys(turns: Sequence[generate.Turn]) -> list[str]:
    """What each turn's vector depends on (the turn, and the one before it in its session)."""
    keys = []
    for i, t in enumerate(turns):
        before = turns[i - 1].user if i and turns[i - 1].session == t.session else ""
        keys.append(hashlib.sha256(f"{t.session}|{t.turn}|{before}|{t.user}|{t.assistant}".encode()).hexdigest()[:20])
    return keys


def _cached_vectors() -> dict[str, np.ndarray]:
    if not VECTORS.exists():
        return {}
    with np.load(VECTORS) as saved:
        return dict(zip(saved["keys"].tolist(), saved["vectors"], strict=True))


def _vectors_from_cache(settings: Settings, turns: Sequence[generate.Turn]) -> None:
    """The vectors an earlier run computed for the same turns (ids 1..n, in order), into the store."""
    cached = _cached_vectors()
    found = [(i, cached[k]) for i, k in enumerate(turn_keys(turns), 1) if k in cached]
    if not found:
        return
    transcript = TranscriptDB(settings.layout.transcript_db)
    at = [o.timestamp for o in transcript.after(0, len(turns))]
    transcript.close()
    writer = VectorWriter(vectors_path(settings.layout.memory_dir, MODEL), MODEL)
    writer.add([i for i, _ in found], [at[i - 1] for i, _ in found], np.stack([v for _, v in found]))
    writer.close()


def _vectors_to_cache(settings: Settings, turns: Sequence[generate.Turn]) -> None:
    reader = VectorReader(vectors_path(settings.layout.memory_dir, MODEL))
    ids = list(range(1, len(turns) + 1))
    present = [i for i, has in zip(ids, reader.has(ids), strict=True) if has]
    found = dict(zip(present, reader.matrix(present), strict=True)) if present else {}
    cached = _cached_vectors()
    cached.update({k: found[i] for i, k in enumerate(turn_keys(turns), 1) if i in found})
    keys = sorted(cached)
    tmp = VECTORS.with_suffix(".partial.npz")
    np.savez(tmp, keys=np.array(keys), vectors=np.stack([cached[k] for k in keys]))
    tmp.rename(VECTORS)


# ---------------------------------------------------------------- 1M + 1M


def _filler_episodes(n: int) -> Iterator[ep.Episode]:
    for i, t in enumerate(generate.filler_sessions(n, 11, FILLER_START, FILLER_END)):
        yield ep.Episode(FILLER_BASE + i, t.session, t.turn, t.timestamp, f"{t.user}\n{t.assistant}")


def filler(n: int) -> Path:
    path = CACHE / f"filler-{n}.db"
    if path.exists():
        return path
    tmp = path.with_suffix(".partial")
    tmp.unlink(missing_ok=True)
    memory = MemoryDB(tmp)
    done = 0
    for chunk in chunks(_filler_episodes(n), 20_000):
        ep.add(memory.conn, chunk)
        done += len(chunk)
        if done % 200_000 < len(chunk):
            progress("filler turns", done, n)
    span = FILLER_END.timestamp() - FILLER_START.timestamp()
    rows = ((FILLER_START.timestamp() + span * i / n, kind, content, content_key(f"{i} {content}"))
            for i, (kind, content) in enumerate(generate.filler_learnings(n, 12)))
    memory.conn.execute("BEGIN")
    memory.conn.executemany("INSERT INTO learnings (created_at, type, content, content_key, confidence) "
                            "VALUES (?, ?, ?, ?, 0.8)", rows)
    memory.conn.execute("COMMIT")
    memory.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    memory.close()
    tmp.rename(path)
    return path


def scale(n: int, where: str) -> tuple[Settings, dict[tuple[str, int], int], float]:
    """The benchmark among n filler turns and n learnings, placed oldest ("old") or newest ("new").
    Returns the workspace, each benchmark turn's episode id, and the seconds the index took to build."""
    turns, _ = benchmark()
    first = 1 if where == "old" else NEW_BASE
    ids = {(t.session, t.turn): first + i for i, t in enumerate(turns)}
    path = CACHE / f"scale-{where}-{n}"
    settings = settings_for(path)
    built = path / "built"
    if not built.exists():
        shutil.rmtree(path, ignore_errors=True)
        settings.layout.ensure()
        shutil.copyfile(filler(n), settings.layout.memory_db)
        memory = MemoryDB(settings.layout.memory_db)
        ep.add(memory.conn, [ep.Episode(ids[(t.session, t.turn)], t.session, t.turn, t.timestamp,
                                        f"{t.user}\n{t.assistant}") for t in turns])
        import time

        started = time.perf_counter()
        reached = build_index(memory.conn, index_path(settings.layout.memory_dir), progress)
        seconds = time.perf_counter() - started
        write_marks(memory.conn, reached)
        memory.close()
        built.write_text(f"{seconds:.1f}\n")
    return settings, ids, float(built.read_text())
