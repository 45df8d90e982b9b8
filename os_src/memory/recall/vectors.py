"""The turns' vectors on disk, memory-mapped: compact, searched without loading them, shared by processes.

One directory per model (`.os/memory/vectors/<model>/`; the name also says what of a turn is
embedded, dense.model_name, so vectors made another way are made again, not mixed), written by the workspace's one
writer (the server's embedder, or `memory rebuild`), read by any number of searchers in any
process (the server's recall thread, `memory search`), which see each commit at their next
search. Columns, one file each, a record per embedded turn, in the order they were embedded:

    vectors.f16   384 float16: the unit vector (768 bytes; cosines to about 1e-3)
    ids.i64       the episode (the turn's id)       at.f64   its date
    bits.u64      a 1,024-bit sketch (128 bytes), in blocks of BLOCK records stored word by word
    basis.npy     the sketch's centre and projection, fixed once BASIS_FROM vectors exist
    forgotten.i64 turns a person forgot: (episode, its record or -1) pairs; their records' vector
                  and sketch are zeros, readers skip them, and the writer never adds them again
    meta.json     how many records (and forgotten pairs) are committed (written last, atomically:
                  a torn tail is ignored)

So a turn costs about 0.9 KB on disk (it was 4.1 KB in memory.db: a 1.5 KB blob alone in each
4 KB page, from inserting newest first), a search process starts by mapping the files
(no load), and a search reads the sketches (128 MB at a million) and a few thousand vectors,
never the whole matrix.

The search: up to RESCORE records, every record is scored exactly. Above that, the sketch
chooses RESCORE candidates by Hamming distance and those are scored exactly. A search within a
period (a question that names one) keeps only the records dated in it first, by the dates column. The sketch is
the sign of a random projection of the vector minus the mean of the first vectors: raw sign
bits of an embedding model's vectors carry little (they crowd around one direction: the
model's cosines sit between 0.80 and 0.87), centred and projected they keep the angles
between them. How often this finds the exact top 10 is measured (bench/vectors.py,
docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ...fsutil import atomic_write, sweep_temp_files

DIM = 384
BITS = 1024
WORDS = BITS // 64
BLOCK = 16_384  # records per block of the sketch file (2 MB)
BASIS_FROM = 1_000  # vectors whose mean centres the sketch
RESCORE = 4_000  # candidates scored exactly
SEED = 20_251_126  # of the projection (stored with the basis: the writer's numpy decides it once)
FORMAT = 1

Matrix = npt.NDArray[np.float32]
Hit = tuple[int, float, float]  # (episode id, cosine, date)


class Meta(msgspec.Struct):
    format: int
    model: str
    dim: int
    count: int = 0  # records committed
    basis: bool = False  # basis.npy holds the sketch's basis, and every committed record has its bits
    forgotten: int = 0  # (episode, record) pairs committed in forgotten.i64


def store_dir(vectors_root: Path, model: str) -> Path:
    """A directory name for `model` (its name may hold ':' or '/')."""
    return vectors_root / re.sub(r"[^A-Za-z0-9._-]+", "_", model)


def _meta_path(path: Path) -> Path:
    return path / "meta.json"


def read_meta(path: Path) -> Meta | None:
    with contextlib.suppress(OSError, msgspec.DecodeError, msgspec.ValidationError):
        return msgspec.json.decode(_meta_path(path).read_bytes(), type=Meta)
    return None


def sketch(vectors: Matrix, center: Matrix, projection: Matrix) -> npt.NDArray[np.uint64]:
    """Each row's bits: the signs of (vector - center) @ projection, as WORDS uint64."""
    signs = ((np.asarray(vectors, dtype=np.float32) - center) @ projection) > 0
    return np.packbits(signs, axis=1).view(np.uint64).reshape(len(signs), WORDS)


def make_basis(sample: Matrix) -> tuple[Matrix, Matrix]:
    center = np.asarray(sample, dtype=np.float32).mean(axis=0).astype(np.float32)
    projection = np.random.default_rng(SEED).standard_normal((sample.shape[1], BITS)).astype(np.float32)
    return center, projection


