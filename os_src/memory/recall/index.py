"""The recall index: episodes and learnings in one tantivy index, ranked by BM25 over all of it.

Derived data, in `.os/memory/index/` beside memory.db (the record: text, sources, dates);
`memory rebuild` writes a new one from memory.db and swaps it in. It holds only what ranking
needs: `id` (an episode's observation id, or LEARNING_OFFSET + a learning's id), `kind`,
`at` (epoch seconds), `text` (the turn, or the learning) and `context` (an episode's
neighbours, two turns either side, at boost 0.5), both English-stemmed. Nothing but id,
kind and at is stored.

Why tantivy, not FTS5 (docs/memory.md has the figures): FTS5's exact bm25() costs time per
matching row, about 100-270 ms a query at a million rows, and capping the rows it reads (as
memory search used to) made old memories unfindable: 5% of the oldest found against 51% of
the newest. tantivy keeps document frequencies in its term dictionary, so exact BM25 over 2M
documents takes a few milliseconds, whatever a memory's age, for a question of words few documents
hold. (tantivy-py's `search` collects through a MultiCollector, which tantivy never prunes for:
each word's whole posting list is read, so in a large index the words most documents hold only
re-score what the others find: common_words.py, approximate at the edge of what they find.)

One writer at a time (tantivy locks the directory): the server's indexer, or a rebuild while
the server is stopped. Any number of readers, in any process, see each commit at their next search
(`searcher` reloads when meta.json has changed).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tantivy

from ...logs import get_logger
from . import common_words

log = get_logger(__name__)

LEARNING_OFFSET = 1 << 40
CONTEXT_BOOST = 0.5
WINDOW_SCORE = 1.0  # what a match inside the period asked about gains (tantivy's range query gave it 1.0)
WRITER_HEAP = 64_000_000
Kind = Literal["episode", "learning"]
FastValue = int | float | bool | None  # what tantivy reads from a fast field


@dataclass(frozen=True)
class IndexHit:
    kind: Kind
    id: int
    score: float  # BM25
    at: float


@dataclass(frozen=True)
class Window:
    start: float
    end: float


def schema() -> tantivy.Schema:
    b = tantivy.SchemaBuilder()
    b.add_text_field("text", stored=False, tokenizer_name="en_stem")
    b.add_text_field("context", stored=False, tokenizer_name="en_stem")
    b.add_text_field("kind", stored=True, tokenizer_name="raw")
    b.add_integer_field("id", stored=True, indexed=True, fast=True)
    b.add_float_field("at", stored=True, indexed=True, fast=True)
    return b.build()


def doc_id(kind: Kind, item_id: int) -> int:
    return item_id + LEARNING_OFFSET if kind == "learning" else item_id


def episode_doc(obs_id: int, at: float, text: str, context: str) -> tantivy.Document:
    return tantivy.Document(id=obs_id, kind="episode", at=at, text=text, context=context)


def learning_doc(learning_id: int, at: float, content: str) -> tantivy.Document:
    return tantivy.Document(id=doc_id("learning", learning_id), kind="learning", at=at, text=content, context="")


def analyzer() -> tantivy.TextAnalyzer:
    """The index's `en_stem`: simple tokens, long ones dropped, lowercased, English-stemmed."""
    return (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple()).filter(tantivy.Filter.remove_long(40))
            .filter(tantivy.Filter.lowercase()).filter(tantivy.Filter.stemmer("english")).build())


def exists(path: Path) -> bool:
    return (path / "meta.json").exists()


