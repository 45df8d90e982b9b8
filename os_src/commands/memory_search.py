"""`sprite-os memory search`: the agent's search, from a shell, as text or JSON, one query or thousands.

It opens the workspace's memory read-only (memory.db, the recall index and, unless
--lexical, the embedding model and the vector store, mapped: nothing is loaded), so it works
while the server runs: each commit of the server's indexer and embedder is visible to it. `-` as the query reads one query a
line from stdin and answers each, in order, with one JSON line: the model and the vectors
load once for all of them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable
from typing import Any, TextIO

from ..config import Settings
from ..database import on_read_only_disk
from ..dates import usable
from ..memory.files import MemoryFiles
from ..memory.loader import boot_prompt_now
from ..memory.memory_store import MemoryDB
from ..memory.recall import auto
from ..memory.recall.dense import load
from ..memory.recall.index import RecallIndex, exists
from ..memory.recall.learnings import clamp_limit
from ..memory.recall.searcher import Dense, RecallHit, Searcher
from ..memory.recall.service import auto_recalled, index_path, read_connection, vectors_path
from ..memory.recall.vectors import VectorReader
from ..memory.transcript_store import TranscriptDB
from ..text import utc


def open_searcher(settings: Settings, lexical: bool = False) -> Searcher:
    path = index_path(settings.layout.memory_dir)
    if not exists(path):
        print(f"sprite-os: no recall index at {path} yet (start the server once, or run `sprite-os memory "
              "rebuild --index --yes` with it stopped): searching learnings only", file=sys.stderr)
        return learnings_only(settings)
    if on_read_only_disk(path / "meta.json"):  # tantivy's open takes a lock file beside the index
        print(f"sprite-os: the recall index at {path} is on a disk that can't be written, and opening it needs "
              "to: searching learnings only", file=sys.stderr)
        return learnings_only(settings)
    conn = read_connection(settings.layout.memory_db)
    dense = None
    if not lexical and settings.recall_dense_weight > 0:
        embedder, status = load(settings.embedding_model)
        if embedder is not None and status.model is not None:
            reader = VectorReader(vectors_path(settings.layout.memory_dir, status.model))
            dense = Dense(embedder, reader, settings.recall_dense_weight)
        else:
            print(f"sprite-os: meaning unavailable, lexical search only: {status.detail}", file=sys.stderr)
    return Searcher(conn, RecallIndex(path), dense)


def learnings_only(settings: Settings) -> Searcher:
    return Searcher(MemoryDB(settings.layout.memory_db, reading=True).conn, None)


def as_json(hit: RecallHit) -> dict[str, Any]:
    return {
        "kind": hit.kind, "id": hit.id, "type": hit.type, "score": round(hit.score, 6),
        "date": utc(hit.at, "%Y-%m-%dT%H:%M:%SZ"),
        "at": hit.at if usable(hit.at) else None,  # JSON has no NaN or infinity
        "source": {"session": hit.session_id, "turn": hit.turn, "observation_id": hit.observation_id},
        "snippet": hit.snippet,
    }


def search_main(settings: Settings, query: str, limit: int, as_json_: bool, lexical: bool,
                stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    searcher = open_searcher(settings, lexical)
    n = clamp_limit(limit)
    if query == "-":
        _many(searcher, stdin or sys.stdin, n, out)
        return 0
    hits = searcher.search(query, time.time(), n)
    if as_json_:
        out.write(json.dumps({"query": query, "hits": [as_json(h) for h in hits]}, ensure_ascii=False) + "\n")
    else:
        from ..tools.memory_search import render

        out.write(render(query, hits) + "\n")
    return 0


def _many(searcher: Searcher, lines: Iterable[str], limit: int, out: TextIO) -> None:
    """A line is a query, or a JSON object {"query": ..., "now": epoch seconds} to search as of then
    (an evaluation's question asked in the past: "last spring" is read from `now`)."""
    for line in lines:
        query, now, _ = _line(line, "query")
        hits = searcher.search(query, now, limit) if query.strip() else []
        out.write(json.dumps({"query": query, "hits": [as_json(h) for h in hits]}, ensure_ascii=False) + "\n")
        out.flush()


def _line(line: str, key: str) -> tuple[str, float, str | None]:
    """(text, now, session) from a line that is the text itself, or a JSON object {key: ..., "now":
    epoch seconds, "session": ...}."""
    text, now, session = line.rstrip("\n"), time.time(), None
    if text.startswith("{"):
        try:
            asked = json.loads(text)
            text, now = str(asked[key]), float(asked.get("now", now))
            session = str(asked["session"]) if asked.get("session") is not None else None
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # not such an object: taken as it is
    return text, now, session


def recall_main(settings: Settings, message: str, as_json_: bool, lexical: bool, session: str | None,
                stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """What auto-recall would send with each message, through the runtime's own path (service.auto_recalled),
    against the boot prompt a session starting now would have."""
    out = stdout or sys.stdout
    searcher = open_searcher(settings, lexical)
    memory = MemoryDB(settings.layout.memory_db, reading=True)
    transcript = TranscriptDB(settings.layout.transcript_db, reading=True)
    boot = auto.normalise(boot_prompt_now(MemoryFiles(settings.layout), memory, transcript, time.time()))
    memory.close()
    transcript.close()
    lines = stdin or sys.stdin if message == "-" else [json.dumps({"message": message, "session": session})]
    for line in lines:
        text, now, in_session = _line(line, "message")
        hits = auto_recalled(searcher, text, now, in_session or session, boot, settings.auto_recall_tokens) \
            if settings.auto_recall else []
        block = auto.render(hits) if hits else None
        if as_json_:
            out.write(json.dumps({"message": text, "enabled": settings.auto_recall, "block": block,
                                  "tokens": auto.tokens(hits), "hits": [as_json(h) for h in hits]},
                                 ensure_ascii=False) + "\n")
        else:
            out.write((block or "(nothing recalled: the message would go alone)") + "\n")
        out.flush()
    return 0