class _Columns:
    """The record files of one store, mapped read-only for `count` records."""

    def __init__(self, path: Path, meta: Meta) -> None:
        n = self.n = meta.count
        self.vectors = _map(path / "vectors.f16", np.float16, (n, meta.dim))
        self.ids = _map(path / "ids.i64", np.int64, (n,))
        self.at = _map(path / "at.f64", np.float64, (n,))
        blocks = -(-n // BLOCK)
        self.bits = _map(path / "bits.u64", np.uint64, (blocks, WORDS, BLOCK)) if meta.basis and n else None
        self.forgotten = _read_forgotten(path, meta)
        rows = self.forgotten[:, 1]
        self.skip = np.sort(rows[(rows >= 0) & (rows < n)])  # the records no reader returns
        self.single: Matrix | None = None  # every vector in single precision, once made (VectorReader.warm)


def _read_forgotten(path: Path, meta: Meta) -> npt.NDArray[np.int64]:
    """The committed (episode, record) pairs of forgotten turns."""
    if not meta.forgotten:
        return np.zeros((0, 2), dtype=np.int64)
    return np.fromfile(path / "forgotten.i64", dtype=np.int64, count=2 * meta.forgotten).reshape(-1, 2)


def _map(path: Path, dtype: Any, shape: tuple[int, ...]) -> Any:
    if 0 in shape:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)


def _load_basis(path: Path) -> tuple[Matrix, Matrix]:
    basis = np.load(path / "basis.npy")
    return basis[0].astype(np.float32), np.ascontiguousarray(basis[1:].T, dtype=np.float32)


class SortedIds:
    """The ids of an append-only column and the record each is at: sorted, plus the latest few in a dict
    (merged in when they pass MERGE_AT, so a commit of a few records costs no sort of a million)."""

    MERGE_AT = 4_096

    def __init__(self) -> None:
        self.ids: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self.rows: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self.recent: dict[int, int] = {}
        self.through = 0  # records taken in

    def update(self, column: Any, n: int) -> None:
        if n <= self.through:
            return
        ids = np.asarray(column[self.through:n], dtype=np.int64)
        rows = np.arange(self.through, n, dtype=np.int64)
        self.through = n
        if len(ids) + len(self.recent) <= self.MERGE_AT:
            self.recent.update(zip(ids.tolist(), rows.tolist(), strict=True))
            return
        if self.recent:
            ids = np.concatenate([ids, np.fromiter(self.recent.keys(), dtype=np.int64, count=len(self.recent))])
            rows = np.concatenate([rows, np.fromiter(self.recent.values(), dtype=np.int64, count=len(self.recent))])
            self.recent = {}
        ids, rows = np.concatenate([self.ids, ids]), np.concatenate([self.rows, rows])
        order = np.argsort(ids, kind="stable")
        self.ids, self.rows = ids[order], rows[order]

    def rows_of(self, ids: Sequence[int]) -> npt.NDArray[np.int64]:
        """The record of each of `ids`, or -1 for one that has none."""
        wanted = np.asarray(ids, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.ids, wanted), max(len(self.ids) - 1, 0))
        out = np.full(len(wanted), -1, dtype=np.int64)
        if len(self.ids):
            found = self.ids[at] == wanted
            out[found] = self.rows[at[found]]
        if self.recent:
            for i, item in enumerate(wanted.tolist()):
                if (row := self.recent.get(item)) is not None:
                    out[i] = row
        return out

    def has(self, ids: Sequence[int]) -> npt.NDArray[np.bool_]:
        return self.rows_of(ids) >= 0