class RecallIndex:
    """One index directory: searched by anyone, written by its one owner (`writable`)."""

    def __init__(self, path: Path, writable: bool = False) -> None:
        self.path = path
        if writable:
            path.mkdir(parents=True, exist_ok=True)
            self.index = tantivy.Index(schema(), path=str(path))
        else:
            self.index = tantivy.Index.open(str(path))
        self._writer: tantivy.IndexWriter | None = None
        self._writable = writable
        self._analyze = analyzer()
        self.split_from = common_words.SPLIT_FROM  # the benchmark sets it out of reach to measure exact search
        self._meta = b""  # meta.json as the searcher below last saw it
        self._searcher: tantivy.Searcher | None = None
        self._reloading = threading.Lock()  # the server's indexer commits on one thread, searches run on another
        self._counted: tuple[tantivy.Searcher, int | None] | None = None  # the documents BM25 counts, by searcher

    def _w(self) -> tantivy.IndexWriter:
        if not self._writable:
            raise PermissionError("this recall index was opened to read")
        if self._writer is None:
            self._writer = self.index.writer(heap_size=WRITER_HEAP, num_threads=1)
        return self._writer

    def put(self, docs: Iterable[tantivy.Document], replace: Iterable[int] = ()) -> None:
        """Stage documents, first deleting those with ids in `replace` (a document is replaced whole);
        visible to readers after `commit`."""
        writer = self._w()
        for item in replace:
            writer.delete_documents_by_term("id", item)
        for doc in docs:
            writer.add_document(doc)

    def commit(self) -> None:
        self._w().commit()
        self.searcher()

    def clear(self) -> None:
        """Stage the deletion of every document (visible after `commit`)."""
        self._w().delete_all_documents()

    def collect_garbage(self) -> None:
        """Delete the files of segments the last commit no longer uses."""
        self._w().garbage_collect_files()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.wait_merging_threads()  # also releases the directory's lock
            self._writer = None

    def searcher(self) -> tantivy.Searcher:
        """The index as its last commit left it: one searcher object, the same until a commit (this
        process's or another's) changes meta.json, then a new one. What is kept about the index (the
        document count BM25 scores by, rarity's frequencies) is kept for the searcher it was read from
        (`is`): tantivy's own reload follows a commit up to half a second late, and a count (live
        documents) can stay the same when the index does not (a forget then a capture)."""
        meta = (self.path / "meta.json").read_bytes()
        with self._reloading:
            if meta != self._meta or self._searcher is None:
                self.index.reload()  # at least as new as `meta`: a newer commit shows as a change next time
                self._meta, self._searcher = meta, self.index.searcher()
            return self._searcher

    @property
    def documents(self) -> int:
        return int(self.searcher().num_docs)

    def search(self, words: Sequence[str], limit: int, window: Window | None = None) -> list[IndexHit]:
        """The best `limit` documents for `words` by BM25 (text, plus context at half weight); with a
        `window`, those dated inside it first, then the other matches, then (for a question such as
        "what happened in March?") other documents of the window. `words` must be plain lowercase
        word characters (search.search_terms makes them so): no query syntax reaches the parser."""
        if limit <= 0 or (not words and window is None):
            return []
        searcher = self.searcher()
        # which words are common is the same for every part below: looked up once
        split = common_words.split(words, lambda w: self.frequencies(searcher, w), int(searcher.num_docs),
                                   self.split_from) if words else None
        if window is None:
            return self._best(searcher, words, split, limit)
        inside = tantivy.Query.range_query(self.index.schema, "at", tantivy.FieldType.Float, window.start,
                                           window.end)
        out: list[IndexHit] = []
        seen: set[tuple[str, int]] = set()
        parts: list[Callable[[], list[IndexHit]]] = [lambda: _run(searcher, inside, limit)]
        if words:
            parts = [lambda: self._best(searcher, words, split, limit, inside),
                     lambda: self._best(searcher, words, split, limit), *parts]
        for part in parts:
            if len(out) >= limit:
                break
            for h in part():
                if (h.kind, h.id) not in seen:
                    seen.add((h.kind, h.id))
                    out.append(h)
        return out[:limit]

    def _best(self, searcher: tantivy.Searcher, words: Sequence[str], split: common_words.Split | None,
              limit: int, within: tantivy.Query | None = None) -> list[IndexHit]:
        """The best `limit` documents for `words` by BM25 (among those `within` matches, if given): with a
        `split` (a large index, some words common), what the words few documents hold find, re-scored by
        the common ones (common_words.py: exact but at the edge of what the others find)."""
        if split is not None and (best := self._rescored(searcher, split, limit, within)) is not None:
            return best
        return _run(searcher, _within(self.query_of(words), within), limit)

    def _rescored(self, searcher: tantivy.Searcher, split: common_words.Split, limit: int,
                  within: tantivy.Query | None) -> list[IndexHit] | None:
        """What the rare words find, re-scored by the common ones; None when the whole query must run."""
        rare = _within(self.query_of(split.rare), within)
        found = searcher.search(rare, common_words.rescored(limit), count=False).hits
        counted = self._bm25_documents(searcher, rare, found[0][1]) if found else None
        if counted is None:
            return None
        address = {_key(a): a for _, a in found}
        ids = dict(zip(address, searcher.fast_field_values("id", list(address.values())), strict=True))
        extra = self._common_scores(searcher, list(ids.values()), split.common)
        # a document inside `within` that the rare words did not find has its WINDOW_SCORE too
        bound = split.bound(counted, CONTEXT_BOOST) + (WINDOW_SCORE if within is not None else 0.0)
        best = common_words.merged(list(zip((s for s, _ in found), address, strict=True)), extra, limit, bound)
        if best is None:
            return None
        return _hits(searcher, [(score, address[key]) for score, key in best], [ids[key] for _, key in best])

    def _common_scores(self, searcher: tantivy.Searcher, ids: Sequence[FastValue], common: Sequence[str]
                       ) -> dict[tuple[int, int], float]:
        """What `common` adds to the score of each document of `ids` (at most a few hundred, their `id`s;
        the scores by their `_key`), as the whole query adds it: the union of its term clauses, each clause intersected with
        the documents' ids first (the same sum, in the same order, to the bit). The clauses' union
        intersected with the ids scores each clause's postings a block of 4,096 documents at a time around
        each document, and the ids as a term set cost more than the rest together: three times the CPU."""
        schema = self.index.schema
        only = tantivy.Query.const_score_query(tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "id", i)) for i in ids]), 0.0)
        terms = [self._analyze.analyze(word) for word in common]
        if any(len(t) != 1 for t in terms):  # a word the parser makes a phrase of: its parsed query
            query = tantivy.Query.boolean_query([(tantivy.Occur.Must, only),
                                                 (tantivy.Occur.Should, self.query_of(common))])
        else:
            clauses = []
            for (term,) in terms:  # query_of's clauses, in its order
                clauses.append(tantivy.Query.term_query(schema, "text", term))
                clauses.append(tantivy.Query.boost_query(tantivy.Query.term_query(schema, "context", term),
                                                         CONTEXT_BOOST))
            query = tantivy.Query.boolean_query([(tantivy.Occur.Should, tantivy.Query.boolean_query(
                [(tantivy.Occur.Must, only), (tantivy.Occur.Must, clause)])) for clause in clauses])
        return {_key(a): score for score, a in searcher.search(query, len(ids), count=False).hits}

    def _bm25_documents(self, searcher: tantivy.Searcher, query: tantivy.Query, matched: tantivy.DocAddress
                        ) -> int | None:
        """`bm25_documents`, asked once per searcher (once per change of the index: `searcher`)."""
        if self._counted is None or self._counted[0] is not searcher:
            self._counted = (searcher, bm25_documents(searcher, query, matched))
        return self._counted[1]

    def frequencies(self, searcher: tantivy.Searcher, word: str) -> list[tuple[int, int]]:
        """How many documents hold each of `word`'s index terms, in `text` and in `context`."""
        return [(int(searcher.doc_freq("text", t)), int(searcher.doc_freq("context", t)))
                for t in self._analyze.analyze(word)]

    def query_of(self, words: Sequence[str]) -> tantivy.Query:
        """Any of `words`, in `text`, and in `context` at half weight."""
        return self.index.parse_query(" ".join(words), ["text", "context"],
                                      field_boosts={"text": 1.0, "context": CONTEXT_BOOST})


