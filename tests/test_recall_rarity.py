"""Rare words are counted against the index as it is now (rarity.py): its document frequencies are kept
between searches only while the index has not changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from sprite_os.memory.recall.index import RecallIndex, doc_id, learning_doc, swap_in
from sprite_os.memory.recall.rarity import Rarity

AT = 1_700_000_000.0


def test_a_forget_then_a_capture_of_as_many_documents_counts_the_words_again(tmp_path: Path) -> None:
    """The live document count is the same before and after (two out, two in); "quokka" was in none and
    is now in two, no longer rare among 40 (at most one is). Counts kept on the live count stay stale,
    in the writer's own process and in a reader's."""
    writer = RecallIndex(tmp_path / "index", writable=True)
    writer.put(learning_doc(i, AT, f"filler words here {i}") for i in range(40))
    writer.commit()
    reader = RecallIndex(tmp_path / "index")
    own, other = Rarity(writer), Rarity(reader)
    assert own.counts(["quokka"]) == other.counts(["quokka"]) == [1]
    before = writer.documents
    writer.put([learning_doc(100, AT, "quokka seen"), learning_doc(101, AT, "a quokka again")],
               replace=[doc_id("learning", 0), doc_id("learning", 1)])
    writer.commit()
    assert writer.documents == before
    assert own.counts(["quokka"]) == [0]
    assert other.counts(["quokka"]) == [0]
    assert other.held(["quokka"])
    writer.close()


def test_a_memory_counted_before_is_counted_again_once_the_index_changes(tmp_path: Path) -> None:
    """A text's count is kept for the next search (a memory found again is not analysed again), but only
    while the index is the same: after a capture, a forget and a rebuild, each of which makes "quokka"
    rare or common, the same text counts as a fresh Rarity counts it then."""
    writer = RecallIndex(tmp_path / "index", writable=True)
    writer.put([*(learning_doc(i, AT, f"filler words here {i}") for i in range(290)),
                learning_doc(1000, AT, "quokka seen"), learning_doc(1001, AT, "a quokka again")])
    writer.commit()
    reader = RecallIndex(tmp_path / "index")
    kept = Rarity(reader)
    text = "filler quokka"
    assert kept.counts([text]) == [0]  # two of 292 documents: above 292 / e^5 (1.97), not rare
    # a capture: ten more, and two of 302 is at most 2.04: rare
    writer.put(learning_doc(i, AT, f"filler words here {i}") for i in range(290, 300))
    writer.commit()
    assert kept.counts([text]) == Rarity(reader).counts([text]) == [1]
    # a forget: forty out, two of 262 live documents (at most 1.77): no longer rare
    writer.put([], replace=[doc_id("learning", i) for i in range(40)])
    writer.commit()
    assert kept.counts([text]) == Rarity(reader).counts([text]) == [0]
    writer.close()
    # a rebuild: a new index without the quokkas swapped in where the old one was: rare again
    fresh = RecallIndex(tmp_path / "index.new", writable=True)
    fresh.put(learning_doc(i, AT, f"filler words here {i}") for i in range(300))
    fresh.commit()
    fresh.close()
    swap_in(tmp_path / "index.new", tmp_path / "index")
    assert kept.counts([text]) == Rarity(RecallIndex(tmp_path / "index")).counts([text]) == [1]


def test_the_counts_kept_hold_at_most_so_much_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What is kept between searches is bounded by the text it holds, not by a number of memories (a
    turn can be thousands of characters); past the bound it starts again, and counts stay right."""
    from sprite_os.memory.recall import rarity

    writer = RecallIndex(tmp_path / "index", writable=True)
    writer.put(learning_doc(i, AT, f"filler words here {i}") for i in range(300))
    writer.commit()
    monkeypatch.setattr(rarity, "COUNTED_BYTES", 3000)
    kept = Rarity(writer)
    # Bytes, not characters: a text outside Latin-1 takes 2 or 4 bytes a character (and each entry its slot).
    for texts in ([f"filler quokka number {i} " * 5 for i in range(20)],
                  [f"filler quokka number {i} 😀 " * 5 for i in range(20)]):
        for _ in range(2):
            assert kept.counts(texts) == Rarity(writer).counts(texts)
            assert 0 < kept.kept_bytes <= 3000
    writer.close()