class VectorReader:
    """Searches one store; sees each commit at its next call. One thread uses it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._cols: _Columns | None = None
        self._basis: tuple[Matrix, Matrix] | None = None
        self._sorted = SortedIds()

    def refresh(self) -> None:
        try:
            st = os.stat(_meta_path(self.path))
        except FileNotFoundError:
            self._stamp, self._cols = None, None
            return
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp == self._stamp:
            return
        meta = read_meta(self.path)
        if meta is None:
            return
        if meta.basis and self._basis is None:
            self._basis = _load_basis(self.path)  # fixed once made
        self._cols, self._stamp = _Columns(self.path, meta), stamp

    def __len__(self) -> int:
        self.refresh()
        return 0 if self._cols is None else self._cols.n

    def has(self, ids: Sequence[int]) -> npt.NDArray[np.bool_]:
        """Which of `ids` have a vector."""
        return self._rows_of(ids) >= 0

    def warm(self, rescore: int = RESCORE) -> None:
        """Before the query's vector is known (while it is embedded): when a search will score every
        record (at most `rescore` of them), their vectors made single precision now, once for this
        commit (at most 6 MB), so that the search after the embedding only multiplies. Reading half
        precision is most of a scan's time (3.4 ms for 4,000 vectors, the multiplication 1.1)."""
        self.refresh()
        cols = self._cols
        if cols is not None and 0 < cols.n <= rescore and cols.single is None:
            cols.single = np.asarray(cols.vectors, dtype=np.float32)

    @staticmethod
    def _single(cols: _Columns, rows: npt.NDArray[np.intp] | list[int]) -> Matrix:
        """The vectors of records `rows` in single precision: the same numbers either way (half
        precision converts exactly), from those `warm` made if it did."""
        if cols.single is not None:
            return cols.single[rows]
        return np.asarray(cols.vectors[rows], dtype=np.float32)

    def _rows_of(self, ids: Sequence[int]) -> npt.NDArray[np.int64]:
        self.refresh()
        if self._cols is not None:
            self._sorted.update(self._cols.ids, self._cols.n)
        return self._sorted.rows_of(ids)

    def matrix(self, ids: Sequence[int]) -> Matrix:
        """The vectors of `ids` (each must have one), as float32 rows in that order."""
        rows = self._rows_of(ids)
        assert self._cols is not None and bool((rows >= 0).all())
        return np.asarray(self._cols.vectors[rows], dtype=np.float32)

    def similarities(self, query: Matrix, ids: Sequence[int]) -> dict[int, float]:
        """The cosine of each of `ids` that has a vector (an id missing from the answer has none yet:
        ranking must not hold that against it; a forgotten turn has none either)."""
        if not len(ids):
            return {}
        rows = self._rows_of(ids)
        if self._cols is None:
            return {}
        forgotten = set(self._cols.skip.tolist())
        kept = [(int(item), int(row)) for item, row in zip(ids, rows.tolist(), strict=True)
                if row >= 0 and row not in forgotten]
        if not kept:
            return {}
        scores = self._single(self._cols, [row for _, row in kept]) @ np.asarray(query, dtype=np.float32).reshape(-1)
        return {item: float(score) for (item, _), score in zip(kept, scores, strict=True)}

    def search(self, query: Matrix, limit: int, within: tuple[float, float] | None = None,
               rescore: int = RESCORE) -> list[Hit]:
        """The `limit` nearest (cosine), nearest first; `within` (from, to): of those dated in that period."""
        self.refresh()
        cols = self._cols
        if cols is None or cols.n == 0 or limit <= 0:
            return []
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        rows = self.candidates(q, rescore, within)
        if len(cols.skip):  # forgotten turns: never returned
            rows = rows[~np.isin(rows, cols.skip)]
        if not len(rows):
            return []
        scores = self._single(cols, rows) @ q
        top = min(limit, len(rows))
        best = np.argpartition(-scores, top - 1)[:top]
        best = best[np.argsort(-scores[best], kind="stable")]
        return [(int(cols.ids[rows[i]]), float(scores[i]), float(cols.at[rows[i]])) for i in best]

    def candidates(self, query: Matrix, rescore: int, within: tuple[float, float] | None = None
                   ) -> npt.NDArray[np.intp]:
        """The records to score exactly: all of them (of the period `within`, if given), or the `rescore`
        nearest of those by the sketch (sorted, so the vectors are read in file order). A period is found
        by its dates (8 bytes a record), so a short one is scored exactly without the sketch."""
        cols = self._cols
        assert cols is not None
        rows: npt.NDArray[np.intp] | None = None
        if within is not None:
            at = np.asarray(cols.at)
            rows = np.flatnonzero((at >= within[0]) & (at <= within[1]))
            if len(rows) <= rescore:
                return rows
        elif cols.n <= rescore:
            return np.arange(cols.n)
        if cols.bits is None or self._basis is None:
            return np.arange(cols.n) if rows is None else rows
        distance = hamming(cols.bits, sketch(query.reshape(1, -1), *self._basis)[0], cols.n)
        distance[cols.skip] = BITS  # a forgotten record takes no candidate's place
        if rows is None:
            return nearest(distance, rescore)
        return rows[nearest(distance[rows], rescore)]


def hamming(blocks: npt.NDArray[np.uint64], q: npt.NDArray[np.uint64], n: int) -> npt.NDArray[np.uint16]:
    """The Hamming distance of `q` to each of the first `n` sketches, a block (stored word by word) at a
    time, so each step streams one contiguous column: about 15 ms a million on one core."""
    out = np.empty(n, dtype=np.uint16)
    tmp = np.empty(BLOCK, dtype=np.uint64)
    count = np.empty(BLOCK, dtype=np.uint8)
    for b in range(len(blocks)):
        start = b * BLOCK
        m = min(BLOCK, n - start)
        acc = out[start:start + m]
        acc[:] = 0
        for w in range(WORDS):
            np.bitwise_xor(blocks[b, w, :m], q[w], out=tmp[:m])
            np.bitwise_count(tmp[:m], out=count[:m])
            acc += count[:m]
    return out