def _within(query: tantivy.Query, within: tantivy.Query | None) -> tantivy.Query:
    """`query`'s matches inside `within`, each WINDOW_SCORE above its BM25."""
    if within is None:
        return query
    inside = tantivy.Query.const_score_query(within, WINDOW_SCORE)
    return tantivy.Query.boolean_query([(tantivy.Occur.Must, query), (tantivy.Occur.Must, inside)])


def bm25_documents(searcher: tantivy.Searcher, query: tantivy.Query, matched: tantivy.DocAddress) -> int | None:
    """The documents BM25 counts, as `query`'s scoring of a document it matched says: every document of
    every segment, deleted ones not yet merged away too (`num_docs` leaves those out, and an IDF taken
    with it is lower than the index's own). None if the explanation does not say."""
    def find(node: dict[str, Any]) -> int | None:
        if str(node.get("description", "")).startswith("N, total number of docs"):
            return int(node["value"])
        return next((n for n in map(find, node.get("details", [])) if n is not None), None)

    counted = find(json.loads(query.explain(searcher, matched).to_json()))
    global _warned
    if counted is None and not _warned:
        _warned = True
        log.warning("recall_index_count_unknown", why="tantivy's explanation no longer names N: every "
                    "posting of a common word is read again (common_words.py)")
    return counted


_warned = False  # the warning above, once a process


def _key(address: tantivy.DocAddress) -> tuple[int, int]:
    return address.segment_ord, address.doc


def _run(searcher: tantivy.Searcher, query: tantivy.Query, limit: int) -> list[IndexHit]:
    return _hits(searcher, searcher.search(query, limit, count=False).hits)


def _hits(searcher: tantivy.Searcher, found: Sequence[tuple[float, tantivy.DocAddress]],
          ids: Sequence[FastValue] | None = None) -> list[IndexHit]:
    """Each hit's id and date, from the fast fields (no stored document is read); `ids`: theirs, when
    already read."""
    addresses = [a for _, a in found]
    if ids is None:
        ids = searcher.fast_field_values("id", addresses)
    ats = searcher.fast_field_values("at", addresses)
    out = []
    for (score, _), item, at in zip(found, ids, ats, strict=True):
        if not isinstance(item, int) or at is None:  # every segment of this schema has both columns
            raise ValueError("the recall index has a segment without its id or date column: rebuild it "
                             "(`sprite-os memory rebuild --index --yes` with the server stopped)")
        if item >= LEARNING_OFFSET:
            out.append(IndexHit("learning", item - LEARNING_OFFSET, float(score), float(at)))
        else:
            out.append(IndexHit("episode", item, float(score), float(at)))
    return out


def building(current: Path) -> Path:
    """Where `memory rebuild --index` builds the index that `swap_in` makes `current`."""
    return current.with_name(current.name + ".new")


def set_aside(current: Path) -> Path:
    """Where `swap_in` moves `current` while the index built beside it takes its place."""
    return current.with_name(current.name + ".old")


def sweep_swap_leftovers(current: Path) -> list[Path]:
    """What a `memory rebuild --index` killed mid-way left beside `current` (the index it was building, the one it
    had set aside to swap in the new): removed, for the one holding the writer lock (no rebuild runs). With no
    `current` left (killed between the two renames), the start makes the index anew from memory.db. One that can't
    be removed (an I/O error, a file or a link where a folder was) stays, logged (`index_leftover_unremoved`):
    tidying never stops the start (it did, at every start, until an operator came)."""
    removed = []
    for leftover in (building(current), set_aside(current)):
        try:
            if leftover.is_symlink() or leftover.is_file():
                leftover.unlink()
            elif leftover.exists():
                shutil.rmtree(leftover)
            else:
                continue
        except OSError as exc:
            log.warning("index_leftover_unremoved", path=f"{current.parent.name}/{leftover.name}",
                        error=repr(exc)[:200])
            continue
        removed.append(leftover)
    return removed


def swap_in(new: Path, current: Path) -> None:
    """Make the index built at `new` the current one (a rename each; the old one is removed)."""
    old = set_aside(current)
    shutil.rmtree(old, ignore_errors=True)
    if current.exists():
        current.rename(old)
    new.rename(current)
    shutil.rmtree(old, ignore_errors=True)