def nearest(distance: npt.NDArray[np.uint16], k: int) -> npt.NDArray[np.intp]:
    """The positions of the `k` smallest distances, in position order (ties at the cut: the first ones)."""
    if len(distance) <= k:
        return np.arange(len(distance))
    counts = np.cumsum(np.bincount(distance, minlength=BITS + 1))
    cut = int(np.searchsorted(counts, k))  # distances below `cut` number fewer than k
    below = np.flatnonzero(distance < cut)
    at_cut = np.flatnonzero(distance == cut)[: k - len(below)]
    return np.sort(np.concatenate([below, at_cut]))


class VectorWriter:
    """Appends to one store: the workspace's writer alone (the server's embedder, `memory rebuild`)."""

    def __init__(self, path: Path, model: str, dim: int = DIM) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        # What a kill between a temp file and its rename left: the store's one writer sweeps it.
        sweep_temp_files(path, lambda name: name in ("meta.json", "basis.npy"))
        meta = read_meta(path)
        if meta is None or meta.format != FORMAT or meta.dim != dim:
            meta = Meta(FORMAT, model, dim)
        self.meta = meta
        self._truncate()
        self._sorted = SortedIds()
        columns = _Columns(path, meta)
        self._sorted.update(columns.ids, meta.count)
        self._forgotten = np.unique(columns.forgotten[:, 0])  # episodes never added again
        self._basis = _load_basis(path) if meta.basis else None

    def __len__(self) -> int:
        return self.meta.count

    def has(self, ids: Sequence[int]) -> npt.NDArray[np.bool_]:
        """Which of `ids` are done with: stored, or forgotten (a forgotten turn gets no vector again)."""
        return self._sorted.has(ids) | self.has_forgotten(ids)

    def _truncate(self) -> None:
        """Cut what a crash left past the committed records."""
        n, dim = self.meta.count, self.meta.dim
        for name, size in (("vectors.f16", 2 * dim), ("ids.i64", 8), ("at.f64", 8)):
            with open(self.path / name, "ab") as f:
                f.truncate(n * size)
        with open(self.path / "bits.u64", "ab") as f:
            f.truncate(-(-n // BLOCK) * WORDS * BLOCK * 8 if self.meta.basis else 0)
        with open(self.path / "forgotten.i64", "ab") as f:
            f.truncate(self.meta.forgotten * 16)

    def add(self, ids: Sequence[int], at: Sequence[float], vectors: Matrix) -> int:
        """Append the vectors of episodes not stored yet, and commit. Returns how many were new."""
        stored = self.has(ids)
        keep, seen = [], set()
        for i, item in enumerate(ids):
            if not stored[i] and int(item) not in seen:
                seen.add(int(item))
                keep.append(i)
        if not keep:
            return 0
        matrix = np.asarray(vectors, dtype=np.float32).reshape(len(ids), -1)[keep].astype(np.float16)
        start = self.meta.count
        self._append("vectors.f16", matrix.tobytes())
        self._append("ids.i64", np.asarray([int(ids[i]) for i in keep], dtype=np.int64).tobytes())
        self._append("at.f64", np.asarray([float(at[i]) for i in keep], dtype=np.float64).tobytes())
        if self._basis is not None:
            self._put_bits(start, sketch(matrix.astype(np.float32), *self._basis))  # of the stored values
        count = start + len(keep)
        if self._basis is None and count >= BASIS_FROM:
            self._set_basis(count)
        self._commit(count)
        return len(keep)

    def forget(self, ids: Sequence[int]) -> int:
        """Turns a person forgot: their records' vector and sketch become zeros, in place and synced, then
        the episodes are recorded (with their records) and committed, so no reader returns them and
        no `add` stores them again (a turn forgotten before it was embedded included). Returns how
        many records were zeroed."""
        wanted = np.unique(np.asarray(list(ids), dtype=np.int64))
        new = wanted[~np.isin(wanted, self._forgotten)]
        if not len(new):
            return 0
        n = self.meta.count
        column = _map(self.path / "ids.i64", np.int64, (n,))
        rows = np.flatnonzero(np.isin(column, new))
        if len(rows):  # zeros first: a crash before the commit leaves nothing of them, only unlisted zeros
            vectors = np.memmap(self.path / "vectors.f16", dtype=np.float16, mode="r+", shape=(n, self.meta.dim))
            vectors[rows] = 0
            vectors.flush()  # msync
            del vectors
            if self.meta.basis:
                self._put_bits_at(rows, np.zeros((len(rows), WORDS), dtype=np.uint64))
        record = dict.fromkeys(new.tolist(), -1)
        record.update({int(column[r]): int(r) for r in rows})
        self._append("forgotten.i64", np.asarray(sorted(record.items()), dtype=np.int64).tobytes())
        self.meta.forgotten += len(record)
        self._forgotten = np.union1d(self._forgotten, new)
        self._commit(n)
        return len(rows)

    def renew(self, ids: Sequence[int], vectors: Matrix) -> int:
        """Episodes' vectors made again (a turn whose previous turn was forgotten: its vector held the
        person's words of that turn): each stored record's vector and sketch overwritten in place and
        synced, then committed so that readers map the store anew. An episode with no record here (or
        forgotten) is left out: the backlog embeds it from its text as it is now. Returns how many."""
        matrix = np.asarray(vectors, dtype=np.float32).reshape(len(ids), -1).astype(np.float16)
        rows = self._sorted.rows_of(ids)
        keep = np.flatnonzero((rows >= 0) & ~self.has_forgotten(ids))
        if not len(keep):
            return 0
        n, at = self.meta.count, rows[keep]
        stored = np.memmap(self.path / "vectors.f16", dtype=np.float16, mode="r+", shape=(n, self.meta.dim))
        stored[at] = matrix[keep]
        stored.flush()  # msync
        del stored
        if self._basis is not None:
            self._put_bits_at(at, sketch(matrix[keep].astype(np.float32), *self._basis))
        self._commit(n)
        return len(keep)

    def has_forgotten(self, ids: Sequence[int]) -> npt.NDArray[np.bool_]:
        return np.isin(np.asarray(ids, dtype=np.int64), self._forgotten)

    def _append(self, name: str, data: bytes) -> None:
        with open(self.path / name, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def _put_bits(self, start: int, bits: npt.NDArray[np.uint64]) -> None:
        self._put_bits_at(np.arange(start, start + len(bits)), bits)

    def _put_bits_at(self, rows: npt.NDArray[np.intp], bits: npt.NDArray[np.uint64]) -> None:
        blocks = -(-(int(rows.max()) + 1) // BLOCK)
        path = self.path / "bits.u64"
        with open(path, "r+b") as f:
            if os.fstat(f.fileno()).st_size < blocks * WORDS * BLOCK * 8:
                f.truncate(blocks * WORDS * BLOCK * 8)
        mm = np.memmap(path, dtype=np.uint64, mode="r+", shape=(blocks, WORDS, BLOCK))
        mm[rows // BLOCK, :, rows % BLOCK] = bits
        mm.flush()  # msync: on disk before the commit that counts these records
        del mm

    def _set_basis(self, count: int) -> None:
        """Centre the sketch on the first vectors, and sketch every record so far."""
        vectors = np.memmap(self.path / "vectors.f16", dtype=np.float16, mode="r", shape=(count, self.meta.dim))
        center, projection = make_basis(np.asarray(vectors[:BASIS_FROM], dtype=np.float32))
        data = io.BytesIO()
        np.save(data, np.vstack([center[None, :], projection.T]))
        atomic_write(self.path / "basis.npy", data.getvalue())
        self._basis = center, projection
        for start in range(0, count, BLOCK):
            chunk = np.asarray(vectors[start:start + BLOCK], dtype=np.float32)
            self._put_bits(start, sketch(chunk, center, projection))
        if len(self._forgotten):  # a forgotten record's sketch stays zeros
            gone = np.flatnonzero(np.isin(_map(self.path / "ids.i64", np.int64, (count,)), self._forgotten))
            if len(gone):
                self._put_bits_at(gone, np.zeros((len(gone), WORDS), dtype=np.uint64))
        self.meta.basis = True

    def _commit(self, count: int) -> None:
        self.meta.count = count
        atomic_write(_meta_path(self.path), msgspec.json.encode(self.meta))
        self._sorted.update(_map(self.path / "ids.i64", np.int64, (count,)), count)

    def close(self) -> None:
        pass


def forget_everywhere(root: Path, ids: Sequence[int], writer: VectorWriter | None = None,
                      also_elsewhere: Sequence[int] = ()) -> int:
    """Forget `ids` in every store under `root` (another model's too: its vectors came from the same
    turns), through `writer` for its own; in the stores but `writer`'s, `also_elsewhere` too (the turns
    after them, whose vectors held their words and which only `writer`'s model makes again). The caller
    is the stores' one writer. Returns the records zeroed."""
    zeroed = writer.forget(ids) if writer is not None else 0
    for meta_file in sorted(root.glob("*/meta.json")):
        path = meta_file.parent
        if writer is not None and path == writer.path:
            continue
        meta = read_meta(path)
        if meta is not None and meta.format == FORMAT:
            zeroed += VectorWriter(path, meta.model, meta.dim).forget([*ids, *also_elsewhere])
    return zeroed
